//! The fused all_reduce + residual + RMSNorm at the front door of the CPU platform, as users
//! call it: every result bit for bit `fixed_tree::residual_rmsnorm` (the reference that
//! defines the bits) at worlds 1, 2, 3, 4, 8 (IPC), on virtual nodes (hierarchical 2 x 4, flat
//! 3 x 3), in every dtype and in-place form; a row's bits the same in any batch; refused calls
//! write nothing.
#![cfg(feature = "cpu")]
mod norm_data;

use collective_core::fixed_tree::Element;
use collective_factory::half::{bf16, f16};
use collective_factory::{Collective, Config, CpuCollective, Error, Io, RawMut, RawRef, RmsNorm, cpu};
use norm_data::{bits, every_size_by, reference, values};

fn config() -> Config {
    Config::new().with_capacity(1 << 16)
}

/// One fused call on every rank (threads), in the form `in_place_x` / `in_place_residual`
/// asks; returns every rank's (h, y).
fn run<T: Element + collective_factory::Reducible>(
    comms: &[CpuCollective],
    rows: usize,
    hidden: usize,
    in_place_x: bool,
    in_place_residual: bool,
    seed: u64,
) -> Vec<(Vec<T>, Vec<T>)> {
    let n = rows * hidden;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let r = comm.rank();
                    let x: Vec<T> = values(n, seed * 100 + r as u64);
                    let residual: Vec<T> = values(n, seed * 7 + 1);
                    let weight: Vec<T> = values(hidden, seed * 7 + 2);
                    let (mut xb, mut y) = (x.clone(), vec![T::from_f32_rounded(0.0); n]);
                    let (mut rb, mut h) = (residual.clone(), vec![T::from_f32_rounded(0.0); n]);
                    let io = if in_place_x { Io::host_in_place(&mut xb) } else { Io::host(&x, &mut y) };
                    let res = if in_place_residual { Io::host_in_place(&mut rb) } else { Io::host(&residual, &mut h) };
                    let norm = RmsNorm { residual: res, weight: RawRef::host(&weight), hidden, eps: 1e-6 };
                    comm.all_reduce_residual_rmsnorm(io, norm, &()).expect("fused call");
                    let y = if in_place_x { xb } else { y };
                    let h = if in_place_residual { rb } else { h };
                    (h, y)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

fn check_world<T: Element + collective_factory::Reducible>(comms: &[CpuCollective], what: &str) {
    let world = comms.len();
    // 9 x 4096 is above the 64 KiB staging capacity: the all_reduce runs in chunks and the norm
    // is the epilogue of the last chunk's launch (the IPC routes' one-kernel form).
    // 70 rows: above ONE_KERNEL_MAX_ROWS, the norm is a second launch. 2 x 3000 and 6 x 1000:
    // rows that do not divide the 8 KiB protocol tile (6000 and 2000 bytes in f16/bf16), so
    // the launch keeps its barrier. 0 x 4096: an empty batch (a rank with no tokens this step).
    const { assert!(collective_factory::ONE_KERNEL_MAX_ROWS < 70) };
    for (rows, hidden) in [(1, 8), (3, 4096), (5, 2049), (2, 7), (9, 4096), (70, 24), (2, 3000), (6, 1000), (0, 4096)] {
        let seed = (rows * 31 + hidden) as u64;
        let (h, y) = reference::<T>(world, rows, hidden, seed);
        for (ipx, ipr) in [(false, false), (true, true), (false, true), (true, false)] {
            for (r, (gh, gy)) in run::<T>(comms, rows, hidden, ipx, ipr, seed).into_iter().enumerate() {
                assert_eq!(bits(&gh), bits(&h), "{what} rank {r}: h, {rows}x{hidden}, in place {ipx}/{ipr}");
                assert_eq!(bits(&gy), bits(&y), "{what} rank {r}: y, {rows}x{hidden}, in place {ipx}/{ipr}");
            }
        }
    }
}

fn close(comms: &[CpuCollective]) {
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || c.close().expect("close"));
        }
    });
}

#[test]
fn every_world_and_dtype_equals_the_reference() {
    for world in [1, 2, 3, 4, 8] {
        let comms = cpu::thread_group(world, &config()).expect("thread group");
        check_world::<f32>(&comms, &format!("world {world} f32"));
        check_world::<bf16>(&comms, &format!("world {world} bf16"));
        check_world::<f16>(&comms, &format!("world {world} f16"));
        close(&comms);
    }
}

