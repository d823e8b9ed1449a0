//! Randomised fused calls on NVIDIA GPUs through the raw entry (as an engine on another binding
//! makes them over a run), the GPU twin of `fused_norm_random.rs`: every IPC route forced and the
//! default table, worlds 2, 3 and 4 as threads on the GPUs there are, a staging of 64 KiB (most
//! calls chunked) or 1 MiB (one launch: the row forms, the gathered form), moderate or adversarial
//! values (NaN, infinities, zero rows, overflowing and underflowing squares) with `eps` of 1e-6,
//! 1e-5 or 0, 0-600 rows of widths 1-8192, every dtype, every in-place form, each tensor at its own
//! element offset in its allocation (16-byte aligned or not: the kernels' vector, row and scalar
//! paths), one handle for the whole sequence. Every rank's `h` and `y` bit for bit
//! `fixed_tree::residual_rmsnorm`. Skips, saying so, without a GPU.
#![cfg(feature = "cuda")]
mod norm_data;

use collective_core::fixed_tree::Element;
use collective_factory::cudarc::driver::{DevicePtr, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use collective_factory::half::{bf16, f16};
use collective_factory::{Collective, Config, NvidiaCollective, Reducible, nvidia};
use norm_data::{Choices, Shape, Tensor, assert_every_rank, every_size_by, reference_of, tensor};

fn gpu() -> bool {
    let ok = cuda_ipc::driver::driver_present() && cuda_ipc::driver::device_count().is_ok_and(|n| n > 0);
    if !ok {
        println!("skipped: no CUDA device");
    }
    ok
}

/// The call of `shape` with seed `seed` on every rank; asserts every rank's h and y.
fn check<T>(comms: &[NvidiaCollective], shape: Shape, seed: u64, what: &str)
where
    T: Element + Reducible + DeviceRepr + ValidAsZeroBits + Default + Clone,
{
    let Shape { rows, hidden, in_place_x, in_place_residual, offsets: [ox, oy, or, oh, ow], values, eps } = shape;
    let n = rows * hidden;
    let size = std::mem::size_of::<T>() as u64;
    let zero = T::from_f32_rounded(0.0);
    // `v` at element `at` of an allocation with a spare element after it (none is empty).
    let placed = |v: Vec<T>, at: usize| -> Vec<T> {
        let mut b = vec![zero; at];
        b.extend(v);
        b.push(zero);
        b
    };
    let got: Vec<(Vec<T>, Vec<T>)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|comm| {
                s.spawn(move || {
                    let stream = comm.context().new_stream().expect("stream");
                    let up = |v: Vec<T>| stream.clone_htod(&v).expect("upload");
                    let mut x = up(placed(tensor(values, seed, Tensor::X(comm.rank()), rows, hidden), ox));
                    let mut residual = up(placed(tensor(values, seed, Tensor::Residual, rows, hidden), or));
                    let weight = up(placed(tensor(values, seed, Tensor::Weight, rows, hidden), ow));
                    let mut y = up(placed(vec![zero; n], oy));
                    let mut h = up(placed(vec![zero; n], oh));
                    {
                        let (xp, _gx) = x.device_ptr_mut(&stream);
                        let (rp, _gr) = residual.device_ptr_mut(&stream);
                        let (wp, _gw) = weight.device_ptr(&stream);
                        let (yp, _gy) = y.device_ptr_mut(&stream);
                        let (hp, _gh) = h.device_ptr_mut(&stream);
                        let (xp, rp, wp) = (xp + ox as u64 * size, rp + or as u64 * size, wp + ow as u64 * size);
                        let yp = if in_place_x { xp } else { yp + oy as u64 * size };
                        let hp = if in_place_residual { rp } else { hp + oh as u64 * size };
                        // SAFETY: every range lies in a live allocation of this rank's context
                        // (offset plus `n` or `hidden` elements, one to spare), untouched by
                        // anything else until the stream synchronises below; the stream is
                        // this rank's.
                        unsafe {
                            comm.all_reduce_residual_rmsnorm_raw(
                                xp,
                                yp,
                                rp,
                                hp,
                                wp,
                                n,
                                hidden,
                                eps,
                                T::DTYPE,
                                stream.cu_stream().cast(),
                            )
                        }
                        .unwrap_or_else(|e| panic!("{what}: {e}"));
                    }
                    comm.synchronize(&stream).unwrap_or_else(|e| panic!("{what}: synchronize: {e}"));
                    let down = |b: &collective_factory::cudarc::driver::CudaSlice<T>, at: usize| {
                        stream.clone_dtoh(b).expect("download")[at..at + n].to_vec()
                    };
                    let y = if in_place_x { down(&x, ox) } else { down(&y, oy) };
                    let h = if in_place_residual { down(&residual, or) } else { down(&h, oh) };
                    (h, y)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    assert_every_rank(got, &reference_of::<T>(comms.len(), rows, hidden, seed, values, eps), what);
}

#[test]
fn random_raw_calls_at_any_offset_equal_the_reference() {
    if !gpu() {
        return;
    }
    let rows = [0, 1, 2, 3, 5, 8, 17, 33, 64, 65, 130, 512, 600];
    let hiddens = [1, 3, 8, 24, 24, 100, 257, 2048, 2049, 4096, 4096, 8192, 8192];
    let mut choose = Choices(0x6d0d_5eed_cafe_f00d);
    let mut calls = 0;
    for route in [None, Some("ipc_push_ll"), Some("ipc_one_shot"), Some("ipc_push"), Some("ipc_rs_ag")] {
        for (world, capacity) in [(2, 64 << 10), (3, 1 << 20), (4, 1 << 20)] {
            let config = Config::new().with_capacity(capacity);
            let config = match route {
                Some(r) => config.with_routing(every_size_by("nvidia", r)),
                None => config,
            };
            let comms = nvidia::thread_group(world, &config).expect("thread group");
            for call in 0..30 {
                let shape = choose.shape(&rows, &hiddens, 600_000);
                let seed = 2000 + calls;
                let what = format!("call {call} by {route:?} at world {world}: {shape:?}");
                match choose.pick(&[0, 1, 1, 2]) {
                    0 => check::<f32>(&comms, shape, seed, &format!("{what} f32")),
                    1 => check::<bf16>(&comms, shape, seed, &format!("{what} bf16")),
                    _ => check::<f16>(&comms, shape, seed, &format!("{what} f16")),
                }
                calls += 1;
            }
            println!("{route:?}, world {world}: 30 random raw fused calls = the reference");
        }
    }
    println!("{calls} random raw fused calls = fixed_tree::residual_rmsnorm");
}
