//! The CPU twin as one more device of the engine: [`HostDevice`] implements the engine's
//! `Device` and `IpcDevice` traits on host memory, and its "kernel" is the reference executor
//! of the kernel ABI (`executor`). So `IpcCollective<HostDevice>` runs the engine's whole
//! per-call path — validation, routes, chunks, packing, the error record, poison, close — on
//! the CPU, with the protocol executed from the same parameters the GPU kernels receive.
//!
//! What a host device is: a stream is `()` (every launch runs to completion on the calling
//! thread before it returns, so streams, events and synchronisation are trivial); memory is the
//! heap (ranks that are threads) or a shared object in `/dev/shm` (ranks that are processes);
//! every rank is its own device (no two ranks share "hardware", so the engine forms no
//! lockstep); one block per launch (a host thread is one block's worth of parallelism).
use crate::executor::{self, Watch};
use crate::liveness::alive;
use crate::region::{Handle, Region, Share};
use collective_core::{DType, Error};
use detcoll_protocol::params::{MAX_WORLD, RankMemory};
use detcoll_protocol::status::RECORD_WORDS;
use detcoll_protocol::{Header, Layout};
use ipc_engine::{Device, IpcDevice, Launch, RawStream, Vendor};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Backend name in errors.
pub(crate) const BACKEND: &str = "shm-ipc";

/// A host "device": one rank's memory and executor. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HostDevice {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Whether staging is a shared object other processes can map (else heap).
    shared: bool,
    /// Process ids of the ranks whose staging this device mapped (rank -> pid), for the
    /// executor's waits: a peer process that exited will never publish.
    peers: Mutex<[Option<u32>; MAX_WORLD]>,
    /// Every shared object this device mapped (its own and its peers'), by rank: one truncated
    /// under its mapping turns the accesses that fault into zero pages (`guard`), and the call
    /// that met it fails closed.
    mapped: Mutex<Vec<(usize, Arc<Region>)>>,
    /// This device's rank (set when its staging is allocated).
    rank: AtomicUsize,
}

impl HostDevice {
    /// A device for a rank that is a thread of this process (heap staging).
    pub fn threads() -> HostDevice {
        HostDevice::with(false)
    }

    /// A device for a rank that is a process of its own (staging in `/dev/shm`, mapped by the
    /// peers).
    pub fn process() -> HostDevice {
        HostDevice::with(true)
    }

    fn with(shared: bool) -> HostDevice {
        HostDevice {
            inner: Arc::new(Inner {
                shared,
                peers: Mutex::new([None; MAX_WORLD]),
                mapped: Mutex::new(Vec::new()),
                rank: AtomicUsize::new(usize::MAX),
            }),
        }
    }

    fn track(&self, rank: usize, region: &Arc<Region>) {
        if let Ok(mut m) = self.inner.mapped.lock() {
            m.push((rank, region.clone()));
        }
    }

    /// The error for the first mapped object (in rank order) that was truncated under this
    /// process's mapping of it, if any did. One atomic load while nothing ever faulted.
    fn fault(&self) -> Option<Error> {
        if !crate::guard::any_fault() {
            return None;
        }
        let mapped = self.inner.mapped.lock().ok()?;
        let me = self.inner.rank.load(Ordering::Relaxed);
        let (q, own) = mapped.iter().filter(|(_, r)| r.faulted()).map(|(q, _)| (*q, *q == me)).min()?;
        const HOW: &str = "while this rank had it mapped (an access faulted with SIGBUS, caught by the guard): what \
                           this rank read from it is lost, the collective fails closed";
        Some(if own {
            Error::Backend {
                backend: BACKEND,
                detail: format!("this rank's own shared-memory object was truncated by another process {HOW}"),
            }
        } else {
            Error::PeerDied { peer: q, detail: format!("its shared-memory object was truncated {HOW}") }
        })
    }
}

impl Watch for HostDevice {
    fn exited(&self, peer: usize) -> Option<u32> {
        let pid = self.inner.peers.lock().ok()?.get(peer).copied().flatten()?;
        (!alive(pid)).then_some(pid)
    }
    fn faulted(&self) -> bool {
        crate::guard::any_fault() && self.fault().is_some()
    }
}

