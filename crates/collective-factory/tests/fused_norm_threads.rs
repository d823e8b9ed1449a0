//! Several threads making fused all_reduce + residual + RMSNorm calls on one handle, as an
//! engine whose scheduler and warm-up threads share a communicator does: a fused call is as
//! atomic per handle as an all_reduce (issue 25) — every chunk of a call above the staging, and
//! its norm, belong to that call — so every `h` is one call's sum and every `y` that `h`'s norm.
//!
//! Rank 0 is driven by two threads (inputs 1 and 2, 20 calls each), rank 1 by one (40 calls,
//! inputs 10 and 20 alternating); 16 rows of 256 f32 (the norm in the last chunk's launch) and
//! 80 (the norm a launch of its own) on a 4 KiB staging run in chunks, on every IPC route
//! forced and the default table. Each thread's residual is its own
//! constant, so `h - residual` must be a constant `x0 + x1` with `x0` the calling thread's
//! input, each `y` row `fixed_tree::rmsnorm_row` of its `h` row bit for bit, and rank 1 must
//! have met each of rank 0's threads exactly 20 times. Proven by a deliberate fault: with the
//! front door's and the engine's call locks taken per chunk instead of per call, it fails.
#![cfg(feature = "cpu")]
mod norm_data;

use collective_factory::{Collective, Config, CpuCollective, Io, RawRef, RmsNorm, cpu};
use norm_data::{every_size_by, one_call_of_constants};

const HIDDEN: usize = 256;

/// One fused call of the constant input `x` with the constant residual `residual`; checks that
/// `y` is the norm of `h` row by row and returns the constant `h - residual` (panics if `h` is
/// not constant: chunks of different calls mixed).
fn fused(comm: &CpuCollective, rows: usize, x: f32, residual: f32, what: &str) -> f32 {
    let n = rows * HIDDEN;
    let xs = vec![x; n];
    let mut y = vec![0f32; n];
    let mut h = vec![residual; n];
    let weight: Vec<f32> = (0..HIDDEN).map(|j| 0.5 + j as f32 / 256.0).collect();
    let norm =
        RmsNorm { residual: Io::host_in_place(&mut h), weight: RawRef::host(&weight), hidden: HIDDEN, eps: 1e-6 };
    comm.all_reduce_residual_rmsnorm(Io::host(&xs, &mut y), norm, &()).unwrap_or_else(|e| panic!("{what}: {e}"));
    one_call_of_constants(&h, &y, &weight, 1e-6, what) - residual
}

fn drive(ranks: &[CpuCollective], rows: usize, route: &str) {
    std::thread::scope(|s| {
        let mut zero = Vec::new();
        for t in 0..2usize {
            let c = &ranks[0];
            zero.push(s.spawn(move || {
                let x0 = 1.0 + t as f32;
                for k in 0..20 {
                    let sum =
                        fused(c, rows, x0, 100.0 * (t + 1) as f32, &format!("{route}: rank 0 thread {t} call {k}"));
                    let x1 = sum - x0;
                    assert!(x1 == 10.0 || x1 == 20.0, "{route}: thread {t} call {k}: {sum} is no x0 + x1");
                }
            }));
        }
        let c = &ranks[1];
        let one = s.spawn(move || {
            let mut met = [0usize; 2];
            for k in 0..40 {
                let x1 = 10.0 * (1 + k % 2) as f32;
                let sum = fused(c, rows, x1, 1000.0, &format!("{route}: rank 1 call {k}"));
                let x0 = sum - x1;
                assert!(x0 == 1.0 || x0 == 2.0, "{route}: rank 1 call {k}: {sum} is no x0 + x1");
                met[x0 as usize - 1] += 1;
            }
            assert_eq!(met, [20, 20], "{route}: rank 1 met rank 0's threads unevenly");
        });
        for h in zero {
            h.join().expect("rank 0 thread");
        }
        one.join().expect("rank 1 thread");
    });
}

#[test]
fn chunked_fused_calls_from_two_threads_on_one_handle_are_atomic() {
    for route in ["default", "ipc_push_ll", "ipc_one_shot", "ipc_push", "ipc_rs_ag"] {
        let config = Config::new().with_capacity(4096);
        let config = if route == "default" { config } else { config.with_routing(every_size_by("cpu", route)) };
        let ranks = cpu::thread_group(2, &config).expect("thread group");
        for rows in [16, 80] {
            drive(&ranks, rows, route);
        }
        std::thread::scope(|s| {
            for c in &ranks {
                s.spawn(move || c.close().expect("close"));
            }
        });
        println!("{route}: 160 fused calls from three threads, each one call's h and its norm");
    }
}
