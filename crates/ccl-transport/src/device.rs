//! The device side the transport runs on: streams, workspace memory, events, and the local
//! fixed tree kernel.
//!
//! NCCL and RCCL share one API, so everything above this trait is vendor-neutral. The CUDA
//! implementation ([`crate::CudaDevice`], feature `cuda`) uses cudarc and the CUDA twin's fused
//! tree kernel; a HIP implementation plugs in the HIP twin's kernel the same way, so a ROCm
//! build carries no CUDA code.
use crate::loader::Vendor;
use collective_core::{DType, Error};
use core::ffi::c_void;
use core::fmt;

/// A raw stream handle (`CUstream` / `hipStream_t`; null is the legacy default stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawStream(pub *mut c_void);

// SAFETY: a stream handle is an opaque token that may be passed between threads; every use of
// it goes through an unsafe function whose caller vouches for its validity.
unsafe impl Send for RawStream {}
// SAFETY: as above.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// Identity of the stream, for "same stream as last time" checks.
    pub fn key(self) -> usize {
        self.0 as usize
    }
}

/// What the transport needs from a GPU runtime.
///
/// Implementations must make every enqueuing call asynchronous on the given stream and
/// evaluate [`Device::tree`] exactly as the fixed balanced rank tree of `fixed-tree` (the IPC
/// twins' device code), so that every route gives the same bits.
pub trait Device: Send + Sync + fmt::Debug + Sized + 'static {
    /// The safe stream type of `Collective::Stream`.
    type Stream: ?Sized;
    /// An owned device allocation, freed on drop.
    type Allocation: Send + Sync + fmt::Debug;
    /// An event ordering work across streams, destroyed on drop.
    type Event: Send + Sync + fmt::Debug;

    /// The library this device's streams work with.
    const VENDOR: Vendor;

    /// Device and kernel origin, for logs and bench output.
    fn describe(&self) -> String;
    /// The raw handle of `stream`, after checking it belongs to this device's context.
    fn raw_stream(&self, stream: &Self::Stream) -> Result<RawStream, Error>;
    /// Makes this device current on the calling thread (NCCL uses the current device).
    fn bind(&self) -> Result<(), Error>;
    /// Allocates `bytes` of plain device memory (`cuMemAlloc`/`hipMalloc`).
    fn alloc(&self, bytes: usize) -> Result<Self::Allocation, Error>;
    /// Device address of an allocation (at least 256-byte aligned).
    fn address(&self, allocation: &Self::Allocation) -> u64;
    /// Keeps `allocation`'s memory allocated forever (it may still be in use by a kernel that
    /// could not be stopped).
    fn leak(&self, allocation: Self::Allocation);

    /// Enqueues a device-to-device copy of `bytes` bytes.
    ///
    /// # Safety
    /// Both ranges are device memory of this device, valid until `stream` has executed the
    /// copy; they do not overlap; `stream` is a live stream of this device.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<(), Error>;

    /// Enqueues `out[i] = tree(inputs[0][i], ..., inputs[W-1][i])` for `i < count`, `W =
    /// inputs.len()` in {1, 2, 4, 8}, in `dtype`'s own arithmetic.
    ///
    /// # Safety
    /// Every input holds `count` readable and `out` `count` writable elements of `dtype`,
    /// device memory valid until `stream` has executed the kernel; `out` overlaps no input;
    /// `stream` is a live stream of this device.
    unsafe fn tree(&self, inputs: &[u64], out: u64, count: usize, dtype: DType, stream: RawStream)
    -> Result<(), Error>;

    /// A new event.
    fn event(&self) -> Result<Self::Event, Error>;
    /// Records `event` at the current end of `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn record(&self, event: &Self::Event, stream: RawStream) -> Result<(), Error>;
    /// Makes later work on `stream` wait for `event`'s last recording.
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn wait_event(&self, stream: RawStream, event: &Self::Event) -> Result<(), Error>;
    /// Whether the work before `event`'s last recording has completed (never blocks).
    fn event_done(&self, event: &Self::Event) -> Result<bool, Error>;
    /// Whether every operation enqueued on `stream` so far has completed (never blocks).
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn stream_done(&self, stream: RawStream) -> Result<bool, Error>;

    /// The tree over `world` inputs stacked rank-major `stride` bytes apart from `first` —
    /// the layout an all_gather leaves in the workspace. This is exactly what the transport
    /// launches after each gather.
    ///
    /// # Safety
    /// As [`Device::tree`] for inputs `first + q * stride`, `q < world`.
    #[allow(clippy::too_many_arguments)] // the kernel's parameters, one for one
    unsafe fn tree_stacked(
        &self,
        first: u64,
        stride: usize,
        world: usize,
        out: u64,
        count: usize,
        dtype: DType,
        stream: RawStream,
    ) -> Result<(), Error> {
        if world == 0 || world > 8 {
            return Err(Error::UnsupportedWorldSize { world });
        }
        let mut inputs = [0u64; 8];
        for (q, x) in inputs.iter_mut().enumerate().take(world) {
            *x = first + (q * stride) as u64;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.tree(&inputs[..world], out, count, dtype, stream) }
    }
}
