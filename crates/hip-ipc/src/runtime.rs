//! The safe layer over [`crate::sys`]: devices, streams, events and the three kinds of memory
//! the protocol needs.
//!
//! * [`DeviceMemory::new`]: plain `hipMalloc` — staging frames (IPC handles work on it; stream-
//!   ordered pool allocations would not);
//! * [`DeviceMemory::fine_grained`]: `hipExtMallocWithFlags(hipDeviceMallocFinegrained)` — the
//!   control block (flags), because system-scope atomics on coarse-grained memory are not
//!   coherent with other GPUs or the host;
//! * [`HostMapped`]: `hipHostMalloc(Mapped | Portable)` — the error record kernels write and
//!   the host reads with a volatile load, no runtime call.
use crate::BACKEND;
use crate::result::{api, check, ready};
use crate::sys::{self, HipEvent, HipIpcMemHandle, HipStream};
use collective_core::Error;
use core::ffi::c_void;

/// Number of HIP devices; [`Error::LibraryMissing`] without the runtime.
pub fn device_count() -> Result<usize, Error> {
    let api = api()?;
    let mut n = 0;
    // SAFETY: out-pointer to a local.
    check(api, unsafe { (api.hipGetDeviceCount)(&mut n) }, "hipGetDeviceCount")?;
    Ok(usize::try_from(n).unwrap_or(0))
}

/// Makes `ordinal` the calling thread's current device.
pub fn set_device(ordinal: usize) -> Result<(), Error> {
    let api = api()?;
    // SAFETY: plain call.
    check(api, unsafe { (api.hipSetDevice)(ordinal as i32) }, "hipSetDevice")
}

/// An integer device attribute (`hipDeviceAttribute_t`).
pub fn attribute(ordinal: usize, attr: i32) -> Result<i32, Error> {
    let api = api()?;
    let mut v = 0;
    // SAFETY: out-pointer to a local.
    check(api, unsafe { (api.hipDeviceGetAttribute)(&mut v, attr, ordinal as i32) }, "hipDeviceGetAttribute")?;
    Ok(v)
}

/// Compute units of device `ordinal`.
pub fn multiprocessors(ordinal: usize) -> Result<usize, Error> {
    Ok(usize::try_from(attribute(ordinal, sys::HIP_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?).unwrap_or(1).max(1))
}

/// The device's `gcnArchName` without target features: `gfx942` for `gfx942:sramecc+:xnack-`.
///
/// `$DETCOLL_HIP_ARCH` overrides it. Otherwise the name is read from `hipDeviceProp_t`; its
/// layout differs between header revisions (R0000, R0600), so instead of hard-coding an offset
/// we look for the `gfx` arch string in the bytes the runtime returned (the marketing `name`
/// at offset 0 is skipped).
pub fn arch_name(ordinal: usize) -> Result<String, Error> {
    if let Some(a) = collective_core::env::var("DETCOLL_HIP_ARCH")? {
        let gfx = a.trim();
        let valid = gfx.strip_prefix("gfx").is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_hexdigit()));
        if !valid {
            return Err(collective_core::env::invalid("DETCOLL_HIP_ARCH", &a, "an AMD GPU target such as gfx942"));
        }
        return Ok(gfx.to_string());
    }
    let api = api()?;
    let mut buf = vec![0u8; sys::DEVICE_PROP_BYTES];
    // SAFETY: `buf` is larger than any hipDeviceProp_t revision.
    let r = unsafe { (api.hipGetDeviceProperties)(buf.as_mut_ptr().cast(), ordinal as i32) };
    check(api, r, "hipGetDeviceProperties")?;
    find_gfx(&buf[256..]).ok_or_else(|| Error::Backend {
        backend: BACKEND,
        detail: "hipGetDeviceProperties returned no gcnArchName (gfx...); set DETCOLL_HIP_ARCH".into(),
    })
}