/// Host memory of [`Device::alloc`]: 256-byte aligned, zeroed.
#[derive(Debug)]
pub struct HostAllocation(Region);

/// One rank's staging: its region and, when shared, what keeps it reachable by peers.
#[derive(Debug)]
pub struct HostStaging {
    region: Arc<Region>,
    share: Option<Share>,
}

/// A peer process's staging mapped into this one.
#[derive(Debug)]
pub struct HostMapping(Arc<Region>);

/// The executor needs no loading.
#[derive(Debug)]
pub struct HostKernels;

/// The error record: host words the executor writes like a kernel writes its mapped record.
#[derive(Debug)]
pub struct HostRecord(Box<[AtomicU64; RECORD_WORDS]>);

fn host_address(p: *const u8) -> u64 {
    p as u64
}

impl Device for HostDevice {
    type Stream = ();
    type Allocation = HostAllocation;
    type Event = ();
    const VENDOR: Vendor = Vendor::Host;

    fn describe(&self) -> String {
        format!("host executor ({} staging)", if self.inner.shared { "/dev/shm" } else { "heap" })
    }
    fn raw_stream(&self, _stream: &()) -> Result<RawStream, Error> {
        Ok(RawStream(core::ptr::null_mut()))
    }
    fn bind(&self) -> Result<(), Error> {
        Ok(())
    }
    fn alloc(&self, bytes: usize) -> Result<HostAllocation, Error> {
        Region::heap(bytes).map(HostAllocation)
    }
    fn address(&self, allocation: &HostAllocation) -> u64 {
        host_address(allocation.0.base())
    }
    fn leak(&self, allocation: HostAllocation) {
        core::mem::forget(allocation);
    }
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, _stream: RawStream) -> Result<(), Error> {
        // SAFETY: both ranges valid and disjoint (the caller's contract).
        unsafe { core::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, bytes) };
        Ok(())
    }
    /// Host memory is this device's memory, and its "stream" is synchronous: a plain copy,
    /// done when this returns.
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, bytes: usize, _stream: RawStream) -> Result<(), Error> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: `src` readable and `dst` writable for `bytes` bytes, disjoint (the caller's
        // contract: one is the caller's buffer, the other its staging copy).
        unsafe { core::ptr::copy_nonoverlapping(src as *const u8, dst, bytes) };
        Ok(())
    }
    /// As [`Device::copy_to_host`]: a plain copy, done at once.
    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, bytes: usize, _stream: RawStream) -> Result<(), Error> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: as above, the other way.
        unsafe { core::ptr::copy_nonoverlapping(src, dst as *mut u8, bytes) };
        Ok(())
    }
    unsafe fn tree(
        &self,
        inputs: &[u64],
        out: u64,
        count: usize,
        dtype: DType,
        _stream: RawStream,
    ) -> Result<(), Error> {
        if inputs.is_empty() || inputs.len() > MAX_WORLD {
            return Err(Error::UnsupportedWorldSize { world: inputs.len() });
        }
        let bytes = count
            .checked_mul(dtype.size())
            .ok_or(Error::InvalidConfig { detail: format!("a tree of {count} elements overflows the address space") })?
            as u64;
        // SAFETY: every input readable and `out` writable for `count` elements (caller).
        unsafe { executor::tree(dtype as u32, inputs, out, bytes) };
        Ok(())
    }
    fn event(&self) -> Result<(), Error> {
        Ok(())
    }
    unsafe fn record(&self, _event: &(), _stream: RawStream) -> Result<(), Error> {
        Ok(())
    }
    unsafe fn wait_event(&self, _stream: RawStream, _event: &()) -> Result<(), Error> {
        Ok(())
    }
    fn event_done(&self, _event: &()) -> Result<bool, Error> {
        Ok(true)
    }
    unsafe fn stream_done(&self, _stream: RawStream) -> Result<bool, Error> {
        Ok(true)
    }
}

impl IpcDevice for HostDevice {
    fn peer_exited(&self, peer: usize) -> Option<u32> {
        self.exited(peer)
    }
    type Staging = HostStaging;
    type PeerMapping = HostMapping;
    type Kernels = HostKernels;
    type Record = HostRecord;
    const BACKEND: &'static str = BACKEND;
    const GRAPH_CAPTURE: bool = false;
    const NORM_READS_GATHERED: bool = true;
    const NORM_ROW_LOOP: bool = true;

