//! [`HipDevice`]: the engine's [`Device`] on our runtime-loaded HIP binding — one HIP device,
//! its code object (prebuilt or hiprtc, loaded once), uncached (default) or fine-grained control memory and
//! plain frames, IPC handles, the host-mapped error record, launches, streams and events.
//! Everything above it (the IPC collective, the RCCL transport) is the shared engine's.
//!
//! Nothing of this file has run on an AMD GPU (none was available): see docs/rocm.md.
use crate::BACKEND;
use crate::entry::{Kernels, launch};
use crate::result::{api, check};
use crate::runtime::{self, DeviceMemory, Event, HostMapped, IpcMapping, Stream};
use crate::staging::{ControlMemory, Staging, open_peer};
use crate::sys;
use collective_core::protocol::params::{RankMemory, THREADS, TreeParams};
use collective_core::protocol::status::RECORD_WORDS;
use collective_core::protocol::{Header, Layout};
use collective_core::{DType, Error};
use ipc_engine::{Device, IpcDevice, Launch, RawStream, Vendor};
use std::sync::{Arc, OnceLock};

/// One HIP device as the engine uses it. Cheap to clone: clones share the loaded code object.
#[derive(Debug, Clone)]
pub struct HipDevice {
    ordinal: usize,
    control: ControlMemory,
    kernels: Arc<OnceLock<Arc<Kernels>>>,
}

impl HipDevice {
    /// HIP device `ordinal`. A missing `libamdhip64` is [`Error::LibraryMissing`], a device
    /// that does not exist [`Error::InvalidConfig`], an invalid `DETCOLL_HIP_CONTROL_MEMORY`
    /// [`Error::InvalidConfig`]. The code object is loaded on first use.
    pub fn open(ordinal: usize) -> Result<Self, Error> {
        api()?;
        let control = ControlMemory::from_env()?;
        let n = runtime::device_count()?;
        if ordinal >= n {
            return Err(Error::InvalidConfig { detail: format!("HIP device {ordinal} does not exist ({n} visible)") });
        }
        Ok(HipDevice { ordinal, control, kernels: Arc::default() })
    }

    /// The HIP device ordinal every call runs on.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The memory kind of this device's control blocks.
    pub fn control_memory(&self) -> ControlMemory {
        self.control
    }

    /// The fused tree kernel of this device (W inputs -> 1 output), sharing its code object.
    pub fn fused_tree(&self) -> Result<crate::FusedTree, Error> {
        Ok(crate::FusedTree::from_kernels(self.loaded()?, self.ordinal))
    }

    fn loaded(&self) -> Result<Arc<Kernels>, Error> {
        if let Some(k) = self.kernels.get() {
            return Ok(k.clone());
        }
        let k = Kernels::load(self.ordinal)?;
        Ok(self.kernels.get_or_init(|| k).clone())
    }
}

impl Device for HipDevice {
    type Stream = Stream;
    type Allocation = DeviceMemory;
    type Event = Event;
    const VENDOR: Vendor = Vendor::Amd;
    fn describe(&self) -> String {
        let origin = self.kernels.get().map_or_else(|| "not loaded".to_string(), |k| k.module.origin.clone());
        format!("HIP device {} (code object: {origin})", self.ordinal)
    }
    fn bind(&self) -> Result<(), Error> {
        runtime::set_device(self.ordinal)
    }
    fn raw_stream(&self, stream: &Stream) -> Result<RawStream, Error> {
        if stream.device() != self.ordinal {
            return Err(Error::InvalidConfig {
                detail: format!(
                    "the stream belongs to HIP device {}, this rank runs on {}",
                    stream.device(),
                    self.ordinal
                ),
            });
        }
        Ok(RawStream(stream.raw()))
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceMemory, Error> {
        DeviceMemory::new(self.ordinal, bytes)
    }
    fn address(&self, allocation: &DeviceMemory) -> u64 {
        allocation.ptr()
    }
    fn leak(&self, mut allocation: DeviceMemory) {
        allocation.leak();
    }
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<(), Error> {
        let kind = sys::HIP_MEMCPY_DEVICE_TO_DEVICE;
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
        let p = TreeParams::pack(inputs, out, count, dtype)?;
        let k = self.loaded()?;
        runtime::set_device(self.ordinal)?;
        // SAFETY: `detcoll_tree` takes `DcTreeParams`; addresses and stream: the caller's.
        unsafe { launch(k.tree, k.grid, THREADS, &p, stream.0) }
    }
    fn event(&self) -> Result<Event, Error> {
        Event::untimed(self.ordinal)
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
        runtime::set_device(self.ordinal)?;
        // SAFETY: `stream` is live (caller).
        unsafe { runtime::stream_done(stream.0) }
    }

    fn load_tree(&self) -> Result<(), Error> {
        self.loaded().map(drop)
    }
}

impl IpcDevice for HipDevice {
    type Staging = Staging;
    type PeerMapping = [IpcMapping; 2];
    type Kernels = Kernels;
    type Record = HostMapped;