/// The first NUL-delimited `gfx<hex digits>` string in `bytes`, without `:features`.
pub fn find_gfx(bytes: &[u8]) -> Option<String> {
    bytes
        .split(|b| *b == 0)
        .filter_map(|s| std::str::from_utf8(s).ok())
        .map(|s| s.split(':').next().unwrap_or(s))
        .find(|s| s.len() > 3 && s.starts_with("gfx") && s[3..].bytes().all(|b| b.is_ascii_hexdigit()))
        .map(str::to_owned)
}

/// The PCI bus id of device `ordinal` (`dddd:bb:dd.f`, lower case): the device's identity on
/// its host, the same whatever `HIP_VISIBLE_DEVICES` renumbering a process sees.
pub fn pci_bus_id(ordinal: usize) -> Result<String, Error> {
    let api = api()?;
    let mut buf = [0u8; sys::PCI_BUS_ID_BYTES];
    // SAFETY: `buf` holds `len` bytes; the runtime writes a NUL-terminated string into it.
    let r = unsafe { (api.hipDeviceGetPCIBusId)(buf.as_mut_ptr().cast(), buf.len() as i32, ordinal as i32) };
    check(api, r, "hipDeviceGetPCIBusId")?;
    c_string(&buf).ok_or_else(|| Error::Backend {
        backend: BACKEND,
        detail: format!("hipDeviceGetPCIBusId returned no bus id for device {ordinal}"),
    })
}

/// The NUL-terminated (or whole) string at the start of `bytes`, trimmed and lower-cased;
/// `None` when empty or not UTF-8.
pub fn c_string(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    let s = std::str::from_utf8(&bytes[..end]).ok()?.trim();
    (!s.is_empty()).then(|| s.to_ascii_lowercase())
}

/// Runtime and driver versions (`hipRuntimeGetVersion`, `hipDriverGetVersion`).
pub fn versions() -> Result<(i32, i32), Error> {
    let api = api()?;
    let (mut r, mut d) = (0, 0);
    // SAFETY: out-pointers to locals.
    check(api, unsafe { (api.hipRuntimeGetVersion)(&mut r) }, "hipRuntimeGetVersion")?;
    // SAFETY: as above.
    check(api, unsafe { (api.hipDriverGetVersion)(&mut d) }, "hipDriverGetVersion")?;
    Ok((r, d))
}

/// Lets the current device access `peer`'s memory (no-op when already enabled or the same).
pub fn enable_peer_access(device: usize, peer: usize) -> Result<(), Error> {
    if device == peer {
        return Ok(());
    }
    let api = api()?;
    let mut can = 0;
    // SAFETY: out-pointer to a local.
    let r = unsafe { (api.hipDeviceCanAccessPeer)(&mut can, device as i32, peer as i32) };
    check(api, r, "hipDeviceCanAccessPeer")?;
    if can == 0 {
        return Err(Error::InvalidConfig { detail: format!("HIP device {device} cannot access device {peer}") });
    }
    set_device(device)?;
    // SAFETY: flags must be 0.
    let r = unsafe { (api.hipDeviceEnablePeerAccess)(peer as i32, 0) };
    if r == sys::HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED { Ok(()) } else { check(api, r, "hipDeviceEnablePeerAccess") }
}

/// A `hipStream_t` created non-blocking on one device; destroyed on drop. What
/// `Collective::Stream` will be for the HIP twin.
#[derive(Debug)]
pub struct Stream {
    raw: HipStream,
    device: usize,
}

// SAFETY: HIP streams may be used from any thread of the process.
unsafe impl Send for Stream {}
// SAFETY: enqueueing on one stream from several threads is allowed by HIP.
unsafe impl Sync for Stream {}

