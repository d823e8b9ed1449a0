//! CUDA's part of the shared GPU suite (`gpu-conformance`): [`Cuda`], how the tests discover
//! and open devices, make streams, copy and launch the fused tree on cudarc. Everything else
//! (rank environments, worlds, the cases) is the suite's, written once for CUDA and HIP.
#![allow(dead_code)]
use collective_core::Error;
use cuda_ipc::cudarc::driver::{CudaContext, CudaStream, sys};
use cuda_ipc::{CudaDevice, FusedTree};
use gpu_conformance::{TestGpu, TreeLaunch};
use std::sync::{Arc, Mutex};

/// A rank of a CUDA test world.
pub type CudaRank = gpu_conformance::GpuRank<Cuda>;

/// The CUDA driver through cudarc, as the shared suite drives it.
#[derive(Debug)]
pub struct Cuda;

/// A device's context, or why it could not be opened.
type Opened = Result<Arc<CudaContext>, String>;

/// Device `ordinal`'s context (opened once per process), or why it cannot be opened.
pub fn open_context(ordinal: usize) -> Opened {
    static OPENED: Mutex<Vec<(usize, Opened)>> = Mutex::new(Vec::new());
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, r)) = opened.iter().find(|(o, _)| *o == ordinal) {
        return r.clone();
    }
    let r = cuda_ipc::driver::open_device(ordinal).map_err(|e| e.to_string()).inspect(|ctx| {
        // SAFETY: every buffer of these tests is used on one stream at a time, and graph
        // capture must not record cudarc's tracking events.
        unsafe { ctx.disable_event_tracking() };
    });
    opened.push((ordinal, r.clone()));
    r
}

impl TestGpu for Cuda {
    type Device = CudaDevice;
    type Stream = Arc<CudaStream>;
    type Tree = FusedTree;

    const RUNTIME: &'static str = "CUDA";
    const REGION_BYTES: usize = 768 << 20;
    const PROCESS_ENV: (&'static str, &'static str) = ("DETCOLL_CUDA_PROCESS_TESTS", "ranks sharing a GPU need MPS");

    fn device_count() -> Result<usize, String> {
        match cuda_ipc::driver::device_count().map_err(|e| e.to_string())? {
            0 => Err("the driver reports 0 devices".into()),
            n => Ok(n),
        }
    }
    fn open(ordinal: usize) -> Result<CudaDevice, String> {
        CudaDevice::new(&open_context(ordinal)?).map_err(|e| e.to_string())
    }
    fn new_stream(device: &CudaDevice) -> Result<Arc<CudaStream>, String> {
        device.context().new_stream().map_err(|e| e.to_string())
    }
    fn synchronize(stream: &Arc<CudaStream>) -> Result<(), String> {
        stream.synchronize().map_err(|e| e.to_string())
    }
    fn upload(stream: &Arc<CudaStream>, dst: u64, data: &[u8]) -> Result<(), String> {
        // Raw driver calls run in the current context: the stream's, whichever thread calls.
        stream.context().bind_to_thread().map_err(|e| format!("bind: {e}"))?;
        // SAFETY: `dst` holds `data.len()` device bytes (the caller's buffer); the host buffer
        // lives until the synchronisation below.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, data.as_ptr().cast(), data.len(), stream.cu_stream()) }
            .result()
            .map_err(|e| format!("cuMemcpyHtoDAsync: {e}"))?;
        Self::synchronize(stream)
    }
    fn download(stream: &Arc<CudaStream>, src: u64, dst: &mut [u8]) -> Result<(), String> {
        stream.context().bind_to_thread().map_err(|e| format!("bind: {e}"))?;
        // SAFETY: as above, in the other direction.
        unsafe { sys::cuMemcpyDtoHAsync_v2(dst.as_mut_ptr().cast(), src, dst.len(), stream.cu_stream()) }
            .result()
            .map_err(|e| format!("cuMemcpyDtoHAsync: {e}"))?;
        Self::synchronize(stream)
    }
    /// Rank `r` on device `r % device_count` (all on GPU 0 on a one-GPU host, under MPS).
    fn process_ordinal(rank: usize) -> Result<usize, String> {
        Ok(rank % Self::device_count()?)
    }
    fn tree(device: &CudaDevice) -> Result<FusedTree, String> {
        device.fused_tree().map_err(|e| e.to_string())
    }
    unsafe fn launch_tree(tree: &FusedTree, l: &TreeLaunch<'_>, stream: &Arc<CudaStream>) -> Result<(), Error> {
        let launch = if l.soft { FusedTree::launch_soft } else { FusedTree::launch };
        // SAFETY: forwarded from the caller; the stream is the tree's context's.
        unsafe { launch(tree, l.inputs, l.out, l.count, l.dtype, stream.cu_stream()) }
    }
}