/// Every IPC route forced by the table: the shapes of `check_world` and 100 x 512 f32/f16 (two
/// launches, the all_reduce in chunks of the 64 KiB staging); on RS+AG also chunks of a few rows
/// (300 x 256), rows that are not a 16-byte multiple (7 x 2049 f16), a row of 32 KiB (3 x 8192
/// f32) and of 64 KiB, the whole staging (2 x 16384 f32), 65 rows (the second launch), and
/// 512 x 24 (GATHERED_MIN_ROWS in one launch: one kernel whose norm reads the gathered sums).
#[test]
fn every_ipc_route_forced_by_the_table() {
    for route in ["ipc_push_ll", "ipc_one_shot", "ipc_push", "ipc_rs_ag"] {
        for world in [2, 3, 4, 8] {
            let config = config().with_routing(every_size_by("cpu", route));
            let comms = cpu::thread_group(world, &config).expect("thread group");
            check_world::<bf16>(&comms, &format!("world {world} bf16 by {route}"));
            let shapes: &[(usize, usize)] = if route == "ipc_rs_ag" {
                &[(300, 256), (100, 512), (7, 2049), (3, 8192), (2, 16384), (65, 24), (512, 24)]
            } else {
                &[(100, 512)]
            };
            for &(rows, hidden) in shapes {
                let seed = (rows * 31 + hidden) as u64;
                let what = format!("world {world} by {route}, {rows}x{hidden}");
                let (h, y) = reference::<f32>(world, rows, hidden, seed);
                for (r, (gh, gy)) in run::<f32>(&comms, rows, hidden, true, true, seed).into_iter().enumerate() {
                    assert_eq!(bits(&gh), bits(&h), "{what} f32 rank {r}: h");
                    assert_eq!(bits(&gy), bits(&y), "{what} f32 rank {r}: y");
                }
                let (h, y) = reference::<f16>(world, rows, hidden, seed);
                for (r, (gh, gy)) in run::<f16>(&comms, rows, hidden, false, false, seed).into_iter().enumerate() {
                    assert_eq!(bits(&gh), bits(&h), "{what} f16 rank {r}: h");
                    assert_eq!(bits(&gy), bits(&y), "{what} f16 rank {r}: y");
                }
            }
            close(&comms);
        }
    }
}

/// The table's `all_reduce_residual_rmsnorm` rules route the fused call and only it: the
/// route each handle reports for it and for the plain all_reduce, and the fused call's bits
/// (= the reference) with the fused call on IPC and the all_reduce on the transport, and the
/// reverse. (The bits are the same on every route by design; the fused call dispatches by the
/// route it reports, `Routed::fused_norm_route`.)
#[test]
fn the_fused_call_takes_its_own_route_from_the_table() {
    use collective_factory::{Op, Route};
    let (rows, hidden, world) = (9, 4096, 2);
    let bytes = rows * hidden * 4;
    for (all_reduce, fused, want_ar, want_fused) in [
        ("transport", "ipc_one_shot", Route::Transport, Route::IpcOneShot),
        ("ipc_one_shot", "transport", Route::IpcOneShot, Route::Transport),
        ("ipc_push_ll", "ipc_rs_ag", Route::IpcPushLl, Route::IpcReduceScatterAllGather),
    ] {
        let routing = norm_data::fused_by("cpu", all_reduce, fused);
        let comms = cpu::thread_group(world, &config().with_routing(routing)).expect("thread group");
        for c in &comms {
            assert_eq!(c.route(Op::AllReduce, bytes), want_ar, "{all_reduce}/{fused}");
            assert_eq!(c.fused_norm_route(bytes), want_fused, "{all_reduce}/{fused}");
        }
        let (h, y) = reference::<f32>(world, rows, hidden, 5);
        for (r, (gh, gy)) in run::<f32>(&comms, rows, hidden, false, false, 5).into_iter().enumerate() {
            assert_eq!(bits(&gh), bits(&h), "{all_reduce}/{fused} rank {r}: h");
            assert_eq!(bits(&gy), bits(&y), "{all_reduce}/{fused} rank {r}: y");
        }
        close(&comms);
    }
}