impl Stream {
    /// A non-blocking stream on device `ordinal`.
    pub fn new(ordinal: usize) -> Result<Stream, Error> {
        let api = api()?;
        set_device(ordinal)?;
        let mut raw: HipStream = core::ptr::null_mut();
        // SAFETY: out-pointer to a local.
        let r = unsafe { (api.hipStreamCreateWithFlags)(&mut raw, sys::HIP_STREAM_NON_BLOCKING) };
        check(api, r, "hipStreamCreateWithFlags")?;
        Ok(Stream { raw, device: ordinal })
    }
    /// The raw handle (for launches).
    pub fn raw(&self) -> HipStream {
        self.raw
    }
    /// The device the stream belongs to.
    pub fn device(&self) -> usize {
        self.device
    }
    /// Waits for all work enqueued so far.
    pub fn synchronize(&self) -> Result<(), Error> {
        let api = api()?;
        // SAFETY: a live stream.
        check(api, unsafe { (api.hipStreamSynchronize)(self.raw) }, "hipStreamSynchronize")
    }

    /// Copies `src` to the start of `dst` in stream order and waits for it (the host slice is
    /// borrowed for this call only).
    pub fn write_sync(&self, dst: &DeviceMemory, src: &[u8]) -> Result<(), Error> {
        dst.check_range(src.len(), "write")?;
        // SAFETY: `src.len()` bytes fit in `dst` (checked); the host slice outlives the
        // synchronisation below.
        unsafe { self.memcpy(dst.ptr, src.as_ptr().cast(), src.len(), sys::HIP_MEMCPY_HOST_TO_DEVICE) }?;
        self.synchronize()
    }

    /// Copies the first `dst.len()` bytes of `src` to `dst` in stream order (after everything
    /// enqueued so far) and waits for it.
    pub fn read_sync(&self, src: &DeviceMemory, dst: &mut [u8]) -> Result<(), Error> {
        src.check_range(dst.len(), "read")?;
        // SAFETY: as in `write_sync`, in the other direction.
        unsafe { self.memcpy(dst.as_mut_ptr().cast(), src.ptr, dst.len(), sys::HIP_MEMCPY_DEVICE_TO_HOST) }?;
        self.synchronize()
    }

    /// Enqueues a device-to-device copy of the first `bytes` bytes of `src` into `dst`.
    pub fn copy(&self, dst: &DeviceMemory, src: &DeviceMemory, bytes: usize) -> Result<(), Error> {
        dst.check_range(bytes, "copy destination")?;
        src.check_range(bytes, "copy source")?;
        // SAFETY: both allocations hold `bytes` bytes (checked) and stay allocated until the copy
        // ran (`hipFree` waits for the device).
        unsafe { self.memcpy(dst.ptr, src.ptr, bytes, sys::HIP_MEMCPY_DEVICE_TO_DEVICE) }
    }

    /// One `hipMemcpyAsync` on this stream.
    ///
    /// # Safety
    /// `dst` and `src` must be valid for `bytes` bytes of the side `kind` names until the copy
    /// ran.
    unsafe fn memcpy(&self, dst: *mut c_void, src: *const c_void, bytes: usize, kind: i32) -> Result<(), Error> {
        // SAFETY: forwarded from the caller; a live stream.
        unsafe { memcpy_async(dst, src, bytes, kind, self.raw) }
    }

    /// Whether everything enqueued on this stream so far has completed (never blocks).
    pub fn is_done(&self) -> Result<bool, Error> {
        // SAFETY: a live stream.
        unsafe { stream_done(self.raw) }
    }

    /// A new event recorded on this stream now (device timing: [`Event::elapsed_ms`]).
    pub fn record_event(&self) -> Result<Event, Error> {
        let e = Event::new(self.device)?;
        e.record(self)?;
        Ok(e)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: created by hipStreamCreateWithFlags, destroyed once.
            let _ = unsafe { (api.hipStreamDestroy)(self.raw) };
        }
    }
}

/// One `hipMemcpyAsync` of `bytes` bytes of kind `kind` (`sys::HIP_MEMCPY_*`) on `stream`.
///
/// # Safety
/// `dst` and `src` must be valid for `bytes` bytes of the side `kind` names until `stream` has
/// executed the copy, and must not overlap; `stream` is a live stream (or null).
pub unsafe fn memcpy_async(
    dst: *mut c_void,
    src: *const c_void,
    bytes: usize,
    kind: i32,
    stream: HipStream,
) -> Result<(), Error> {
    let api = api()?;
    // SAFETY: forwarded from the caller.
    check(api, unsafe { (api.hipMemcpyAsync)(dst, src, bytes, kind, stream) }, "hipMemcpyAsync")
}

