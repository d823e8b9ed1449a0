//! The AMD side of the shared test code: hip-ipc streams and `hipMalloc` buffers, and the
//! transport over RCCL with the HIP twin's tree kernel (`HipDevice`).
//!
//! Never executed on an AMD GPU (none was available): see docs/rocm.md.
use super::Gpu;
use ccl_transport::{TransportCollective, TransportConfig};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;
use hip_ipc::HipDevice;
use hip_ipc::Stream;
use hip_ipc::runtime::{self, DeviceMemory};
use std::sync::OnceLock;

/// One HIP device, by ordinal.
pub struct Hip {
    pub ordinal: usize,
}

impl Gpu for Hip {
    type Dev = HipDevice;
    type Stream = Stream;
    type Mem = DeviceMemory;

    const RUNTIME: &'static str = "HIP";
    const LIBRARY: &'static str = "RCCL";

    fn device_count() -> usize {
        static N: OnceLock<usize> = OnceLock::new();
        *N.get_or_init(|| runtime::device_count().unwrap_or(0))
    }
    fn open(ordinal: usize) -> Option<Self> {
        (ordinal < Self::device_count()).then_some(Hip { ordinal })
    }
    fn stream(&self) -> Result<Stream, String> {
        Stream::new(self.ordinal).map_err(|e| e.to_string())
    }
    fn tree_device(&self) -> Result<HipDevice, Error> {
        HipDevice::open(self.ordinal)
    }
    fn transport(
        &self,
        boot: &dyn Bootstrap,
        config: &TransportConfig,
    ) -> Result<TransportCollective<HipDevice>, Error> {
        // Loads the tree kernel inside the construction, so a rank whose code object does not
        // load still takes part in the agreement and every rank gets the error.
        TransportCollective::with_device(|| HipDevice::open(self.ordinal), boot, config)
    }

    fn alloc(stream: &Stream, bytes: usize) -> DeviceMemory {
        // `hipMalloc` + `hipMemset` (zeroed); `write` and `read` copy on the null stream, so
        // they are ordered after the memset.
        DeviceMemory::new(stream.device(), bytes.max(1)).expect("hipMalloc")
    }
    fn write(stream: &Stream, mem: &mut DeviceMemory, data: &[u8]) {
        // After the stream's earlier work: the synchronous copy does not wait for a
        // non-blocking stream.
        stream.synchronize().expect("hipStreamSynchronize");
        runtime::copy_to_device(data, mem.ptr()).expect("hipMemcpy (upload)");
    }
    fn read(stream: &Stream, mem: &DeviceMemory) -> Vec<u8> {
        stream.synchronize().expect("hipStreamSynchronize");
        let mut v = vec![0u8; mem.len()];
        runtime::copy_to_host(mem.ptr(), &mut v).expect("hipMemcpy (download)");
        v
    }
    fn addr(_: &Stream, mem: &DeviceMemory) -> u64 {
        mem.ptr()
    }
    fn synchronize(stream: &Stream) {
        stream.synchronize().expect("hipStreamSynchronize");
    }
}
