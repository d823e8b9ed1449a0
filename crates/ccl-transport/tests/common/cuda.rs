//! The NVIDIA side of the shared test code: cudarc contexts, streams and buffers, and the
//! transport over NCCL.
use super::Gpu;
use ccl_transport::{TransportCollective, TransportConfig};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;
use cuda_ipc::CudaDevice;
use cuda_ipc::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use std::sync::{Arc, OnceLock};

/// One CUDA device: its primary context, event tracking off (each buffer is used on one stream
/// at a time and the transport orders its own workspace).
pub struct Cuda {
    pub ctx: Arc<CudaContext>,
}

impl Gpu for Cuda {
    type Dev = CudaDevice;
    type Stream = Arc<CudaStream>;
    type Mem = CudaSlice<u8>;

    const RUNTIME: &'static str = "CUDA";
    const LIBRARY: &'static str = "NCCL";

    fn device_count() -> usize {
        static N: OnceLock<usize> = OnceLock::new();
        *N.get_or_init(|| cuda_ipc::driver::device_count().unwrap_or(0))
    }
    fn open(ordinal: usize) -> Option<Self> {
        let ctx = cuda_ipc::driver::open_device(ordinal).ok()?;
        // SAFETY: see the type's documentation.
        unsafe { ctx.disable_event_tracking() };
        Some(Cuda { ctx })
    }
    fn stream(&self) -> Result<Arc<CudaStream>, String> {
        self.ctx.new_stream().map_err(|e| e.to_string())
    }
    fn tree_device(&self) -> Result<CudaDevice, Error> {
        CudaDevice::new(&self.ctx)
    }
    fn transport(
        &self,
        boot: &dyn Bootstrap,
        config: &TransportConfig,
    ) -> Result<TransportCollective<CudaDevice>, Error> {
        TransportCollective::with_device(|| CudaDevice::new(&self.ctx), boot, config)
    }

    fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> CudaSlice<u8> {
        stream.alloc_zeros::<u8>(bytes.max(1)).expect("cuMemAlloc")
    }
    fn write(stream: &Arc<CudaStream>, mem: &mut CudaSlice<u8>, data: &[u8]) {
        stream.memcpy_htod(data, &mut mem.slice_mut(..data.len())).expect("memcpy_htod");
    }
    fn read(stream: &Arc<CudaStream>, mem: &CudaSlice<u8>) -> Vec<u8> {
        stream.clone_dtoh(mem).expect("clone_dtoh")
    }
    fn addr(stream: &Arc<CudaStream>, mem: &CudaSlice<u8>) -> u64 {
        let (p, _guard) = mem.device_ptr(stream);
        p
    }
    fn synchronize(stream: &Arc<CudaStream>) {
        stream.synchronize().expect("stream synchronize");
    }
}
