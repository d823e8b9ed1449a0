//! Randomised fused calls on the CPU twin, as an engine makes them over a run: every IPC route
//! forced and the default table, worlds 2, 3, 4 and 5, a staging small enough that most calls run
//! in chunks or one that holds a batch of 512 rows (the gathered form), batches from 0 to 600 rows
//! of odd and even widths (1 to 4096), moderate or adversarial values (NaN, infinities, zero rows,
//! overflowing and underflowing squares) with `eps` of 1e-6, 1e-5 or 0, every dtype, every in-place
//! form, and each tensor at its own element offset (16-byte aligned or not), one handle for the
//! whole sequence. Every rank's `h` and `y` bit for bit `fixed_tree::residual_rmsnorm`. The
//! planning that splits a call into launches, picks the one-kernel form and reads gathered sums is
//! the engine's own, shared with the GPUs.
#![cfg(feature = "cpu")]
mod norm_data;

use collective_core::fixed_tree::Element;
use collective_factory::half::{bf16, f16};
use collective_factory::{Collective, Config, CpuCollective, Io, RawRef, Reducible, RmsNorm, cpu};
use norm_data::{Choices, Shape, Tensor, assert_every_rank, every_size_by, reference_of, tensor};

/// The call of `shape` with seed `seed` on every rank; asserts every rank's h and y.
fn check<T: Element + Reducible>(comms: &[CpuCollective], shape: Shape, seed: u64, what: &str) {
    check_shifted::<T>(comms, shape, seed, what, |_| 0);
}

