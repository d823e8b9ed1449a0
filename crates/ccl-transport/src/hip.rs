//! The AMD device side: hip-ipc streams, memory and events, and the HIP twin's fused tree
//! kernel (`hip_ipc::FusedTree`: W stacked inputs -> 1 output, the `detcoll_tree` device code
//! the IPC twins run). The kernel is reused, never copied, so the RCCL transport's reductions
//! are the IPC route's bits by construction.
//!
//! Compiled and unit-tested without a GPU; nothing of it has run on an AMD GPU (none was
//! available): see docs/rocm.md.
use crate::collective::TransportCollective;
use crate::config::TransportConfig;
use crate::device::{Device, RawStream};
use crate::loader::Vendor;
use collective_core::bootstrap::Bootstrap;
use collective_core::{DType, Error};
use hip_ipc::runtime::{self, DeviceMemory, Event};
use hip_ipc::{FusedTree, Stream};

/// One HIP device and the fused tree kernel loaded on it. Cheap to clone (the loaded code
/// object is shared).
#[derive(Debug, Clone)]
pub struct HipDevice {
    tree: FusedTree,
}

impl HipDevice {
    /// The device side on HIP device `ordinal`: loads the code object for its arch (see
    /// `hip_ipc::kernels`). A missing `libamdhip64` is [`Error::LibraryMissing`].
    pub fn open(ordinal: usize) -> Result<Self, Error> {
        Ok(HipDevice { tree: FusedTree::load(ordinal)? })
    }

    /// The device side over an already loaded tree kernel (its device).
    pub fn new(tree: &FusedTree) -> Self {
        HipDevice { tree: tree.clone() }
    }

    /// The HIP device ordinal every call runs on.
    pub fn ordinal(&self) -> usize {
        self.tree.device()
    }

    /// The fused tree kernel (the HIP IPC twin's device code).
    pub fn fused_tree(&self) -> &FusedTree {
        &self.tree
    }
}

impl Device for HipDevice {
    type Stream = Stream;
    type Allocation = DeviceMemory;
    type Event = Event;

    const VENDOR: Vendor = Vendor::Amd;

    fn describe(&self) -> String {
        format!("HIP device {} (tree kernel: {})", self.ordinal(), self.tree.origin())
    }

    fn raw_stream(&self, stream: &Stream) -> Result<RawStream, Error> {
        if stream.device() != self.ordinal() {
            return Err(Error::InvalidConfig {
                detail: format!(
                    "the stream belongs to HIP device {}, this rank runs on {}",
                    stream.device(),
                    self.ordinal()
                ),
            });
        }
        Ok(RawStream(stream.raw()))
    }

    fn bind(&self) -> Result<(), Error> {
        runtime::set_device(self.ordinal())
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceMemory, Error> {
        // `hipMalloc` (zeroed once at growth; the workspace grows with a host wait anyway).
        DeviceMemory::new(self.ordinal(), bytes)
    }

    fn address(&self, allocation: &DeviceMemory) -> u64 {
        allocation.ptr()
    }

    fn leak(&self, mut allocation: DeviceMemory) {
        allocation.leak();
    }

    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<(), Error> {
        let kind = hip_ipc::sys::HIP_MEMCPY_DEVICE_TO_DEVICE;
        // SAFETY: forwarded from the caller.
        unsafe { runtime::memcpy_async(dst as *mut _, src as *const _, bytes, kind, stream.0) }
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
        unsafe { self.tree.launch(inputs, out, count, dtype, stream.0) }
    }

    fn event(&self) -> Result<Event, Error> {
        Event::untimed(self.ordinal())
    }

    unsafe fn record(&self, event: &Event, stream: RawStream) -> Result<(), Error> {
        // SAFETY: a live event of this device; `stream` is live (caller).
        unsafe { event.record_raw(stream.0) }
    }

    unsafe fn wait_event(&self, stream: RawStream, event: &Event) -> Result<(), Error> {
        // SAFETY: as above.
        unsafe { event.block(stream.0) }
    }

    fn event_done(&self, event: &Event) -> Result<bool, Error> {
        event.is_done()
    }

    unsafe fn stream_done(&self, stream: RawStream) -> Result<bool, Error> {
        self.bind()?;
        // SAFETY: `stream` is live (caller).
        unsafe { runtime::stream_done(stream.0) }
    }
}

impl TransportCollective<HipDevice> {
    /// This rank's collective over the tree kernel already loaded on its device (RCCL).
    /// Collective over `boot`; see [`TransportCollective::with_device`].
    pub fn new_hip(tree: &FusedTree, boot: &dyn Bootstrap, config: &TransportConfig) -> Result<Self, Error> {
        Self::with_device(|| Ok(HipDevice::new(tree)), boot, config)
    }

    /// This rank's collective on HIP device `ordinal` (RCCL). Without `libamdhip64` or
    /// `librccl` every rank gets [`Error::LibraryMissing`] (or the agreement's error naming the
    /// rank that lacks it), never a panic.
    pub fn open_hip(ordinal: usize, boot: &dyn Bootstrap, config: &TransportConfig) -> Result<Self, Error> {
        Self::with_device(|| HipDevice::open(ordinal), boot, config)
    }
}
