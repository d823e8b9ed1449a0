//! Device memory for the protocol: one staging + control allocation per rank, the host-mapped
//! error record, and CUDA IPC handles.
//!
//! The staging allocation comes from plain `cuMemAlloc`: IPC handles cannot be taken on
//! stream-ordered (pool) allocations.
use crate::driver::{self, check};
use collective_core::Error;
use cudarc::driver::{CudaContext, sys};
use detcoll_protocol::{Header, Layout};
use std::sync::Arc;

/// One rank's control block + two staging frames, zeroed, header written. Freed on drop.
#[derive(Debug)]
pub struct Staging {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
    bytes: usize,
    /// Set when close could not prove every peer finished reading: the memory is leaked rather
    /// than freed under a peer that might still read it.
    leak: bool,
}

impl Staging {
    /// Allocates `layout.total_bytes()` on `ctx`'s device and initialises the control block.
    pub(crate) fn new(ctx: &Arc<CudaContext>, layout: &Layout, header: &Header) -> Result<Self, Error> {
        driver::bind(ctx)?;
        let bytes = layout.total_bytes();
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; the context is current.
        check(unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) }, "cuMemAlloc (staging)")?;
        let me = Staging { ctx: ctx.clone(), ptr, bytes, leak: false };
        // SAFETY: `ptr..ptr+bytes` was just allocated.
        check(unsafe { sys::cuMemsetD8_v2(ptr, 0, bytes) }, "cuMemsetD8 (staging)")?;
        let words = header.to_words();
        // SAFETY: the header line lies inside the allocation; `words` is a live host array.
        let r =
            unsafe { sys::cuMemcpyHtoD_v2(ptr + layout.header() as u64, words.as_ptr().cast(), size_of_val(&words)) };
        check(r, "cuMemcpyHtoD (header)")?;
        Ok(me)
    }

    /// Device address of the allocation.
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Keeps the memory allocated forever (see the field doc).
    pub(crate) fn leak(&mut self) {
        self.leak = true;
    }

    /// The IPC handle other processes open to map this allocation.
    pub(crate) fn ipc_handle(&self) -> Result<[u8; 64], Error> {
        driver::bind(&self.ctx)?;
        // SAFETY: CUipcMemHandle is plain bytes; zero is a valid value to be overwritten.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        // SAFETY: `self.ptr` is the base of a cuMemAlloc allocation.
        check(unsafe { sys::cuIpcGetMemHandle(&mut h, self.ptr) }, "cuIpcGetMemHandle")?;
        let mut out = [0u8; 64];
        for (o, b) in out.iter_mut().zip(h.reserved.iter()) {
            *o = *b as u8;
        }
        Ok(out)
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if self.leak || self.ptr == 0 {
            return;
        }
        if driver::bind(&self.ctx).is_ok() {
            // SAFETY: allocated by cuMemAlloc in this context; every user has finished with it
            // (close synchronised the context and collected the peers' acknowledgements).
            let _ = unsafe { sys::cuMemFree_v2(self.ptr) };
        }
        let _ = self.bytes;
    }
}

/// A peer's allocation mapped into this process through its IPC handle. Unmapped on drop.
#[derive(Debug)]
pub struct IpcMapping {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl IpcMapping {
    /// Opens `handle` (from a peer process) in `ctx`.
    pub(crate) fn open(ctx: &Arc<CudaContext>, handle: &[u8]) -> Result<Self, Error> {
        driver::bind(ctx)?;
        // SAFETY: plain bytes.
        let mut h: sys::CUipcMemHandle = unsafe { std::mem::zeroed() };
        if handle.len() != h.reserved.len() {
            return Err(Error::Backend {
                backend: driver::BACKEND,
                detail: format!("an IPC handle has {} bytes, expected {}", handle.len(), h.reserved.len()),
            });
        }
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as _;
        }
        let mut ptr: sys::CUdeviceptr = 0;
        let flags = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: out-pointer to a local; the handle bytes came from cuIpcGetMemHandle of a peer.
        check(unsafe { sys::cuIpcOpenMemHandle_v2(&mut ptr, h, flags) }, "cuIpcOpenMemHandle")?;
        Ok(IpcMapping { ctx: ctx.clone(), ptr })
    }

    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if driver::bind(&self.ctx).is_ok() {
            // SAFETY: opened by cuIpcOpenMemHandle in this context, no kernel uses it any more.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.ptr) };
        }
    }
}

