//! A composite of the user's that runs its calls as parts through the front door
//! (`Collective::call_as_part`, `reduce_scatter_many_as_part` on a `CpuCollective`): parts of
//! different calls with the same sizes fail with `SignatureMismatch` on every rank, never an
//! `Ok` with one another's data; the same part on every rank is the exact result; part 0 is
//! the plain call. (The front door used the trait's defaults, which dropped `part`.)
#![cfg(feature = "cpu")]

use collective_factory::{Collective, Config, CpuCollective, Error, Io, Op, RawMut, RawRef, cpu};
use std::time::Duration;

const BOUND: Duration = Duration::from_secs(20);

fn group() -> Vec<CpuCollective> {
    cpu::thread_group(2, &Config::new().with_timeout(BOUND)).expect("thread group")
}

/// Every rank's all_reduce of 64 elements as part `part(rank)` (0: the plain call when
/// `plain`); returns each rank's result and output.
fn all_reduce_parts(comms: &[CpuCollective], part: impl Fn(usize) -> u32 + Sync) -> Vec<(Result<(), Error>, Vec<f32>)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|comm| {
                let part = &part;
                s.spawn(move || {
                    let me = comm.rank();
                    let x: Vec<f32> = (0..64).map(|i| (me * 100 + i) as f32).collect();
                    let mut y = vec![0f32; 64];
                    let r = match part(me) {
                        0 if me == 0 => comm.all_reduce(Io::host(&x, &mut y), &()),
                        p => comm.call_as_part(Op::AllReduce, Io::host(&x, &mut y), p, &()),
                    };
                    (r, y)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    })
}

#[test]
fn parts_of_different_calls_fail_on_every_rank() {
    let comms = group();
    for (rank, (r, _)) in all_reduce_parts(&comms, |me| 0x1000 + me as u32).into_iter().enumerate() {
        assert!(matches!(r, Err(Error::SignatureMismatch { .. })), "rank {rank}: {r:?}");
    }
}

#[test]
fn the_same_part_on_every_rank_and_part_0_are_exact() {
    let want: Vec<u32> = (0..64).map(|i| ((i + (100 + i)) as f32).to_bits()).collect();
    for part in [0u32, 7] {
        let comms = group();
        for (rank, (r, y)) in all_reduce_parts(&comms, |_| part).into_iter().enumerate() {
            r.unwrap_or_else(|e| panic!("rank {rank}, part {part}: {e}"));
            assert_eq!(y.iter().map(|v| v.to_bits()).collect::<Vec<_>>(), want, "rank {rank}, part {part}");
        }
    }
}

#[test]
fn reduce_scatter_many_parts_of_different_calls_fail_on_every_rank() {
    let comms = group();
    std::thread::scope(|s| {
        for comm in &comms {
            s.spawn(move || {
                let me = comm.rank();
                let x = vec![1.0f32; 2 * 16];
                let mut y = vec![0f32; 16];
                let lanes = [Io::OutOfPlace { input: RawRef::host(&x), output: RawMut::host(&mut y) }];
                let r = comm.reduce_scatter_many_as_part(&lanes, 0x2000 + me as u32, &());
                assert!(matches!(r, Err(Error::SignatureMismatch { .. })), "rank {me}: {r:?}");
            });
        }
    });
}
