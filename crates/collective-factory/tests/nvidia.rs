//! The NVIDIA composition on a GPU host: world 1 through the factory (CUDA IPC local route and
//! the NCCL transport built), bit-exact against fixed-tree. Skips, saying so, without a GPU.
#![cfg(feature = "cuda")]
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::conformance::skip;
use collective_core::{Collective, DType, Io, RawMut, RawRef};
use collective_factory::{NvidiaConfig, nvidia_collective};
use cuda_ipc::cudarc::driver::DevicePtr;
use std::sync::Arc;

#[test]
fn world1_through_the_factory_is_bit_exact() {
    if !cuda_ipc::driver::driver_present() || cuda_ipc::driver::device_count().map_or(true, |n| n == 0) {
        skip("no CUDA device");
        return;
    }
    let boot: Arc<dyn Bootstrap> = Arc::new(LocalBootstrap::group(1).remove(0));
    let comm = nvidia_collective(boot, &NvidiaConfig::new(1 << 20)).expect("factory");
    let ctx = cuda_ipc::driver::open_device(0).unwrap();
    let stream = ctx.new_stream().unwrap();
    let host: Vec<f32> = (0..4096).map(|i| i as f32 * 0.37 - 11.0).collect();
    let input = stream.clone_htod(&host).unwrap();
    let output = stream.alloc_zeros::<f32>(host.len()).unwrap();
    {
        let (src, _a) = input.device_ptr(&stream);
        let (dst, _b) = output.device_ptr(&stream);
        // SAFETY: both allocations hold `host.len()` f32 and outlive the synchronisation below.
        let io = unsafe {
            Io::OutOfPlace {
                input: RawRef::from_raw(src, host.len(), DType::F32),
                output: RawMut::from_raw(dst, host.len(), DType::F32),
            }
        };
        comm.all_reduce(io, &stream).unwrap();
    }
    let got = stream.clone_dtoh(&output).unwrap();
    assert_eq!(
        got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        host.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    comm.close().unwrap();
}