/// Whether every operation enqueued on `stream` so far has completed (`hipStreamQuery`; never
/// blocks).
///
/// # Safety
/// `stream` is a live stream (or null for the current device's default stream).
pub unsafe fn stream_done(stream: HipStream) -> Result<bool, Error> {
    let api = api()?;
    // SAFETY: forwarded from the caller.
    ready(api, unsafe { (api.hipStreamQuery)(stream) }, "hipStreamQuery")
}

/// Blocks until every operation enqueued on `stream` so far has completed
/// (`hipStreamSynchronize`).
///
/// # Safety
/// `stream` is a live stream (or null: the default stream).
pub unsafe fn stream_synchronize(stream: HipStream) -> Result<(), Error> {
    let api = api()?;
    // SAFETY: forwarded from the caller.
    check(api, unsafe { (api.hipStreamSynchronize)(stream) }, "hipStreamSynchronize")
}

/// A `hipEvent_t`, with timing enabled ([`Event::new`], `hipEventCreate`) or without
/// ([`Event::untimed`]); destroyed on drop.
#[derive(Debug)]
pub struct Event {
    raw: HipEvent,
}

// SAFETY: HIP events may be recorded, waited on and destroyed from any thread of the process.
unsafe impl Send for Event {}
// SAFETY: as above.
unsafe impl Sync for Event {}

impl Event {
    /// An event on device `ordinal` (record it on a stream of the same device).
    pub fn new(ordinal: usize) -> Result<Event, Error> {
        Self::create(ordinal, None)
    }
    /// An event without timing (`hipEventCreateWithFlags(hipEventDisableTiming)`, cheaper to
    /// record and wait on) on device `ordinal`: for ordering work across streams.
    pub fn untimed(ordinal: usize) -> Result<Event, Error> {
        Self::create(ordinal, Some(sys::HIP_EVENT_DISABLE_TIMING))
    }
    fn create(ordinal: usize, flags: Option<u32>) -> Result<Event, Error> {
        let api = api()?;
        set_device(ordinal)?;
        let mut raw: HipEvent = core::ptr::null_mut();
        let r = match flags {
            // SAFETY: out-pointer to a local.
            None => unsafe { (api.hipEventCreate)(&mut raw) },
            // SAFETY: as above.
            Some(f) => unsafe { (api.hipEventCreateWithFlags)(&mut raw, f) },
        };
        check(api, r, if flags.is_some() { "hipEventCreateWithFlags" } else { "hipEventCreate" })?;
        Ok(Event { raw })
    }
    /// The raw handle.
    pub fn raw(&self) -> HipEvent {
        self.raw
    }
    /// Records the event on `stream`: it completes when the work enqueued before it has.
    pub fn record(&self, stream: &Stream) -> Result<(), Error> {
        // SAFETY: a live stream.
        unsafe { self.record_raw(stream.raw) }
    }
    /// [`Event::record`] on a raw stream.
    ///
    /// # Safety
    /// `stream` is a live stream of the event's device (or null for its default stream).
    pub unsafe fn record_raw(&self, stream: HipStream) -> Result<(), Error> {
        let api = api()?;
        // SAFETY: a live event; `stream` as the caller vouches.
        check(api, unsafe { (api.hipEventRecord)(self.raw, stream) }, "hipEventRecord")
    }
    /// Makes later work on `stream` wait for the event's last recording (`hipStreamWaitEvent`;
    /// the host does not wait).
    ///
    /// # Safety
    /// `stream` is a live stream (or null).
    pub unsafe fn block(&self, stream: HipStream) -> Result<(), Error> {
        let api = api()?;
        // SAFETY: a live event; `stream` as the caller vouches; flags must be 0.
        check(api, unsafe { (api.hipStreamWaitEvent)(stream, self.raw, 0) }, "hipStreamWaitEvent")
    }
    /// Whether the work before the event's last recording has completed (`hipEventQuery`;
    /// never blocks).
    pub fn is_done(&self) -> Result<bool, Error> {
        let api = api()?;
        // SAFETY: a live event.
        ready(api, unsafe { (api.hipEventQuery)(self.raw) }, "hipEventQuery")
    }
    /// Waits until the event completed.
    pub fn synchronize(&self) -> Result<(), Error> {
        let api = api()?;
        // SAFETY: a live event.
        check(api, unsafe { (api.hipEventSynchronize)(self.raw) }, "hipEventSynchronize")
    }
    /// Milliseconds of device time from `self` to `end`; both must be recorded and complete.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, Error> {
        let api = api()?;
        let mut ms = 0f32;
        // SAFETY: out-pointer to a local; two live events.
        check(api, unsafe { (api.hipEventElapsedTime)(&mut ms, self.raw, end.raw) }, "hipEventElapsedTime")?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: created by hipEventCreate, destroyed once.
            let _ = unsafe { (api.hipEventDestroy)(self.raw) };
        }
    }
}

