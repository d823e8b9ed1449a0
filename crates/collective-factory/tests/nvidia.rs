//! The NVIDIA composition on a GPU host: world 1 through the factory (the CUDA IPC backend's
//! local route; no transport is built for one rank), every call of `common::plan` bit-exact
//! against fixed-tree. Skips, saying so, without a GPU. Several GPUs: `tests/nvidia_routes.rs`.
#![cfg(feature = "cuda")]
mod common;

#[test]
fn world1_through_the_factory_is_bit_exact() {
    common::world1::<common::nvidia::Nvidia>()
}

/// The front door as a Rust engine uses it: `nvidia::thread_group` (ranks as threads on this
/// host's GPUs), cudarc buffers through the typed entry points (dtype from `T`, no `unsafe`,
/// cudarc's event ordering), and the raw entry on the same ranks — every result bit-exact
/// against fixed-tree, the reported route what the table says.
#[test]
fn thread_group_typed_and_raw_entry_points_are_bit_exact() {
    use collective_core::conformance::data::{finite_values, reference_reduce};
    use collective_core::{Collective, DType, Op};
    use collective_factory::{Config, nvidia};
    let count = match cuda_ipc::driver::device_count() {
        Ok(n) if n > 0 => n,
        other => {
            println!("skipped: no CUDA device ({other:?})");
            return;
        }
    };
    let world = 2;
    let ranks = nvidia::thread_group(world, &Config::new().with_capacity(1 << 20)).expect("thread group");
    let n = 4096;
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| finite_values(DType::F32, n, r as u64 + 11)).collect();
    let want = reference_reduce(&inputs, DType::F32);
    let as_f32 =
        |b: &[u8]| -> Vec<f32> { b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect() };
    let want_bits: Vec<u32> = as_f32(&want).iter().map(|x| x.to_bits()).collect();
    println!("world {world} on {count} GPU(s): route {:?}", ranks[0].route(Op::AllReduce, n * 4));
    std::thread::scope(|s| {
        for comm in &ranks {
            let inputs = &inputs;
            let want_bits = &want_bits;
            s.spawn(move || {
                let r = comm.rank();
                let stream = comm.context().new_stream().expect("stream");
                let x = stream.clone_htod(&as_f32(&inputs[r])).expect("upload");
                let mut y = stream.alloc_zeros::<f32>(n).expect("alloc");
                comm.all_reduce_into(&x, &mut y, &stream).expect("typed all_reduce");
                let got: Vec<u32> = stream.clone_dtoh(&y).expect("download").iter().map(|v| v.to_bits()).collect();
                assert_eq!(&got, want_bits, "rank {r}: typed all_reduce");
                // In place, then the raw entry on the same buffers.
                let mut z = stream.clone_htod(&as_f32(&inputs[r])).expect("upload");
                comm.all_reduce_in_place(&mut z, &stream).expect("in place");
                let got: Vec<u32> = stream.clone_dtoh(&z).expect("download").iter().map(|v| v.to_bits()).collect();
                assert_eq!(&got, want_bits, "rank {r}: in-place all_reduce");
                let mut w = stream.alloc_zeros::<f32>(n).expect("alloc");
                {
                    use cuda_ipc::cudarc::driver::{DevicePtr, DevicePtrMut};
                    let (xi, _gx) = x.device_ptr(&stream);
                    let (wo, _gw) = w.device_ptr_mut(&stream);
                    // SAFETY: live device buffers of this context, untouched until the stream
                    // synchronises below; the stream is this rank's.
                    unsafe { comm.enqueue_raw(Op::AllReduce, xi, wo, n, DType::F32, stream.cu_stream().cast()) }
                        .expect("raw all_reduce");
                }
                let got: Vec<u32> = stream.clone_dtoh(&w).expect("download").iter().map(|v| v.to_bits()).collect();
                assert_eq!(&got, want_bits, "rank {r}: raw all_reduce");
                // all_gather through the typed entry: rank-major.
                let mut g = stream.alloc_zeros::<f32>(n * world).expect("alloc");
                comm.all_gather_into(&x, &mut g, &stream).expect("typed all_gather");
                let got: Vec<u32> = stream.clone_dtoh(&g).expect("download").iter().map(|v| v.to_bits()).collect();
                let gathered: Vec<u32> = inputs.iter().flat_map(|b| as_f32(b)).map(|v| v.to_bits()).collect();
                assert_eq!(got, gathered, "rank {r}: typed all_gather");
                comm.close().expect("close");
            });
        }
    });
}
