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
use collective_core::{DType, Error};
use detcoll_protocol::params::{RankMemory, THREADS, TreeParams};
use detcoll_protocol::status::RECORD_WORDS;
use detcoll_protocol::{Header, Layout};
use ipc_engine::{Device, IpcDevice, Launch, RawStream, Vendor};
use std::sync::{Arc, Once, OnceLock};
use std::time::Duration;

/// The `s_memrealtime` rate assumed when `hipDeviceAttributeWallClockRate` reads 0 (or less):
/// 100 MHz, gfx942's rate (MI200's is 25 MHz; gfx950's is unpublished). It is the fastest
/// rate we know of, so on a slower clock a wait lasts longer than asked (by 4x at 25 MHz)
/// but stays bounded: never a spurious timeout.
pub const FALLBACK_WALL_CLOCK_KHZ: u64 = 100_000;

/// The kernels' wait bound for `timeout` on a device whose `s_memrealtime` ticks at
/// `rate_khz` kHz (`hipDeviceAttributeWallClockRate`): `timeout` x rate, in ticks, saturating
/// at `u64::MAX`. A rate of 0 or less (the attribute unset) takes
/// [`FALLBACK_WALL_CLOCK_KHZ`]; the second value says whether it did.
pub fn wait_ticks(timeout: Duration, rate_khz: i64) -> (u64, bool) {
    let (khz, fallback) = match u64::try_from(rate_khz) {
        Ok(k) if k > 0 => (k, false),
        _ => (FALLBACK_WALL_CLOCK_KHZ, true),
    };
    // kHz = 1000 ticks per second = 1 tick per 10^6 ns.
    let ticks = timeout.as_nanos().saturating_mul(u128::from(khz)) / 1_000_000;
    (u64::try_from(ticks).unwrap_or(u64::MAX), fallback)
}

/// The rate of a clock that advanced `ticks` while the host clock advanced `elapsed`, in kHz;
/// `None` for a reading no real clock gives (not advancing, or faster than 10 GHz).
pub fn khz_from_samples(ticks: u64, elapsed: Duration) -> Option<u64> {
    let ns = elapsed.as_nanos();
    if ns == 0 || ticks == 0 {
        return None;
    }
    // ticks per ms = kHz.
    let khz = u128::from(ticks).saturating_mul(1_000_000) / ns;
    (1..=10_000_000).contains(&khz).then_some(khz as u64)
}

/// `DcClockParams` (kernels/detcoll_hip.hip).
#[repr(C)]
struct ClockParams {
    out: u64,
}