#[test]
fn across_virtual_nodes_hierarchical_and_flat() {
    for (nodes, local) in [(2, 4), (3, 3)] {
        let comms = cpu::virtual_nodes(nodes, local, &config()).expect("virtual nodes");
        check_world::<bf16>(&comms, &format!("{nodes}x{local}"));
        close(&comms);
    }
}

#[test]
fn a_row_has_the_same_bits_in_any_batch() {
    let comms = cpu::thread_group(4, &config()).expect("thread group");
    let hidden = 4096;
    // Row 0 of a batch of 1 and of a batch of 6 (the same inputs: `values` of the same seed
    // start with the same row only for row 0, so compare row 0).
    let one = run::<bf16>(&comms, 1, hidden, false, false, 9);
    let six = run::<bf16>(&comms, 6, hidden, false, false, 9);
    for r in 0..4 {
        assert_eq!(bits(&one[r].1), bits(&six[r].1[..hidden]), "rank {r}");
    }
    close(&comms);
}

#[test]
fn refused_calls_write_nothing() {
    let comm = cpu::thread_group(1, &config()).expect("world 1").remove(0);
    let (rows, hidden) = (2, 8);
    let n = rows * hidden;
    let x = vec![1.0f32; n];
    let weight = vec![1.0f32; hidden];
    let short = vec![1.0f32; hidden - 1];
    let residual = vec![2.0f32; n];
    let sentinel = -7.0f32;
    type Call<'a> = Box<dyn Fn(&mut [f32], &mut [f32]) -> Result<(), Error> + 'a>;
    let cases: Vec<(&str, Call<'_>)> = vec![
        (
            "weight length",
            Box::new(|y, h| {
                let norm =
                    RmsNorm { residual: Io::host(&residual, h), weight: RawRef::host(&short), hidden, eps: 1e-6 };
                comm.all_reduce_residual_rmsnorm(Io::host(&x, y), norm, &())
            }),
        ),
        (
            "hidden not dividing",
            Box::new(|y, h| {
                let norm = RmsNorm {
                    residual: Io::host(&residual, h),
                    weight: RawRef::host(&weight[..3]),
                    hidden: 3,
                    eps: 1e-6,
                };
                comm.all_reduce_residual_rmsnorm(Io::host(&x, y), norm, &())
            }),
        ),
        (
            "eps NaN",
            Box::new(|y, h| {
                let norm =
                    RmsNorm { residual: Io::host(&residual, h), weight: RawRef::host(&weight), hidden, eps: f32::NAN };
                comm.all_reduce_residual_rmsnorm(Io::host(&x, y), norm, &())
            }),
        ),
        (
            "h over y",
            Box::new(|y, _h| {
                // SAFETY: `y`, borrowed for the call; the call must refuse before touching it.
                let (yv, hv) = unsafe {
                    (
                        RawMut::from_raw(y.as_mut_ptr() as u64, n, collective_core::DType::F32),
                        RawMut::from_raw(y.as_mut_ptr() as u64, n, collective_core::DType::F32),
                    )
                };
                let norm = RmsNorm {
                    residual: Io::OutOfPlace { input: RawRef::host(&residual), output: hv },
                    weight: RawRef::host(&weight),
                    hidden,
                    eps: 1e-6,
                };
                comm.all_reduce_residual_rmsnorm(Io::OutOfPlace { input: RawRef::host(&x), output: yv }, norm, &())
            }),
        ),
    ];
    for (what, call) in cases {
        let (mut y, mut h) = (vec![sentinel; n], vec![sentinel; n]);
        let e = call(&mut y, &mut h).expect_err(what);
        assert!(
            matches!(e, Error::LengthMismatch { .. } | Error::InvalidArgument { .. } | Error::ArgumentsOverlap { .. }),
            "{what}: {e}"
        );
        assert!(y.iter().chain(&h).all(|v| v.to_bits() == sentinel.to_bits()), "{what}: an output was written");
    }
}