/// A device allocation, zeroed at creation, freed on drop (unless leaked).
#[derive(Debug)]
pub struct DeviceMemory {
    ptr: *mut c_void,
    bytes: usize,
    leak: bool,
}

// SAFETY: a device address; HIP memory may be freed from any thread.
unsafe impl Send for DeviceMemory {}
// SAFETY: the host never dereferences it.
unsafe impl Sync for DeviceMemory {}

impl DeviceMemory {
    /// `hipMalloc` of `bytes` on `ordinal` (IPC-shareable), zeroed.
    pub fn new(ordinal: usize, bytes: usize) -> Result<Self, Error> {
        Self::alloc(ordinal, bytes, None)
    }
    /// `hipExtMallocWithFlags(hipDeviceMallocFinegrained)` of `bytes` on `ordinal`, zeroed.
    pub fn fine_grained(ordinal: usize, bytes: usize) -> Result<Self, Error> {
        Self::alloc(ordinal, bytes, Some(sys::HIP_DEVICE_MALLOC_FINEGRAINED))
    }
    /// `hipExtMallocWithFlags(hipDeviceMallocUncached)` of `bytes` on `ordinal`, zeroed.
    pub fn uncached(ordinal: usize, bytes: usize) -> Result<Self, Error> {
        Self::alloc(ordinal, bytes, Some(sys::HIP_DEVICE_MALLOC_UNCACHED))
    }
    fn alloc(ordinal: usize, bytes: usize, flags: Option<u32>) -> Result<Self, Error> {
        let api = api()?;
        set_device(ordinal)?;
        let mut ptr: *mut c_void = core::ptr::null_mut();
        let r = match flags {
            // SAFETY: out-pointer to a local.
            None => unsafe { (api.hipMalloc)(&mut ptr, bytes.max(1)) },
            // SAFETY: as above.
            Some(f) => unsafe { (api.hipExtMallocWithFlags)(&mut ptr, bytes.max(1), f) },
        };
        check(api, r, if flags.is_some() { "hipExtMallocWithFlags" } else { "hipMalloc" })?;
        let me = DeviceMemory { ptr, bytes, leak: false };
        // SAFETY: the range was just allocated.
        check(api, unsafe { (api.hipMemset)(ptr, 0, bytes) }, "hipMemset")?;
        Ok(me)
    }
    /// Device address.
    pub fn ptr(&self) -> u64 {
        self.ptr as u64
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }
    /// Whether the allocation is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// `Ok` when the first `bytes` bytes lie inside the allocation.
    fn check_range(&self, bytes: usize, what: &str) -> Result<(), Error> {
        if bytes <= self.bytes {
            Ok(())
        } else {
            Err(Error::InvalidConfig { detail: format!("{what} of {bytes} bytes on a {}-byte allocation", self.bytes) })
        }
    }
    /// Keeps the memory allocated forever: close could not prove every peer stopped reading it.
    pub fn leak(&mut self) {
        self.leak = true;
    }
    /// The IPC handle another process opens with [`IpcMapping::open`].
    pub fn ipc_handle(&self) -> Result<[u8; sys::HIP_IPC_HANDLE_SIZE], Error> {
        let api = api()?;
        let mut h = HipIpcMemHandle { reserved: [0; sys::HIP_IPC_HANDLE_SIZE] };
        // SAFETY: `ptr` is the base of a hipMalloc/hipExtMallocWithFlags allocation.
        check(api, unsafe { (api.hipIpcGetMemHandle)(&mut h, self.ptr) }, "hipIpcGetMemHandle")?;
        Ok(h.reserved.map(|c| c as u8))
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.leak {
            return;
        }
        if let Ok(api) = api() {
            // SAFETY: allocated above; the owner guarantees no kernel still uses it.
            let _ = unsafe { (api.hipFree)(self.ptr) };
        }
    }
}

