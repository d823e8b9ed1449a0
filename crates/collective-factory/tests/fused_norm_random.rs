//! Randomised fused calls on the CPU twin, as an engine makes them over a run: every IPC route
//! forced and the default table, worlds 2, 3, 4 and 5, a staging small enough that most calls
//! run in chunks or one that holds a batch of 512 rows (the gathered form), batches from 0 to 600 rows of odd and even widths (1 to 4096), every dtype, every
//! in-place form, and each tensor at its own element offset (16-byte aligned or not), one
//! handle for the whole sequence. Every rank's `h` and `y` bit for bit
//! `fixed_tree::residual_rmsnorm`. The planning that splits a call into launches, picks the
//! one-kernel form and reads gathered sums is the engine's own, shared with the GPUs.
#![cfg(feature = "cpu")]
mod norm_data;

use collective_core::fixed_tree::Element;
use collective_factory::half::{bf16, f16};
use collective_factory::{Collective, Config, CpuCollective, Io, RawRef, Reducible, RmsNorm, cpu};
use norm_data::{Choices, Shape, bits, every_size_by, reference, values};

/// The call of `shape` with seed `seed` on every rank; asserts every rank's h and y.
fn check<T: Element + Reducible>(comms: &[CpuCollective], shape: Shape, seed: u64, what: &str) {
    let Shape { rows, hidden, in_place_x, in_place_residual, offsets: [ox, oy, or, oh, ow] } = shape;
    let n = rows * hidden;
    let zero = T::from_f32_rounded(0.0);
    let placed = |v: Vec<T>, at: usize| -> Vec<T> {
        let mut b = vec![zero; at];
        b.extend(v);
        b
    };
    let got: Vec<(Vec<T>, Vec<T>)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let x = placed(values(n, seed * 100 + comm.rank() as u64), ox);
                    let mut xb = x.clone();
                    let mut y = vec![zero; oy + n];
                    let residual = placed(values(n, seed * 7 + 1), or);
                    let mut rb = residual.clone();
                    let mut h = vec![zero; oh + n];
                    let weight = placed(values(hidden, seed * 7 + 2), ow);
                    let io =
                        if in_place_x { Io::host_in_place(&mut xb[ox..]) } else { Io::host(&x[ox..], &mut y[oy..]) };
                    let res = if in_place_residual {
                        Io::host_in_place(&mut rb[or..])
                    } else {
                        Io::host(&residual[or..], &mut h[oh..])
                    };
                    let norm = RmsNorm { residual: res, weight: RawRef::host(&weight[ow..]), hidden, eps: 1e-6 };
                    comm.all_reduce_residual_rmsnorm(io, norm, &()).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let y = if in_place_x { xb[ox..].to_vec() } else { y[oy..].to_vec() };
                    let h = if in_place_residual { rb[or..].to_vec() } else { h[oh..].to_vec() };
                    (h, y)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    let (h, y) = reference::<T>(comms.len(), rows, hidden, seed);
    for (r, (gh, gy)) in got.into_iter().enumerate() {
        assert_eq!(bits(&gh), bits(&h), "{what} rank {r}: h");
        assert_eq!(bits(&gy), bits(&y), "{what} rank {r}: y");
    }
}

#[test]
fn random_calls_at_any_offset_equal_the_reference() {
    let rows = [0, 1, 2, 3, 5, 8, 17, 64, 65, 130, 512, 600];
    let hiddens = [1, 3, 7, 8, 24, 24, 100, 257, 1024, 2049, 4096];
    let mut choose = Choices(0x5eed_f00d_dead_beef);
    let mut calls = 0;
    for route in [None, Some("ipc_push_ll"), Some("ipc_one_shot"), Some("ipc_push"), Some("ipc_rs_ag")] {
        for (world, capacity) in [(2, 16 << 10), (3, 64 << 10), (5, 16 << 10), (4, 64 << 10)] {
            // 16 KiB of staging: most calls run in chunks (LL push's slots hold less still);
            // 64 KiB: a batch of 512-600 rows of 24 fits one launch, the gathered form on RS+AG.
            let config = Config::new().with_capacity(capacity);
            let config = match route {
                Some(r) => config.with_routing(every_size_by("cpu", r)),
                None => config,
            };
            let comms = cpu::thread_group(world, &config).expect("thread group");
            for call in 0..40 {
                let shape = choose.shape(&rows, &hiddens, 40_000);
                let seed = 1000 + calls;
                let what = format!("call {call} by {route:?} at world {world}: {shape:?}");
                match choose.pick(&[0, 1, 2]) {
                    0 => check::<f32>(&comms, shape, seed, &format!("{what} f32")),
                    1 => check::<bf16>(&comms, shape, seed, &format!("{what} bf16")),
                    _ => check::<f16>(&comms, shape, seed, &format!("{what} f16")),
                }
                calls += 1;
            }
            std::thread::scope(|s| {
                for c in &comms {
                    s.spawn(move || c.close().expect("close"));
                }
            });
        }
    }
    println!("{calls} random fused calls = fixed_tree::residual_rmsnorm");
}