/// Words of the error record a kernel writes on failure (see kernels/detcoll_protocol.h).
pub(crate) use detcoll_protocol::status::RECORD_WORDS;

/// Pinned host memory the device writes failures into (`cuMemHostAlloc(DEVICEMAP)`): the host
/// reads it with a plain volatile load on every call, no driver round trip.
#[derive(Debug)]
pub struct ErrorRecord {
    ctx: Arc<CudaContext>,
    host: *mut u64,
    dev: sys::CUdeviceptr,
}

// SAFETY: the record is pinned host memory; the host only reads it with volatile loads and the
// pointer stays valid until drop.
unsafe impl Send for ErrorRecord {}
// SAFETY: as above: shared access is read-only (volatile) on the host side.
unsafe impl Sync for ErrorRecord {}

impl ErrorRecord {
    pub(crate) fn new(ctx: &Arc<CudaContext>) -> Result<Self, Error> {
        driver::bind(ctx)?;
        let mut host: *mut core::ffi::c_void = core::ptr::null_mut();
        let bytes = RECORD_WORDS * 8;
        let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
        // SAFETY: out-pointer to a local.
        check(unsafe { sys::cuMemHostAlloc(&mut host, bytes, flags) }, "cuMemHostAlloc (error record)")?;
        let host = host.cast::<u64>();
        // SAFETY: `host` points to `bytes` bytes of pinned, 8-byte aligned memory.
        unsafe { core::ptr::write_bytes(host, 0, RECORD_WORDS) };
        let mut dev: sys::CUdeviceptr = 0;
        // SAFETY: `host` is a DEVICEMAP allocation of this context.
        let r = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host.cast(), 0) };
        let rec = ErrorRecord { ctx: ctx.clone(), host, dev };
        check(r, "cuMemHostGetDevicePointer")?;
        Ok(rec)
    }

    /// Device address kernels write to.
    pub(crate) fn device_ptr(&self) -> u64 {
        self.dev
    }

    /// The record as the host sees it now (code first: zero means healthy).
    #[inline]
    pub(crate) fn code(&self) -> u64 {
        // SAFETY: valid pinned memory for the lifetime of `self`; volatile because the device
        // writes it concurrently.
        unsafe { core::ptr::read_volatile(self.host) }
    }

    /// All words (call after [`ErrorRecord::code`] returned nonzero: the kernel wrote the other
    /// words before the code, with system fences in between).
    pub(crate) fn words(&self) -> [u64; RECORD_WORDS] {
        let mut w = [0u64; RECORD_WORDS];
        for (i, x) in w.iter_mut().enumerate() {
            // SAFETY: in bounds of the record.
            *x = unsafe { core::ptr::read_volatile(self.host.add(i)) };
        }
        w
    }
}

impl Drop for ErrorRecord {
    fn drop(&mut self) {
        if driver::bind(&self.ctx).is_ok() {
            // SAFETY: allocated by cuMemHostAlloc; no kernel of this rank is running any more.
            let _ = unsafe { sys::cuMemFreeHost(self.host.cast()) };
        }
    }
}

/// Copies `words.len()` u64 from device address `src` (synchronous).
pub(crate) fn read_words(ctx: &CudaContext, src: u64, words: &mut [u64]) -> Result<(), Error> {
    driver::bind(ctx)?;
    // SAFETY: the caller passes a device range of at least `words.len() * 8` bytes.
    check(unsafe { sys::cuMemcpyDtoH_v2(words.as_mut_ptr().cast(), src, size_of_val(words)) }, "cuMemcpyDtoH")
}

/// Writes one u64 to device address `dst` (synchronous).
pub(crate) fn write_word(ctx: &CudaContext, dst: u64, value: u64) -> Result<(), Error> {
    driver::bind(ctx)?;
    // SAFETY: the caller passes a device address of at least 8 writable bytes.
    check(unsafe { sys::cuMemcpyHtoD_v2(dst, (&value as *const u64).cast(), 8) }, "cuMemcpyHtoD")
}
