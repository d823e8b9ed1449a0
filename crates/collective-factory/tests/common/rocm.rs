//! The AMD side of the shared factory tests: hip-ipc streams and `hipMalloc` buffers, the HIP
//! IPC twin and the RCCL transport composed by `rocm::from_bootstrap`.
//!
//! Never executed on an AMD GPU (none was available): see docs/rocm.md.
use super::{Build, Comm, Platform};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;
use collective_factory::rocm;
use hip_ipc::HipDevice;
use hip_ipc::runtime::{self, DeviceMemory};
use hip_ipc::{HipIpcCollective, Stream};
use std::sync::Arc;

/// The ROCm platform.
pub struct Rocm;

impl Platform for Rocm {
    type Ipc = HipIpcCollective;
    type Dev = HipDevice;
    type Stream = Stream;
    type Mem = DeviceMemory;

    const NAME: &'static str = "rocm";
    const RUNTIME: &'static str = "HIP";
    const LIBRARY: &'static str = "RCCL";

    fn devices() -> Result<usize, String> {
        match runtime::device_count() {
            Ok(0) => Err("no HIP device (the runtime reports 0)".into()),
            Ok(n) => Ok(n),
            Err(e) => Err(format!("no HIP device ({e})")),
        }
    }
    fn build(boot: Arc<dyn Bootstrap>, c: Build) -> Result<Comm<Self>, Error> {
        rocm::from_bootstrap(boot, &c.config())
    }
    fn check_ipc(ipc: &HipIpcCollective) -> Result<(), Error> {
        ipc.check()
    }

    fn stream(ordinal: usize) -> Result<Stream, String> {
        Stream::new(ordinal).map_err(|e| e.to_string())
    }
    fn alloc(stream: &Stream, bytes: usize) -> Result<DeviceMemory, String> {
        // `hipMalloc` + `hipMemset`; the copies below run on the null stream, after the memset.
        DeviceMemory::new(stream.device(), bytes).map_err(|e| e.to_string())
    }
    fn upload(_: &Stream, mem: &mut DeviceMemory, img: &[u8]) -> Result<(), String> {
        if img.len() > mem.len() {
            return Err(format!("{} bytes into a {}-byte buffer", img.len(), mem.len()));
        }
        runtime::copy_to_device(img, mem.ptr()).map_err(|e| e.to_string())
    }
    fn download(_: &Stream, mem: &DeviceMemory, len: usize) -> Result<Vec<u8>, String> {
        if len > mem.len() {
            return Err(format!("{len} bytes from a {}-byte buffer", mem.len()));
        }
        let mut v = vec![0u8; len];
        runtime::copy_to_host(mem.ptr(), &mut v).map_err(|e| e.to_string())?;
        Ok(v)
    }
    fn addr(_: &Stream, mem: &DeviceMemory) -> u64 {
        mem.ptr()
    }
    fn synchronize(stream: &Stream) -> Result<(), String> {
        stream.synchronize().map_err(|e| e.to_string())
    }
}