/// What the runtime recorded for the allocation holding device address `ptr`
/// (`hipPointerGetAttributes`): its memory type and the flags it was allocated with.
pub fn pointer_attributes(ptr: u64) -> Result<sys::HipPointerAttribute, Error> {
    let api = api()?;
    let mut a = sys::HipPointerAttribute {
        memory_type: 0,
        device: -1,
        device_pointer: core::ptr::null_mut(),
        host_pointer: core::ptr::null_mut(),
        is_managed: 0,
        allocation_flags: 0,
    };
    // SAFETY: out-pointer to a local of the ROCm 6 layout (const-asserted in `sys`); the
    // runtime only reads `ptr` as an address.
    check(api, unsafe { (api.hipPointerGetAttributes)(&mut a, ptr as *const c_void) }, "hipPointerGetAttributes")?;
    Ok(a)
}

/// A peer process's allocation opened through its IPC handle; closed on drop.
#[derive(Debug)]
pub struct IpcMapping {
    ptr: *mut c_void,
}

// SAFETY: a device address; closing from another thread is allowed.
unsafe impl Send for IpcMapping {}
// SAFETY: the host never dereferences it.
unsafe impl Sync for IpcMapping {}

impl IpcMapping {
    /// Opens `handle` (64 bytes from a peer's [`DeviceMemory::ipc_handle`]) on the current device.
    pub fn open(handle: &[u8]) -> Result<Self, Error> {
        let api = api()?;
        if handle.len() != sys::HIP_IPC_HANDLE_SIZE {
            return Err(Error::Backend {
                backend: BACKEND,
                detail: format!("an IPC handle has {} bytes, expected {}", handle.len(), sys::HIP_IPC_HANDLE_SIZE),
            });
        }
        let mut h = HipIpcMemHandle { reserved: [0; sys::HIP_IPC_HANDLE_SIZE] };
        for (d, s) in h.reserved.iter_mut().zip(handle) {
            *d = *s as _;
        }
        let mut ptr: *mut c_void = core::ptr::null_mut();
        // SAFETY: out-pointer to a local; the handle came from hipIpcGetMemHandle of a peer.
        let r = unsafe { (api.hipIpcOpenMemHandle)(&mut ptr, h, sys::HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) };
        check(api, r, "hipIpcOpenMemHandle")?;
        Ok(IpcMapping { ptr })
    }
    /// Device address of the mapping in this process.
    pub fn ptr(&self) -> u64 {
        self.ptr as u64
    }
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: opened by hipIpcOpenMemHandle; no kernel of ours uses it any more.
            let _ = unsafe { (api.hipIpcCloseMemHandle)(self.ptr) };
        }
    }
}

/// Pinned host memory mapped into the device (`hipHostMalloc(Mapped | Portable)`), zeroed:
/// kernels write the error record into it, the host reads it with volatile loads.
#[derive(Debug)]
pub struct HostMapped {
    host: *mut u64,
    dev: u64,
    words: usize,
}

// SAFETY: pinned host memory valid until drop; shared host access is volatile reads only.
unsafe impl Send for HostMapped {}
// SAFETY: as above.
unsafe impl Sync for HostMapped {}