const _: () = assert!(size_of::<ClockParams>() == 8);

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

    /// The wait clock's rate measured against the host clock: two readings by the
    /// `detcoll_clock` kernel about 20 ms apart. `None` when the code object has no clock
    /// entry or the readings make no sense.
    fn calibrated_khz(&self) -> Option<u64> {
        let k = self.loaded().ok()?;
        let f = k.clock?;
        let out = HostMapped::new(1).ok()?;
        let read = || -> Option<(u64, std::time::Instant)> {
            let p = ClockParams { out: out.device_ptr() };
            // SAFETY: `detcoll_clock` takes `DcClockParams`; `out` is host-mapped memory of
            // this process that outlives the launch, which the synchronisation below completes.
            unsafe { launch(f, 1, 64, &p, core::ptr::null_mut()) }.ok()?;
            self.synchronize().ok()?;
            Some((out.read(0), std::time::Instant::now()))
        };
        let (t0, h0) = read()?;
        std::thread::sleep(Duration::from_millis(20));
        let (t1, h1) = read()?;
        khz_from_samples(t1.wrapping_sub(t0), h1 - h0)
    }

    pub(crate) fn loaded(&self) -> Result<Arc<Kernels>, Error> {
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
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, bytes: usize, stream: RawStream) -> Result<(), Error> {
        runtime::set_device(self.ordinal)?;
        let kind = sys::HIP_MEMCPY_DEVICE_TO_HOST;
        // SAFETY: `src` device memory of this device and `dst` host memory, both valid for
        // `bytes` bytes until the stream ran the copy; `stream` is live (the caller's contract).
        unsafe { runtime::memcpy_async(dst.cast(), src as *const _, bytes, kind, stream.0) }
    }
    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, bytes: usize, stream: RawStream) -> Result<(), Error> {
        runtime::set_device(self.ordinal)?;
        let kind = sys::HIP_MEMCPY_HOST_TO_DEVICE;
        // SAFETY: as above, the other way (the caller's contract).
        unsafe { runtime::memcpy_async(dst as *mut _, src.cast(), bytes, kind, stream.0) }
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
    unsafe fn synchronize_stream(&self, stream: RawStream) -> Result<(), Error> {
        runtime::set_device(self.ordinal)?;
        // SAFETY: `stream` is live (caller).
        unsafe { runtime::stream_synchronize(stream.0) }
    }

    fn load_tree(&self, _world: usize) -> Result<(), Error> {
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
    /// `timeout` in ticks of this device's `s_memrealtime` (what the HIP kernels'
    /// `dc_globaltimer()` returns), from `hipDeviceAttributeWallClockRate` ([`wait_ticks`]);
    /// a rate of 0 takes [`FALLBACK_WALL_CLOCK_KHZ`] with a warning on stderr (once).
    fn wait_bound(&self, timeout: Duration) -> Result<u64, Error> {
        let mut rate = i64::from(runtime::attribute(self.ordinal, sys::HIP_DEVICE_ATTRIBUTE_WALL_CLOCK_RATE)?);
        if rate <= 0 {
            // The attribute is unset on this part: measure the clock against the host's.
            rate = self.calibrated_khz().map_or(0, |k| i64::try_from(k).unwrap_or(0));
        }
        let (ticks, fallback) = wait_ticks(timeout, rate);
        if fallback {
            static WARN: Once = Once::new();
            WARN.call_once(|| {
                eprintln!(
                    "detcoll hip-ipc: HIP device {} reports hipDeviceAttributeWallClockRate = 0 and its clock could not be \
                     calibrated (rate {rate}); kernel wait bounds assume {FALLBACK_WALL_CLOCK_KHZ} kHz (on a slower clock waits last longer than the timeout)",
                    self.ordinal
                )
            });
        }
        Ok(ticks)
    }
    fn synchronize(&self) -> Result<(), Error> {
        let api = api()?;
        runtime::set_device(self.ordinal)?;
        // SAFETY: plain call on the current device.
        check(api, unsafe { (api.hipDeviceSynchronize)() }, "hipDeviceSynchronize")
    }
    fn kernels(&self, _world: usize) -> Result<Arc<Kernels>, Error> {
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
                Launch::SingleNorm { params, .. } => launch(kernels.collective_norm, grid, THREADS, params, s),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_rates_from_two_readings() {
        assert_eq!(khz_from_samples(2_000_000, Duration::from_millis(20)), Some(100_000)); // 100 MHz
        assert_eq!(khz_from_samples(500_000, Duration::from_millis(20)), Some(25_000)); // 25 MHz
        assert_eq!(khz_from_samples(0, Duration::from_millis(20)), None); // not advancing
        assert_eq!(khz_from_samples(1, Duration::ZERO), None);
        assert_eq!(khz_from_samples(u64::MAX, Duration::from_millis(1)), None); // > 10 GHz
    }

    #[test]
    fn wait_bounds_are_ticks_of_the_reported_clock_rate() {
        let s = Duration::from_secs(1);
        assert_eq!(wait_ticks(s, 100_000), (100_000_000, false)); // gfx942: 100 MHz
        assert_eq!(wait_ticks(s, 25_000), (25_000_000, false)); // MI200: 25 MHz
        assert_eq!(wait_ticks(Duration::from_millis(300), 100_000), (30_000_000, false));
        assert_eq!(wait_ticks(Duration::from_nanos(10), 100_000), (1, false)); // one 10 ns tick
        assert_eq!(wait_ticks(Duration::ZERO, 100_000), (0, false));
        // Unset (0) or nonsense (negative): the documented 100 MHz default, reported.
        assert_eq!(wait_ticks(s, 0), (100_000_000, true));
        assert_eq!(wait_ticks(s, -5), (100_000_000, true));
        // Overflow saturates instead of wrapping to a short bound.
        assert_eq!(wait_ticks(Duration::MAX, 100_000), (u64::MAX, false));
        assert_eq!(wait_ticks(Duration::from_secs(u64::MAX / 1000), i64::from(i32::MAX)), (u64::MAX, false));
    }
}
