//! [`CudaDevice`]: the engine's [`Device`] on cudarc — one CUDA context, its kernels (loaded
//! once, prebuilt or NVRTC), plain and IPC memory, the host-mapped error record, launches,
//! streams and events. Everything above it (the IPC collective, the NCCL transport) is the
//! shared engine's.
use crate::driver::{self, BACKEND, check};
use crate::kernels::{Module, Worlds};
use crate::launch::{self, THREADS};
use crate::memory::{self, ErrorRecord, IpcMapping, Staging};
use crate::tree::FusedTree;
use collective_core::{DType, Error};
use cudarc::driver::{CudaContext, CudaStream, sys};
use detcoll_protocol::params::{RankMemory, TreeParams};
use detcoll_protocol::status::RECORD_WORDS;
use detcoll_protocol::{Header, Layout};
use ipc_engine::{Device, IpcDevice, Launch, RawStream, Vendor};
use std::sync::{Arc, Mutex};

/// One CUDA context (one GPU) as the engine uses it. Cheap to clone: clones share the context
/// and the loaded kernels.
#[derive(Debug, Clone)]
pub struct CudaDevice {
    ctx: Arc<CudaContext>,
    /// The kernel modules loaded so far: one per world size compiled at run time, or a
    /// prebuilt image for the worlds its ABI table names ([`crate::kernels::Worlds`]).
    kernels: Arc<Mutex<Vec<Arc<Module>>>>,
}

impl CudaDevice {
    /// The device of `ctx` (the engine's context: pass your own to share it). The kernels are
    /// loaded on first use. A missing driver is [`Error::LibraryMissing`].
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, Error> {
        driver::ensure_driver()?;
        Ok(CudaDevice { ctx: ctx.clone(), kernels: Arc::default() })
    }

    /// The primary context of device `ordinal`.
    pub fn open(ordinal: usize) -> Result<Self, Error> {
        Self::new(&driver::open_device(ordinal)?)
    }

    /// The context every call runs in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// The fused tree kernel of this device (W inputs -> 1 output), sharing its kernels.
    pub fn fused_tree(&self) -> Result<FusedTree, Error> {
        FusedTree::from_device(self.clone())
    }

    /// The kernels that run launches of `world` ranks: a module already loaded for it, else one
    /// loaded now (compiled for `world` alone when no prebuilt image exists). Concurrent first
    /// users of one device wait for one load.
    pub(crate) fn module(&self, world: usize) -> Result<Arc<Module>, Error> {
        let mut loaded = self
            .kernels
            .lock()
            .map_err(|_| Error::Backend { backend: BACKEND, detail: "kernel module lock poisoned".into() })?;
        if let Some(m) = loaded.iter().find(|m| m.has_world(world)) {
            return Ok(m.clone());
        }
        let m = Module::load(&self.ctx, Worlds::for_world(world)?)?;
        loaded.push(m.clone());
        Ok(m)
    }
}

