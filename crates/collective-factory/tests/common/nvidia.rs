//! The NVIDIA side of the shared factory tests: cudarc streams and buffers, the CUDA IPC twin
//! and the NCCL transport composed by `nvidia::from_bootstrap`.
use super::{Build, Comm, Platform};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;
use collective_factory::nvidia;
use cuda_ipc::CudaDevice;
use cuda_ipc::CudaIpcCollective;
use cuda_ipc::cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use std::sync::Arc;

/// The NVIDIA platform.
pub struct Nvidia;

impl Platform for Nvidia {
    type Ipc = CudaIpcCollective;
    type Dev = CudaDevice;
    type Stream = Arc<CudaStream>;
    type Mem = CudaSlice<u8>;

    const NAME: &'static str = "nvidia";
    const RUNTIME: &'static str = "CUDA";
    const LIBRARY: &'static str = "NCCL";

    fn devices() -> Result<usize, String> {
        if !cuda_ipc::driver::driver_present() {
            return Err("no CUDA driver (libcuda is not loadable)".into());
        }
        match cuda_ipc::driver::device_count() {
            Ok(0) => Err("no CUDA device (the driver reports 0)".into()),
            Ok(n) => Ok(n),
            Err(e) => Err(format!("no CUDA device ({e})")),
        }
    }
    fn prepare_process() {
        if std::env::var_os("NCCL_NVLS_ENABLE").is_none() {
            // SAFETY: called before any CUDA or NCCL library is loaded in this rank process,
            // while no other thread reads the environment (the bootstrap starts none; libtest's
            // main thread waits).
            unsafe { std::env::set_var("NCCL_NVLS_ENABLE", "0") };
        }
    }
    fn build(boot: Arc<dyn Bootstrap>, c: Build) -> Result<Comm<Self>, Error> {
        nvidia::from_bootstrap(boot, &c.config())
    }
    fn check_ipc(ipc: &CudaIpcCollective) -> Result<(), Error> {
        ipc.check()
    }

    fn stream(ordinal: usize) -> Result<Arc<CudaStream>, String> {
        let ctx = cuda_ipc::driver::open_device(ordinal).map_err(|e| e.to_string())?;
        ctx.new_stream().map_err(|e| e.to_string())
    }
    fn alloc(stream: &Arc<CudaStream>, bytes: usize) -> Result<CudaSlice<u8>, String> {
        stream.alloc_zeros::<u8>(bytes).map_err(|e| e.to_string())
    }
    fn upload(stream: &Arc<CudaStream>, mem: &mut CudaSlice<u8>, img: &[u8]) -> Result<(), String> {
        stream.memcpy_htod(img, &mut mem.slice_mut(..img.len())).map_err(|e| e.to_string())
    }
    fn download(stream: &Arc<CudaStream>, mem: &CudaSlice<u8>, len: usize) -> Result<Vec<u8>, String> {
        stream.clone_dtoh(&mem.slice(..len)).map_err(|e| e.to_string())
    }
    fn addr(stream: &Arc<CudaStream>, mem: &CudaSlice<u8>) -> u64 {
        let (p, _record) = mem.device_ptr(stream);
        p
    }
    fn synchronize(stream: &Arc<CudaStream>) -> Result<(), String> {
        stream.synchronize().map_err(|e| e.to_string())
    }
}