impl HostMapped {
    /// `words` zeroed u64 words, device-visible.
    pub fn new(words: usize) -> Result<Self, Error> {
        let api = api()?;
        let mut host: *mut c_void = core::ptr::null_mut();
        let flags = sys::HIP_HOST_MALLOC_MAPPED | sys::HIP_HOST_MALLOC_PORTABLE;
        // SAFETY: out-pointer to a local.
        check(api, unsafe { (api.hipHostMalloc)(&mut host, words * 8, flags) }, "hipHostMalloc")?;
        let host = host.cast::<u64>();
        // SAFETY: `words` u64 of fresh pinned memory.
        unsafe { core::ptr::write_bytes(host, 0, words) };
        let mut dev: *mut c_void = core::ptr::null_mut();
        let me = HostMapped { host, dev: 0, words };
        // SAFETY: `host` is a mapped hipHostMalloc allocation; flags must be 0.
        check(api, unsafe { (api.hipHostGetDevicePointer)(&mut dev, host.cast(), 0) }, "hipHostGetDevicePointer")?;
        Ok(HostMapped { dev: dev as u64, ..me })
    }
    /// Device address kernels write to.
    pub fn device_ptr(&self) -> u64 {
        self.dev
    }
    /// Word `i` as the host sees it now.
    pub fn read(&self, i: usize) -> u64 {
        assert!(i < self.words, "word {i} out of {}", self.words);
        // SAFETY: in bounds; volatile because the device writes concurrently.
        unsafe { core::ptr::read_volatile(self.host.add(i)) }
    }
}

impl Drop for HostMapped {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: allocated by hipHostMalloc; no kernel writes it any more.
            let _ = unsafe { (api.hipHostFree)(self.host.cast()) };
        }
    }
}

/// Synchronous copy of `dst.len()` bytes from device address `src`.
pub fn copy_to_host(src: u64, dst: &mut [u8]) -> Result<(), Error> {
    let api = api()?;
    // SAFETY: the caller passes a device range of at least `dst.len()` bytes.
    let r = unsafe {
        (api.hipMemcpy)(dst.as_mut_ptr().cast(), src as *const c_void, dst.len(), sys::HIP_MEMCPY_DEVICE_TO_HOST)
    };
    check(api, r, "hipMemcpy (device to host)")
}

/// Synchronous copy of `src` to device address `dst`.
pub fn copy_to_device(src: &[u8], dst: u64) -> Result<(), Error> {
    let api = api()?;
    // SAFETY: the caller passes a device range of at least `src.len()` writable bytes.
    let r =
        unsafe { (api.hipMemcpy)(dst as *mut c_void, src.as_ptr().cast(), src.len(), sys::HIP_MEMCPY_HOST_TO_DEVICE) };
    check(api, r, "hipMemcpy (host to device)")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_strings() {
        assert_eq!(c_string(b"0000:C1:00.0\0garbage").as_deref(), Some("0000:c1:00.0"));
        assert_eq!(c_string(b"0000:03:00.0").as_deref(), Some("0000:03:00.0"));
        assert_eq!(c_string(b"\0abc"), None);
        assert_eq!(c_string(b"  \0"), None);
        assert_eq!(c_string(&[0xff, 0xfe, 0]), None);
    }

    #[test]
    fn no_runtime_is_library_missing() {
        if crate::result::runtime_present() {
            eprintln!("skipped: libamdhip64 is present");
            return;
        }
        let missing = |r: Result<(), Error>, what: &str| match r {
            Err(Error::LibraryMissing { .. }) => {}
            other => panic!("{what}: expected LibraryMissing, got {other:?}"),
        };
        missing(device_count().map(drop), "device_count");
        missing(Stream::new(0).map(drop), "Stream::new");
        missing(Event::new(0).map(drop), "Event::new");
        missing(Event::untimed(0).map(drop), "Event::untimed");
        missing(pci_bus_id(0).map(drop), "pci_bus_id");
        missing(crate::FusedTree::load(0).map(drop), "FusedTree::load");
        missing(DeviceMemory::new(0, 64).map(drop), "DeviceMemory::new");
    }
}