    fn identity(&self) -> Result<[u8; 16], Error> {
        // Every rank is a device of its own: the engine's "same GPU" questions answer no.
        let mut id = [0u8; 16];
        id[..8].copy_from_slice(&(Arc::as_ptr(&self.inner) as u64).to_le_bytes());
        id[8..12].copy_from_slice(&std::process::id().to_le_bytes());
        Ok(id)
    }
    fn multiprocessors(&self) -> Result<usize, Error> {
        Ok(1)
    }
    fn same_device(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
    fn enable_peer_access(&self, _to: &Self) -> Result<(), Error> {
        Ok(())
    }
    fn synchronize(&self) -> Result<(), Error> {
        Ok(())
    }
    fn kernels(&self, _world: usize) -> Result<Arc<HostKernels>, Error> {
        Ok(Arc::new(HostKernels))
    }
    fn kernel_origin(_kernels: &HostKernels) -> String {
        "host executor (shm-ipc)".into()
    }
    fn grid_limit(_kernels: &HostKernels) -> u32 {
        1
    }
    /// Runs the launch to completion. Unlike a GPU launch it returns the call's failure at
    /// once (the error record the executor wrote, or a shared object truncated under the call):
    /// on the host a call is done when it returns.
    unsafe fn launch(
        &self,
        _kernels: &HostKernels,
        params: Launch<'_>,
        _grid: u32,
        stream: RawStream,
    ) -> Result<(), Error> {
        // The fused launch is the kernel's two parts in its order: the collective, then (when
        // it succeeded) the norm of every row.
        let (h, norm) = match params {
            Launch::Single(p) => {
                // SAFETY: packed by the engine for this rank's live group (the caller's contract).
                unsafe { executor::collective(&p.h, &p.seg, self) };
                (&p.h, None)
            }
            Launch::SingleNorm { params, args } => {
                // SAFETY: as above.
                let frame = unsafe { executor::collective(&params.call.h, &params.call.seg, self) };
                (&params.call.h, Some((params, args, frame)))
            }
            Launch::Many(p) => {
                // SAFETY: as above.
                unsafe { executor::collective(&p.h, &p.seg, self) };
                (&p.h, None)
            }
            Launch::Copy(p) => {
                // SAFETY: the engine's world-1 copy between the caller's validated views.
                unsafe { core::ptr::copy(p.src as *const u8, p.dst as *mut u8, p.bytes as usize) };
                return Ok(());
            }
        };
        // What the call read from a truncated object was zeros: it fails, whatever it recorded.
        if let Some(e) = self.fault() {
            return Err(e);
        }
        let record: [u64; RECORD_WORDS] = core::array::from_fn(|i| {
            // SAFETY: the launching rank's error record (the engine's own, alive while it is).
            unsafe { &*((h.err + 8 * i as u64) as *const AtomicU64) }.load(Ordering::Acquire)
        });
        if record[0] != 0 {
            return Err(detcoll_protocol::status::decode(&record, Duration::from_nanos(h.timeout_ns), BACKEND));
        }
        // Stopped without a record: the host set this rank's status word while the call ran
        // (`Collective::abandon` from another thread). The call did not complete: never `Ok`.
        // SAFETY: as above.
        if unsafe { executor::own_abort(h) } != 0 {
            return Err(Error::Poisoned {
                cause: "this rank was abandoned (Collective::abandon) during the call".into(),
            });
        }
        match norm {
            // SAFETY: the launch's gathered sums lie in this rank's live group's frames (the
            // engine packed them) and the output; the norm's views are the caller's, validated
            // by the engine (`pack`).
            Some((fused, args, frame)) if fused.reads_gathered() => unsafe {
                self.residual_rmsnorm_gathered(fused, args, frame)
            },
            // SAFETY: the norm's views are the caller's, validated by the engine (`pack`).
            Some((_, args, _)) => unsafe { detcoll_protocol::NormDevice::residual_rmsnorm(self, args, stream) },
            None => Ok(()),
        }
    }
    fn alloc_staging(&self, layout: &Layout, header: &Header) -> Result<HostStaging, Error> {
        let len = layout.total_bytes();
        self.inner.rank.store(header.rank as usize, Ordering::Relaxed);
        let (region, share) = if self.inner.shared {
            let nonce =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
            let stem = format!("detcoll-{}-{}-{nonce:x}", std::process::id(), header.rank);
            let (r, s) = Region::create_shared(&stem, len)?;
            let r = Arc::new(r);
            self.track(header.rank as usize, &r);
            (r, Some(s))
        } else {
            (Arc::new(Region::heap(len)?), None)
        };
        let base = region.base();
        for (i, w) in header.to_words().iter().enumerate() {
            // SAFETY: the header words lie at the start of the fresh, zeroed region.
            unsafe { &*base.add(layout.header() + 8 * i).cast::<AtomicU64>() }.store(*w, Ordering::Release);
        }
        Ok(HostStaging { region, share })
    }
    fn staging_memory(staging: &HostStaging, layout: &Layout) -> RankMemory {
        RankMemory::one_allocation(layout, host_address(staging.region.base()))
    }
    fn leak_staging(staging: HostStaging) {
        core::mem::forget(staging);
    }
    fn export_staging(&self, staging: &HostStaging) -> Result<Vec<u8>, Error> {
        let Some(share) = &staging.share else {
            return Err(Error::InvalidConfig {
                detail: "heap staging cannot be shared with another process (use HostDevice::process)".into(),
            });
        };
        let mut bytes = std::process::id().to_le_bytes().to_vec();
        bytes.extend_from_slice(&(staging.region.len() as u64).to_le_bytes());
        bytes.extend_from_slice(share.handle.encode().as_bytes());
        Ok(bytes)
    }
    fn import_staging(&self, peer: usize, exported: &[u8]) -> Result<HostMapping, Error> {
        let bad =
            || Error::Backend { backend: BACKEND, detail: format!("rank {peer} sent a malformed staging handle") };
        if peer >= MAX_WORLD || exported.len() < 12 {
            return Err(bad());
        }
        let pid = u32::from_le_bytes(exported[..4].try_into().map_err(|_| bad())?);
        let len = u64::from_le_bytes(exported[4..12].try_into().map_err(|_| bad())?);
        let len = usize::try_from(len).map_err(|_| bad())?;
        let handle = std::str::from_utf8(&exported[12..]).ok().and_then(Handle::decode).ok_or_else(bad)?;
        // The region checks the object holds `len` bytes; the engine then checks the peer's
        // header against the agreed layout.
        let region = Arc::new(Region::open_shared(peer, &handle, len)?);
        self.track(peer, &region);
        if let Ok(mut p) = self.inner.peers.lock() {
            p[peer] = Some(pid);
        }
        Ok(HostMapping(region))
    }
    fn mapping_memory(mapping: &HostMapping, layout: &Layout) -> RankMemory {
        RankMemory::one_allocation(layout, host_address(mapping.0.base()))
    }
    fn read_words(&self, src: u64, words: &mut [u64]) -> Result<(), Error> {
        for (i, w) in words.iter_mut().enumerate() {
            // SAFETY: the engine reads control words of live stagings only.
            *w = unsafe { &*((src + 8 * i as u64) as *const AtomicU64) }.load(Ordering::Acquire);
        }
        Ok(())
    }
    fn write_word(&self, dst: u64, value: u64) -> Result<(), Error> {
        // SAFETY: the engine writes control words of live stagings only.
        unsafe { &*(dst as *const AtomicU64) }.store(value, Ordering::Release);
        Ok(())
    }
    fn error_record(&self) -> Result<HostRecord, Error> {
        Ok(HostRecord(Box::new(core::array::from_fn(|_| AtomicU64::new(0)))))
    }
    fn record_address(record: &HostRecord) -> u64 {
        record.0.as_ptr() as u64
    }
    fn record_words(record: &HostRecord) -> [u64; RECORD_WORDS] {
        core::array::from_fn(|i| record.0[i].load(Ordering::Acquire))
    }
    fn record_code(record: &HostRecord) -> u64 {
        record.0[0].load(Ordering::Acquire)
    }
}
