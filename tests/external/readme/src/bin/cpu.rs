use collective_factory::{Collective, Config, Io, cpu, half::bf16};

fn main() -> Result<(), collective_factory::Error> {
    let ranks = cpu::thread_group(4, &Config::new().with_capacity(1 << 20))?;
    std::thread::scope(|s| {
        for comm in &ranks {
            s.spawn(move || {
                let x = |rank: usize| bf16::from_f32(rank as f32 + 0.1);
                let input = vec![x(comm.rank()); 1024];
                let mut out = vec![bf16::ZERO; 1024];
                comm.all_reduce(Io::host(&input, &mut out), &()).unwrap();
                comm.synchronize(&()).unwrap(); // on the host a call is done when it returns
                assert_eq!(out[0].to_bits(), ((x(0) + x(1)) + (x(2) + x(3))).to_bits()); // in bf16
            });
        }
    });
    Ok(())
}