    const BACKEND: &'static str = BACKEND;
    /// HIP graph capture was never exercised (no AMD GPU was available), so it is not claimed.
    const GRAPH_CAPTURE: bool = false;

    /// From the PCI bus id (the binding reads no UUID): equal for two processes exactly when
    /// they drive the same GPU of one host.
    fn identity(&self) -> Result<[u8; 16], Error> {
        let id = runtime::pci_bus_id(self.ordinal)?;
        let mut out = [0u8; 16];
        for (o, b) in out.iter_mut().zip(id.bytes().filter(|b| b.is_ascii_hexdigit()).rev()) {
            *o = b;
        }
        Ok(out)
    }
    fn multiprocessors(&self) -> Result<usize, Error> {
        runtime::multiprocessors(self.ordinal)
    }
    fn same_device(&self, other: &Self) -> bool {
        self.ordinal == other.ordinal
    }
    fn enable_peer_access(&self, to: &Self) -> Result<(), Error> {
        runtime::enable_peer_access(self.ordinal, to.ordinal)
    }
    fn synchronize(&self) -> Result<(), Error> {
        let api = api()?;
        runtime::set_device(self.ordinal)?;
        // SAFETY: plain call on the current device.
        check(api, unsafe { (api.hipDeviceSynchronize)() }, "hipDeviceSynchronize")
    }
    fn kernels(&self) -> Result<Arc<Kernels>, Error> {
        self.loaded()
    }
    fn kernel_origin(kernels: &Kernels) -> String {
        kernels.module.origin.clone()
    }
    fn grid_limit(kernels: &Kernels) -> u32 {
        kernels.grid
    }
    unsafe fn launch(&self, kernels: &Kernels, params: Launch<'_>, grid: u32, stream: RawStream) -> Result<(), Error> {
        let s = stream.0;
        // SAFETY: each entry point takes exactly the parameter struct it is paired with here;
        // addresses and stream are the caller's contract.
        unsafe {
            match params {
                Launch::Single(p) => launch(kernels.collective_single, grid, THREADS, p, s),
                Launch::Many(p) => launch(kernels.collective_many, grid, THREADS, p, s),
                Launch::Copy(p) => launch(kernels.copy, grid, THREADS, p, s),
            }
        }
    }

    fn alloc_staging(&self, layout: &Layout, header: &Header) -> Result<Staging, Error> {
        runtime::set_device(self.ordinal)?;
        Staging::new(self.ordinal, layout, header, self.control)
    }
    fn staging_memory(staging: &Staging, _layout: &Layout) -> RankMemory {
        staging.memory()
    }
    fn leak_staging(mut staging: Staging) {
        staging.leak();
    }
    fn export_staging(&self, staging: &Staging) -> Result<Vec<u8>, Error> {
        staging.ipc_handles()
    }
    fn import_staging(&self, peer: usize, exported: &[u8]) -> Result<[IpcMapping; 2], Error> {
        runtime::set_device(self.ordinal)?;
        open_peer(peer, exported)
    }
    fn mapping_memory(mapping: &[IpcMapping; 2], _layout: &Layout) -> RankMemory {
        RankMemory { control: mapping[0].ptr(), frames: mapping[1].ptr() }
    }
    fn read_words(&self, src: u64, words: &mut [u64]) -> Result<(), Error> {
        let mut raw = vec![0u8; words.len() * 8];
        runtime::copy_to_host(src, &mut raw)?;
        for (w, c) in words.iter_mut().zip(raw.chunks_exact(8)) {
            *w = u64::from_le_bytes(c.try_into().unwrap_or([0; 8]));
        }
        Ok(())
    }
    fn write_word(&self, dst: u64, value: u64) -> Result<(), Error> {
        runtime::copy_to_device(&value.to_le_bytes(), dst)
    }
    fn error_record(&self) -> Result<HostMapped, Error> {
        runtime::set_device(self.ordinal)?;
        HostMapped::new(RECORD_WORDS)
    }
    fn record_address(record: &HostMapped) -> u64 {
        record.device_ptr()
    }
    fn record_words(record: &HostMapped) -> [u64; RECORD_WORDS] {
        let mut w = [0u64; RECORD_WORDS];
        for (i, x) in w.iter_mut().enumerate() {
            *x = record.read(i);
        }
        w
    }
    fn record_code(record: &HostMapped) -> u64 {
        record.read(0)
    }
}
