//! `reduce_scatter_many` with the same total but different lane splits on different ranks
//! (`[4w, 8w]` on even ranks, `[8w, 4w]` on odd ones) must fail with `SignatureMismatch` on
//! every rank, write nothing, and poison — on the CPU twin, ranks as threads. (Before the split
//! was part of the signature these calls returned `Ok` with the lanes' trees mixed.) The GPU
//! twins run the same judgement in their `tests/gpu.rs`.
use collective_core::Timeouts;
use collective_core::conformance::faults::{expect_split_mismatch, split_lanes};
use collective_core::{Collective, Io};
use shm_ipc::{ShmCollective, ShmConfig};
use std::time::{Duration, Instant};

const SENTINEL: f32 = -1234.5;

fn run(world: usize) {
    let bound = Duration::from_secs(5);
    let config = ShmConfig::new(1 << 16).with_timeouts(Timeouts { peer: bound, close: bound });
    let comms = ShmCollective::group(world, config).expect("group");
    std::thread::scope(|s| {
        let handles: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let me = comm.rank();
                    let counts = split_lanes(me, world);
                    let inputs: Vec<Vec<f32>> =
                        counts.iter().map(|&n| (0..n).map(|i| (i + me) as f32 * 0.25).collect()).collect();
                    let mut outputs: Vec<Vec<f32>> = counts.iter().map(|&n| vec![SENTINEL; n / world]).collect();
                    let t = Instant::now();
                    let outcome = {
                        let mut outs = outputs.iter_mut();
                        let (o0, o1) = (outs.next().unwrap(), outs.next().unwrap());
                        let lanes = [Io::host(&inputs[0], o0), Io::host(&inputs[1], o1)];
                        comm.reduce_scatter_many(&lanes, &())
                    };
                    let waited = t.elapsed();
                    let untouched = outputs.iter().flatten().all(|x| x.to_bits() == SENTINEL.to_bits());
                    let again = || {
                        let mut o = vec![0f32; counts[0] / world];
                        let lanes = [Io::host(&inputs[0], &mut o)];
                        comm.reduce_scatter_many(&lanes, &())
                    };
                    expect_split_mismatch(me, waited, bound, outcome, untouched, again)
                        .map_err(|e| format!("rank {me}: {e}"))
                })
            })
            .collect();
        let errors: Vec<String> = handles.into_iter().filter_map(|h| h.join().expect("rank panicked").err()).collect();
        assert!(errors.is_empty(), "world {world}:\n{}", errors.join("\n"));
    });
}

#[test]
fn mismatched_lane_splits_are_signature_mismatch_world2() {
    run(2);
}

#[test]
fn mismatched_lane_splits_are_signature_mismatch_world4() {
    run(4);
}

#[test]
fn mismatched_lane_splits_are_signature_mismatch_world8() {
    run(8);
}
