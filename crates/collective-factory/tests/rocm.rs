//! The ROCm composition on an AMD GPU host: world 1 through the factory, bit-exact. Skips,
//! saying so, without a HIP device (no AMD GPU was available when this was written).
#![cfg(feature = "rocm")]
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::conformance::skip;
use collective_core::protocol::Timeouts;
use collective_core::{Collective, DType, Io, RawMut, RawRef};
use collective_factory::rocm_collective;
use hip_ipc::runtime::{DeviceMemory, copy_to_device, copy_to_host};
use std::sync::Arc;

#[test]
fn world1_through_the_factory_is_bit_exact() {
    if !hip_ipc::runtime::device_count().is_ok_and(|n| n > 0) {
        skip("no HIP device");
        return;
    }
    let boot: Arc<dyn Bootstrap> = Arc::new(LocalBootstrap::group(1).remove(0));
    let comm = rocm_collective(boot, 1 << 20, None, Timeouts::default()).expect("factory");
    let host: Vec<f32> = (0..4096).map(|i| i as f32 * 0.37 - 11.0).collect();
    let bytes: Vec<u8> = host.iter().flat_map(|v| v.to_le_bytes()).collect();
    let input = DeviceMemory::new(0, bytes.len()).unwrap();
    let output = DeviceMemory::new(0, bytes.len()).unwrap();
    copy_to_device(&bytes, input.ptr()).unwrap();
    let stream = hip_ipc::Stream::new(0).unwrap();
    // SAFETY: both allocations hold `host.len()` f32 and outlive the synchronisation below.
    let io = unsafe {
        Io::OutOfPlace {
            input: RawRef::from_raw(input.ptr(), host.len(), DType::F32),
            output: RawMut::from_raw(output.ptr(), host.len(), DType::F32),
        }
    };
    comm.all_reduce(io, &stream).unwrap();
    stream.synchronize().unwrap();
    let mut got = vec![0u8; bytes.len()];
    copy_to_host(output.ptr(), &mut got).unwrap();
    assert_eq!(got, bytes);
    comm.close().unwrap();
}