fn ready(r: sys::CUresult, what: &str) -> Result<bool, Error> {
    match r {
        sys::CUresult::CUDA_SUCCESS => Ok(true),
        sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        other => check(other, what).map(|()| false),
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
        if driver::bind(&self.ctx).is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context; its user (the transport's
            // workspace) frees it only after the event recorded after its last use completed.
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
// SAFETY: as above; users serialise record/wait on one event.
unsafe impl Sync for CudaEvent {}

impl Drop for CudaEvent {
    fn drop(&mut self) {
        if driver::bind(&self.ctx).is_ok() {
            // SAFETY: created by cuEventCreate, destroyed once.
            let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
        }
    }
}

impl Device for CudaDevice {
    type Stream = CudaStream;
    type Allocation = CudaAllocation;
    type Event = CudaEvent;
    const VENDOR: Vendor = Vendor::Nvidia;
    fn describe(&self) -> String {
        let origins: Vec<String> =
            self.kernels.lock().map(|l| l.iter().map(|m| m.origin().to_string()).collect()).unwrap_or_default();
        let origin = if origins.is_empty() { "not loaded".to_string() } else { origins.join("; ") };
        format!("CUDA device {} (kernels: {origin})", self.ctx.ordinal())
    }
    fn bind(&self) -> Result<(), Error> {
        driver::bind(&self.ctx)
    }
    fn raw_stream(&self, stream: &CudaStream) -> Result<RawStream, Error> {
        if stream.context().cu_ctx() != self.ctx.cu_ctx() {
            return Err(Error::InvalidConfig {
                detail: "the stream belongs to another CUDA context than this rank".into(),
            });
        }
        Ok(RawStream(stream.cu_stream().cast()))
    }

    fn alloc(&self, bytes: usize) -> Result<CudaAllocation, Error> {
        driver::bind(&self.ctx)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; the context is current.
        let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes.max(1)) };
        check(r, &format!("cuMemAlloc of {bytes} bytes"))?;
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
        check(unsafe { sys::cuMemcpyDtoDAsync_v2(dst, src, bytes, stream.0.cast()) }, "cuMemcpyDtoDAsync")
    }
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, bytes: usize, stream: RawStream) -> Result<(), Error> {
        driver::bind(&self.ctx)?;
        // SAFETY: `src` device memory of this context and `dst` host memory, both valid for
        // `bytes` bytes until the stream ran the copy; `stream` is live (the caller's contract).
        let r = unsafe { sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, bytes, stream.0.cast()) };
        check(r, &format!("cuMemcpyDtoHAsync of {bytes} bytes"))
    }
    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, bytes: usize, stream: RawStream) -> Result<(), Error> {
        driver::bind(&self.ctx)?;
        // SAFETY: as above, the other way (the caller's contract).
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), bytes, stream.0.cast()) };
        check(r, &format!("cuMemcpyHtoDAsync of {bytes} bytes"))
    }
    unsafe fn tree(
        &self,
        inputs: &[u64],
        out: u64,
        count: usize,
        dtype: DType,
        stream: RawStream,
    ) -> Result<(), Error> {
        let p = TreeParams::pack(inputs, out, count, dtype)?;
        let m = self.module(inputs.len())?;
        driver::bind(&self.ctx)?;
        // SAFETY: `detcoll_tree` takes `DcTreeParams`; addresses and stream: the caller's.
        unsafe { launch::launch(m.tree, m.tree_grid, THREADS, &p, stream.0.cast()) }
    }
    fn event(&self) -> Result<CudaEvent, Error> {
        driver::bind(&self.ctx)?;
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
        driver::bind(&self.ctx)?;
        // SAFETY: a live event of this context.
        ready(unsafe { sys::cuEventQuery(event.event) }, "cuEventQuery")
    }
    unsafe fn stream_done(&self, stream: RawStream) -> Result<bool, Error> {
        driver::bind(&self.ctx)?;
        // SAFETY: `stream` is live (caller).
        ready(unsafe { sys::cuStreamQuery(stream.0.cast()) }, "cuStreamQuery")
    }
    unsafe fn is_capturing(&self, stream: RawStream) -> Result<bool, Error> {
        driver::bind(&self.ctx)?;
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `stream` is live (caller); out-pointer to a local.
        check(unsafe { sys::cuStreamIsCapturing(stream.0.cast(), &mut status) }, "cuStreamIsCapturing")?;
        Ok(status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
    unsafe fn synchronize_stream(&self, stream: RawStream) -> Result<(), Error> {
        driver::bind(&self.ctx)?;
        // SAFETY: `stream` is live (caller).
        check(unsafe { sys::cuStreamSynchronize(stream.0.cast()) }, "cuStreamSynchronize")
    }

    fn load_tree(&self, world: usize) -> Result<(), Error> {
        self.module(world).map(drop)
    }
}

impl IpcDevice for CudaDevice {
    type Staging = Staging;
    type PeerMapping = IpcMapping;
    type Kernels = Module;
    type Record = ErrorRecord;

    const BACKEND: &'static str = BACKEND;
    const GRAPH_CAPTURE: bool = true;
    const NORM_READS_GATHERED: bool = true;
    const NORM_ROW_LOOP: bool = true;

    fn identity(&self) -> Result<[u8; 16], Error> {
        driver::uuid(&self.ctx)
    }
    fn multiprocessors(&self) -> Result<usize, Error> {
        driver::multiprocessors(&self.ctx)
    }
    fn same_device(&self, other: &Self) -> bool {
        self.ctx.cu_ctx() == other.ctx.cu_ctx()
    }
    fn enable_peer_access(&self, to: &Self) -> Result<(), Error> {
        if self.ctx.cu_device() == to.ctx.cu_device() {
            return Ok(());
        }
        let mut can = 0i32;
        // SAFETY: out-pointer to a local; valid device handles.
        let r = unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.ctx.cu_device(), to.ctx.cu_device()) };
        check(r, "cuDeviceCanAccessPeer")?;
        if can == 0 {
            return Err(Error::InvalidConfig {
                detail: format!(
                    "device {} cannot access device {} (no peer access): in-process IPC needs it",
                    self.ctx.ordinal(),
                    to.ctx.ordinal()
                ),
            });
        }
        driver::bind(&self.ctx)?;
        // SAFETY: `to` is a live context; flags must be 0.
        let r = unsafe { sys::cuCtxEnablePeerAccess(to.ctx.cu_ctx(), 0) };
        if r == sys::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
            return Ok(());
        }
        check(r, "cuCtxEnablePeerAccess")
    }
    fn synchronize(&self) -> Result<(), Error> {
        driver::synchronize(&self.ctx)
    }
    fn kernels(&self, world: usize) -> Result<Arc<Module>, Error> {
        self.module(world)
    }
    fn kernel_origin(kernels: &Module) -> String {
        kernels.origin().to_string()
    }
    fn grid_limit(kernels: &Module) -> u32 {
        kernels.tree_grid
    }
    unsafe fn launch(&self, kernels: &Module, params: Launch<'_>, grid: u32, stream: RawStream) -> Result<(), Error> {
        let s = stream.0.cast();
        // Every collective launch is programmatic where the device allows it
        // (crate::programmatic, which says why every grid may be); the collective kernels wait
        // for their dependencies first. The copy kernel is not (it does not wait).
        let pdl = kernels.programmatic.as_ref();
        // SAFETY: each entry point takes exactly the parameter struct it is paired with here;
        // addresses and stream are the caller's contract; the collective entry points begin
        // with `griddepcontrol.wait` (dc_collective), as a programmatic launch requires.
        unsafe {
            match params {
                Launch::Single(p) => launch::launch_with(pdl, kernels.collective_single, grid, THREADS, p, s),
                Launch::Many(p) => launch::launch_with(pdl, kernels.collective_many, grid, THREADS, p, s),
                Launch::Copy(p) => launch::launch(kernels.copy, grid, THREADS, p, s),
                Launch::SingleNorm { params, .. } => {
                    launch::launch_with(pdl, kernels.collective_norm, grid, THREADS, params, s)
                }
            }
        }
    }

    fn alloc_staging(&self, layout: &Layout, header: &Header) -> Result<Staging, Error> {
        Staging::new(&self.ctx, layout, header)
    }
    /// One allocation: CUDA's system-scope atomics are coherent on any device memory, so the
    /// control block and the frames are not split.
    fn staging_memory(staging: &Staging, layout: &Layout) -> RankMemory {
        RankMemory::one_allocation(layout, staging.ptr())
    }
    fn leak_staging(mut staging: Staging) {
        staging.leak();
    }
    fn export_staging(&self, staging: &Staging) -> Result<Vec<u8>, Error> {
        Ok(staging.ipc_handle()?.to_vec())
    }
    fn import_staging(&self, _peer: usize, exported: &[u8]) -> Result<IpcMapping, Error> {
        IpcMapping::open(&self.ctx, exported)
    }
    fn mapping_memory(mapping: &IpcMapping, layout: &Layout) -> RankMemory {
        RankMemory::one_allocation(layout, mapping.ptr())
    }
    fn read_words(&self, src: u64, words: &mut [u64]) -> Result<(), Error> {
        memory::read_words(&self.ctx, src, words)
    }
    fn write_word(&self, dst: u64, value: u64) -> Result<(), Error> {
        memory::write_word(&self.ctx, dst, value)
    }
    fn error_record(&self) -> Result<ErrorRecord, Error> {
        ErrorRecord::new(&self.ctx)
    }
    fn record_address(record: &ErrorRecord) -> u64 {
        record.device_ptr()
    }
    fn record_words(record: &ErrorRecord) -> [u64; RECORD_WORDS] {
        record.words()
    }
    fn record_code(record: &ErrorRecord) -> u64 {
        record.code()
    }
}
