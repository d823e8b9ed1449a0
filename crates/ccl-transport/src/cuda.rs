//! The NVIDIA device side: cudarc streams and memory, and the CUDA twin's fused tree kernel
//! (`cuda_ipc::FusedTree`: W stacked inputs -> 1 output). The kernel is reused, never copied,
//! so the transport's reductions are the IPC route's bits by construction.
use crate::collective::TransportCollective;
use crate::config::TransportConfig;
use crate::device::{Device, RawStream};
use crate::error::BACKEND;
use crate::loader::Vendor;
use collective_core::bootstrap::Bootstrap;
use collective_core::{DType, Error};
use cuda_ipc::FusedTree;
use cuda_ipc::cudarc::driver::{CudaContext, CudaStream, sys};
use std::sync::Arc;

fn check(r: sys::CUresult, what: &str) -> Result<(), Error> {
    r.result().map_err(|e| Error::Backend { backend: BACKEND, detail: format!("{what}: {e}") })
}

/// `Ok(true)` for success, `Ok(false)` for "not ready", an error otherwise.
fn ready(r: sys::CUresult, what: &str) -> Result<bool, Error> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => check(other, what).map(|()| false),
    }
}

/// One CUDA device context and the fused tree kernel loaded into it.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    tree: FusedTree,
}

impl CudaDevice {
    /// The device side on `ctx`: loads the fused tree kernel (prebuilt or NVRTC, see
    /// `cuda_ipc::kernels`). A missing driver or NVRTC is [`Error::LibraryMissing`].
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, Error> {
        cuda_ipc::driver::ensure_driver()?;
        Ok(CudaDevice { ctx: ctx.clone(), tree: FusedTree::new(ctx)? })
    }

    /// The device side on the primary context of device `ordinal`.
    pub fn open(ordinal: usize) -> Result<Self, Error> {
        let ctx = cuda_ipc::driver::open_device(ordinal)?;
        Self::new(&ctx)
    }

    /// The context every call runs in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The fused tree kernel (shared with the CUDA IPC twin).
    pub fn fused_tree(&self) -> &FusedTree {
        &self.tree
    }
}

/// A `cuMemAlloc` allocation, freed on drop.
#[derive(Debug)]
pub struct CudaAllocation {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl Drop for CudaAllocation {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context; the workspace frees it only
            // after the event recorded after its last use completed.
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
    }
}

/// A CUDA event without timing, destroyed on drop.
#[derive(Debug)]
pub struct CudaEvent {
    ctx: Arc<CudaContext>,
    event: sys::CUevent,
}

// SAFETY: CUDA events may be recorded, waited on and queried from any thread.
unsafe impl Send for CudaEvent {}
// SAFETY: as above; the workspace serialises record/wait under the collective's lock.
unsafe impl Sync for CudaEvent {}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: created by cuEventCreate, destroyed once.
            let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
        }
    }
}

impl CudaDevice {
    fn bound(&self) -> Result<(), Error> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::Backend { backend: BACKEND, detail: format!("binding the CUDA context: {e}") })
    }
}

impl Device for CudaDevice {
    type Stream = CudaStream;
    type Allocation = CudaAllocation;
    type Event = CudaEvent;

    const VENDOR: Vendor = Vendor::Nvidia;

    fn describe(&self) -> String {
        format!("CUDA device {} (tree kernel: {})", self.ctx.ordinal(), self.tree.origin())
    }

    fn raw_stream(&self, stream: &CudaStream) -> Result<RawStream, Error> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::InvalidConfig {
                detail: "the stream belongs to another CUDA context than this rank".into(),
            });
        }
        Ok(RawStream(stream.cu_stream().cast()))
    }

    fn bind(&self) -> Result<(), Error> {
        self.bound()
    }

    fn alloc(&self, bytes: usize) -> Result<CudaAllocation, Error> {
        self.bound()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; the context is current.
        let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) };
        check(r, &format!("cuMemAlloc of the {bytes}-byte transport workspace"))?;
        Ok(CudaAllocation { ctx: self.ctx.clone(), ptr })
    }

    fn address(&self, allocation: &CudaAllocation) -> u64 {
        allocation.ptr
    }

    fn leak(&self, allocation: CudaAllocation) {
        std::mem::forget(allocation);
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        check(
            unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.0.cast()) },
            "cuMemcpyDtoDAsync (transport pack)",
        )
    }

    unsafe fn tree(
        &self,
        inputs: &[u64],
        out: u64,
        count: usize,
        dtype: DType,
        stream: RawStream,
    ) -> Result<(), Error> {
        // SAFETY: forwarded from the caller (same contract as `FusedTree::launch`).
        unsafe { self.tree.launch(inputs, out, count, dtype, stream.0.cast()) }
    }

    fn event(&self) -> Result<CudaEvent, Error> {
        self.bound()?;
        let mut event: sys::CUevent = core::ptr::null_mut();
        let flags = sys::CUevent_flags_enum::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: out-pointer to a local; the context is current.
        check(unsafe { sys::cuEventCreate(&mut event, flags) }, "cuEventCreate")?;
        Ok(CudaEvent { ctx: self.ctx.clone(), event })
    }

    unsafe fn record(&self, event: &CudaEvent, stream: RawStream) -> Result<(), Error> {
        // SAFETY: a live event of this context; `stream` is live (caller).
        check(unsafe { sys::cuEventRecord(event.event, stream.0.cast()) }, "cuEventRecord")
    }

    unsafe fn wait_event(&self, stream: RawStream, event: &CudaEvent) -> Result<(), Error> {
        // SAFETY: as above.
        check(unsafe { sys::cuStreamWaitEvent(stream.0.cast(), event.event, 0) }, "cuStreamWaitEvent")
    }

    fn event_done(&self, event: &CudaEvent) -> Result<bool, Error> {
        self.bound()?;
        // SAFETY: a live event of this context.
        ready(unsafe { sys::cuEventQuery(event.event) }, "cuEventQuery")
    }

    unsafe fn stream_done(&self, stream: RawStream) -> Result<bool, Error> {
        self.bound()?;
        // SAFETY: `stream` is live (caller).
        ready(unsafe { sys::cuStreamQuery(stream.0.cast()) }, "cuStreamQuery")
    }
}

impl TransportCollective<CudaDevice> {
    /// This rank's collective on the CUDA context `ctx` (NCCL). Collective over `boot`; see
    /// [`TransportCollective::with_device`].
    pub fn new_cuda(ctx: &Arc<CudaContext>, boot: &dyn Bootstrap, config: &TransportConfig) -> Result<Self, Error> {
        Self::with_device(|| CudaDevice::new(ctx), boot, config)
    }

    /// This rank's collective on CUDA device `ordinal`'s primary context (NCCL).
    pub fn open_cuda(ordinal: usize, boot: &dyn Bootstrap, config: &TransportConfig) -> Result<Self, Error> {
        Self::with_device(|| CudaDevice::open(ordinal), boot, config)
    }
}