/// `h` written over an out-of-place `x`, whole or in part: refused (the all_reduce may still be
/// reading `x` where the one-kernel form writes `h`), with nothing written to any buffer.
#[test]
fn h_over_an_out_of_place_x_is_refused() {
    let comm = cpu::thread_group(1, &config()).expect("world 1").remove(0);
    let (rows, hidden) = (4, 8);
    let n = rows * hidden;
    let residual = vec![2.0f32; n];
    let weight = vec![1.0f32; hidden];
    for (what, h_at) in [("h is x", 0), ("h overlaps x by three rows", hidden), ("h overlaps x by one element", n - 1)]
    {
        let mut shared = vec![0.25f32; 2 * n];
        let mut y = vec![-7.0f32; n];
        let before = bits(&shared);
        let base = shared.as_mut_ptr() as u64;
        let size = std::mem::size_of::<f32>() as u64;
        // SAFETY: `x` and `h` lie in `shared` (2n elements, both n long from offsets 0 and
        // `h_at` <= n), borrowed for the call, which must refuse before touching either.
        let (x, h) = unsafe {
            (
                RawRef::from_raw(base, n, collective_core::DType::F32),
                RawMut::from_raw(base + h_at as u64 * size, n, collective_core::DType::F32),
            )
        };
        let norm = RmsNorm {
            residual: Io::OutOfPlace { input: RawRef::host(&residual), output: h },
            weight: RawRef::host(&weight),
            hidden,
            eps: 1e-6,
        };
        let e = comm
            .all_reduce_residual_rmsnorm(Io::OutOfPlace { input: x, output: RawMut::host(&mut y) }, norm, &())
            .expect_err(what);
        assert!(matches!(e, Error::ArgumentsOverlap { first: "x", second: "h", .. }), "{what}: {e}");
        assert_eq!(bits(&shared), before, "{what}: x or h was written");
        assert!(y.iter().all(|v| v.to_bits() == (-7.0f32).to_bits()), "{what}: y was written");
    }
    // The read-only tensors may share memory: x as its own residual, with h and y apart.
    let x = vec![0.5f32; n];
    let (mut h, mut y) = (vec![0.0f32; n], vec![0.0f32; n]);
    let norm = RmsNorm { residual: Io::host(&x, &mut h), weight: RawRef::host(&weight), hidden, eps: 1e-6 };
    comm.all_reduce_residual_rmsnorm(Io::host(&x, &mut y), norm, &()).expect("x as the residual");
    assert!(h.iter().all(|v| v.to_bits() == 1.0f32.to_bits()), "h = x + x");
    close(&[comm]);
}

/// An empty batch (a rank with no tokens this step) is still a call of the group: on every IPC
/// route, rows of 8192 and 4096 in bf16 (the GPU's row forms' shapes), rank 0's empty fused
/// call whose peer never makes it ends in `PeerTimeout` naming rank 1 after the peer bound,
/// never `Ok`, and the handle is poisoned. (On the GPU the one-shot body for rows of two tiles
/// waited only in blocks that had a row until 2026-12-06, so there an empty call of hidden 8192
/// returned `Ok` at once: `nvidia_fused_norm`'s fault test has the same shapes.)
#[test]
fn an_empty_batch_whose_peer_never_calls_times_out() {
    let bound = std::time::Duration::from_millis(300);
    for route in ["ipc_one_shot", "ipc_push_ll", "ipc_push", "ipc_rs_ag"] {
        for hidden in [8192, 4096] {
            let config = config().with_timeout(bound).with_lockstep(false).with_routing(every_size_by("cpu", route));
            let comms = cpu::thread_group(2, &config).expect("thread group");
            let what = format!("0 x {hidden} by {route}");
            let (x, mut y, mut h) = (vec![bf16::ONE; hidden], vec![bf16::ZERO; hidden], vec![bf16::ONE; hidden]);
            let weight = vec![bf16::ONE; hidden];
            let mut call = || {
                let norm = RmsNorm {
                    residual: Io::host_in_place(&mut h[..0]),
                    weight: RawRef::host(&weight),
                    hidden,
                    eps: 1e-6,
                };
                comms[0].all_reduce_residual_rmsnorm(Io::host(&x[..0], &mut y[..0]), norm, &())
            };
            let t = std::time::Instant::now();
            let got = call();
            let waited = t.elapsed();
            assert!(matches!(got, Err(Error::PeerTimeout { peer: 1, .. })), "{what}: {got:?} after {waited:?}");
            assert!(waited >= bound && waited < bound * 10, "{what}: ended after {waited:?}, bound {bound:?}");
            let again = call();
            assert!(matches!(again, Err(Error::Poisoned { .. })), "{what}: then {again:?}");
            println!("{what}: PeerTimeout after {waited:?}, then Poisoned");
        }
    }
}