/// [`check`] with rank `r`'s tensors `shift(r)` elements further into their buffers than
/// `shape` says: ranks whose addresses differ in alignment in one call.
fn check_shifted<T: Element + Reducible>(
    comms: &[CpuCollective],
    shape: Shape,
    seed: u64,
    what: &str,
    shift: impl Fn(usize) -> usize + Sync,
) {
    let Shape { rows, hidden, in_place_x, in_place_residual, offsets, values, eps } = shape;
    let n = rows * hidden;
    let shift = &shift;
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
                    let [ox, oy, or, oh, ow] = offsets.map(|o| o + shift(comm.rank()));
                    let x = placed(tensor(values, seed, Tensor::X(comm.rank()), rows, hidden), ox);
                    let mut xb = x.clone();
                    let mut y = vec![zero; oy + n];
                    let residual = placed(tensor(values, seed, Tensor::Residual, rows, hidden), or);
                    let mut rb = residual.clone();
                    let mut h = vec![zero; oh + n];
                    let weight = placed(tensor(values, seed, Tensor::Weight, rows, hidden), ow);
                    let io =
                        if in_place_x { Io::host_in_place(&mut xb[ox..]) } else { Io::host(&x[ox..], &mut y[oy..]) };
                    let res = if in_place_residual {
                        Io::host_in_place(&mut rb[or..])
                    } else {
                        Io::host(&residual[or..], &mut h[oh..])
                    };
                    let norm = RmsNorm { residual: res, weight: RawRef::host(&weight[ow..]), hidden, eps };
                    comm.all_reduce_residual_rmsnorm(io, norm, &()).unwrap_or_else(|e| panic!("{what}: {e}"));
                    let y = if in_place_x { xb[ox..].to_vec() } else { y[oy..].to_vec() };
                    let h = if in_place_residual { rb[or..].to_vec() } else { h[oh..].to_vec() };
                    (h, y)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    assert_every_rank(got, &reference_of::<T>(comms.len(), rows, hidden, seed, values, eps), what);
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

/// Rows of 8192 in whole-row shards on bulk push and RS+AG (the calls that take the wide
/// 16 KiB tile, chosen from signed values only) with one rank's tensors one element off 16
/// bytes (that rank off the row forms' vector path: the gathered-sum form or the norm's own
/// launch, in the same tiles) or every rank's: every rank's h and y the reference's, in and
/// out of place, in one launch and chunked (128 KiB of staging).
#[test]
fn rows_of_8192_with_ranks_off_16_bytes_equal_the_reference() {
    let mut calls = 0;
    for route in ["ipc_push", "ipc_rs_ag"] {
        for (world, capacity) in [(2, 4 << 20), (4, 4 << 20), (2, 128 << 10), (3, 4 << 20)] {
            let config = Config::new().with_capacity(capacity).with_routing(every_size_by("cpu", route));
            let comms = cpu::thread_group(world, &config).expect("thread group");
            for rows in [world, 4 * world] {
                for (in_place, who) in [(false, "rank 0"), (true, "rank 0"), (false, "every rank")] {
                    let shape = Shape {
                        rows,
                        hidden: 8192,
                        in_place_x: in_place,
                        in_place_residual: in_place,
                        offsets: [0; 5],
                        values: norm_data::Values::Moderate,
                        eps: 1e-6,
                    };
                    let what =
                        format!("{route} world {world} capacity {capacity} {rows}x8192 in place {in_place}, {who} off");
                    let every = who == "every rank";
                    check_shifted::<bf16>(&comms, shape, 77 + calls, &what, |r| usize::from(every || r == 0));
                    calls += 1;
                }
            }
            std::thread::scope(|s| {
                for c in &comms {
                    s.spawn(move || c.close().expect("close"));
                }
            });
        }
    }
}

/// The adversarial inputs reach the cases the contract names (docs of
/// `fixed_tree::residual_rmsnorm`, "Specials"), for every dtype: rows whose `y` is NaN
/// throughout (a zero row with `eps = 0`, a NaN in `h`), infinite `h` (an input or a sum
/// overflowing), rows whose `inv` is `+0` (`y` all zeros or NaN while `h` is finite and nonzero
/// somewhere), rows whose `inv` is `∞` (an infinite `y` from a finite `h`), subnormal `h`, and
/// exact zeros from cancelling ranks. Without them the randomised calls above would test
/// moderate values only.
#[test]
fn adversarial_values_reach_every_special_case() {
    fn cases<T: Element>() -> [usize; 6] {
        let (rows, hidden) = (256, 64);
        let (h, y) = norm_data::reference_of::<T>(4, rows, hidden, 77, norm_data::Values::Adversarial, 0.0);
        let mut seen = [0; 6];
        for i in 0..rows {
            let (h, y) = (&h[i * hidden..][..hidden], &y[i * hidden..][..hidden]);
            let f = |v: &T| v.to_f32_exact();
            let finite_h = h.iter().all(|v| f(v).is_finite());
            seen[0] += y.iter().all(|v| v.is_nan()) as usize;
            seen[1] += h.iter().any(|v| f(v).is_infinite()) as usize;
            seen[2] +=
                (finite_h && h.iter().any(|v| f(v) != 0.0) && y.iter().all(|v| f(v) == 0.0 || v.is_nan())) as usize;
            seen[3] += (finite_h && y.iter().any(|v| f(v).is_infinite())) as usize;
            seen[4] += h.iter().any(|v| f(v) != 0.0 && f(v).abs() < f32::MIN_POSITIVE.max(tiny::<T>())) as usize;
            seen[5] += h.iter().all(|v| f(v) == 0.0) as usize;
        }
        seen
    }
    /// `T`'s smallest normal, as an f32.
    fn tiny<T: Element>() -> f32 {
        if T::NAME == "f16" { 2f32.powi(-14) } else { f32::MIN_POSITIVE }
    }
    for (name, seen) in [("f32", cases::<f32>()), ("bf16", cases::<bf16>()), ("f16", cases::<f16>())] {
        println!(
            "{name}: rows NaN {}, h infinite {}, inv = +0 {}, inv = inf {}, h subnormal {}, h zero {}",
            seen[0], seen[1], seen[2], seen[3], seen[4], seen[5]
        );
        // f16 cannot reach two: its finite squares sum far below f32's range (65504^2 * 2^24 <
        // 2^57), and its smallest subnormal's square (2^-48) is a normal f32, so `q` is
        // infinite only with an infinite `h` and zero only with an all-zero row.
        let reachable = if name == "f16" { vec![0, 1, 4, 5] } else { (0..6).collect() };
        assert!(reachable.iter().all(|&k| seen[k] > 0), "{name}: a case never reached: {seen:?}");
    }
}
