//! Both all_reduce routes give the same bits; timeouts poison; close is final.
use collective_core::conformance::data::finite_values;
use collective_core::{Collective, Error, Io, Op, Route};
use half::bf16;
use shm_ipc::{ShmCollective, ShmConfig};
use std::time::Duration;

fn run_group(world: usize, threshold: usize, inputs: &[Vec<bf16>]) -> Vec<Vec<bf16>> {
    let mut config = ShmConfig::new(1 << 20);
    config.routes = collective_core::RouteTable::ipc_default(threshold);
    let comms = ShmCollective::group(world, config).unwrap();
    let bytes = inputs[0].len() * 2;
    let expect = if threshold == 0 { Route::IpcReduceScatterAllGather } else { Route::IpcOneShot };
    assert_eq!(comms[0].route(Op::AllReduce, bytes), expect);
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .zip(inputs)
            .map(|(c, input)| {
                s.spawn(move || {
                    let mut out = vec![bf16::ZERO; input.len()];
                    c.all_reduce(Io::host(input, &mut out), &()).unwrap();
                    out
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

#[test]
fn one_shot_and_rs_ag_give_identical_bits() {
    for world in [2, 4, 8] {
        for n in [1usize, 13, 4096, 100_003] {
            let inputs: Vec<Vec<bf16>> = (0..world)
                .map(|r| {
                    finite_values(collective_core::DType::BF16, n, r as u64 + 7)
                        .chunks(2)
                        .map(|b| bf16::from_le_bytes([b[0], b[1]]))
                        .collect()
                })
                .collect();
            let one_shot = run_group(world, usize::MAX, &inputs);
            let rs_ag = run_group(world, 0, &inputs);
            for r in 0..world {
                let a: Vec<u16> = one_shot[r].iter().map(|x| x.to_bits()).collect();
                let b: Vec<u16> = rs_ag[r].iter().map(|x| x.to_bits()).collect();
                assert_eq!(a, b, "world {world} n {n} rank {r}");
                let first: Vec<u16> = one_shot[0].iter().map(|x| x.to_bits()).collect();
                assert_eq!(a, first, "ranks differ");
            }
        }
    }
}

#[test]
fn a_rank_that_never_arrives_times_out_and_poisons() {
    let mut config = ShmConfig::new(1 << 12);
    config.timeouts =
        Some(collective_core::Timeouts { peer: Duration::from_millis(300), close: Duration::from_millis(300) });
    let comms = ShmCollective::group(2, config).unwrap();
    let input = vec![1.0f32; 16];
    let mut out = vec![0.0f32; 16];
    let t = std::time::Instant::now();
    let err = comms[0].all_reduce(Io::host(&input, &mut out), &()).unwrap_err();
    assert!(matches!(err, Error::PeerTimeout { peer: 1, .. }), "{err}");
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(out.iter().all(|&x| x.to_bits() == 0), "output written by a failed call");
    let again = comms[0].all_reduce(Io::host(&input, &mut out), &()).unwrap_err();
    assert!(matches!(again, Error::Poisoned { .. }), "{again}");
}

#[test]
fn calls_after_close_fail() {
    let comms = ShmCollective::group(2, ShmConfig::new(1 << 12)).unwrap();
    std::thread::scope(|s| {
        for c in &comms {
            s.spawn(move || c.close().unwrap());
        }
    });
    let input = vec![1.0f32; 4];
    let mut out = vec![0.0f32; 4];
    assert!(matches!(comms[1].all_reduce(Io::host(&input, &mut out), &()), Err(Error::Closed)));
    assert!(matches!(comms[0].reduce_scatter_many(&[], &()), Err(Error::Closed)));
}

#[test]
fn world_one_is_a_copy_with_no_ipc_state() {
    let comms = ShmCollective::group(1, ShmConfig::new(1 << 12)).unwrap();
    assert_eq!(comms[0].workspace_bytes(), 0);
    assert_eq!(comms[0].route(Op::AllReduce, 64), Route::Local);
    let input = [1.5f32, -0.0, f32::NAN];
    let mut out = [0.0f32; 3];
    comms[0].all_reduce(Io::host(&input, &mut out), &()).unwrap();
    assert_eq!(input.map(f32::to_bits), out.map(f32::to_bits));
}
