//! Shared by the HIP test files: device discovery (with a printed skip), a lock that keeps one
//! world on the GPU at a time, the rank environment of the conformance suite, and a runner of
//! worlds of ranks as threads.
#![allow(dead_code)]
use collective_core::Collective;
use collective_core::conformance::RankEnv;
use collective_core::{DType, RawMut, RawRef};
use hip_ipc::runtime::{self, DeviceMemory};
use hip_ipc::{HipIpcCollective, Stream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Device bytes every rank of a test world gets up front (the suite needs a few MiB per rank).
pub const REGION_BYTES: usize = 256 << 20;

/// HIP device 0, or `None` after printing "skipped: no HIP device".
pub fn gpu() -> Option<usize> {
    match runtime::device_count() {
        Ok(n) if n > 0 => Some(0),
        _ => {
            collective_core::conformance::skip("no HIP device");
            None
        }
    }
}

/// One world on the GPU at a time: ranks of a world spin waiting for each other.
pub fn gpu_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// A buffer carved from the rank's region (allocated before the world starts: allocating
/// while a peer's kernel spins could synchronise the device and stall the world).
#[derive(Debug)]
pub struct DevBuf {
    pub ptr: u64,
    pub len: usize,
}

/// A barrier of the rank threads of one world with a bounded wait: a rank that failed or
/// panicked before reaching it makes the others fail after [`BARRIER_WAIT`], never hang.
#[derive(Debug)]
pub struct Gate {
    arrived: AtomicUsize,
    parties: usize,
}

/// Bound on waiting at a [`Gate`].
pub const BARRIER_WAIT: Duration = Duration::from_secs(60);

impl Gate {
    pub fn new(parties: usize) -> Arc<Gate> {
        Arc::new(Gate { arrived: AtomicUsize::new(0), parties })
    }
}

/// One rank of the suite: its collective, its own stream, a bump allocator over its region and
/// the barrier of the world's rank threads.
pub struct HipRank {
    pub comm: HipIpcCollective,
    pub stream: Stream,
    gate: Arc<Gate>,
    /// Barriers this rank passed.
    passed: usize,
    next: u64,
    end: u64,
    /// Owned here when the rank is a process of its own; threads' regions outlive the world.
    _region: Option<DeviceMemory>,
}

impl HipRank {
    /// A rank allocating from `[base, base + bytes)`, owned elsewhere (threads), meeting the
    /// other threads of its world at `gate`.
    pub fn borrowing(comm: HipIpcCollective, stream: Stream, gate: Arc<Gate>, base: u64, bytes: usize) -> HipRank {
        HipRank { comm, stream, gate, passed: 0, next: base, end: base + bytes as u64, _region: None }
    }
    /// A rank owning its memory (one process per rank; its barrier is its own).
    pub fn owning(comm: HipIpcCollective, stream: Stream, region: DeviceMemory) -> HipRank {
        let (next, end) = (region.ptr(), region.ptr() + region.len() as u64);
        HipRank { comm, stream, gate: Gate::new(1), passed: 0, next, end, _region: Some(region) }
    }
    /// Waits (at most [`BARRIER_WAIT`]) until every thread of the world has reached its barrier
    /// as often as this one.
    pub fn barrier(&mut self) -> Result<(), String> {
        self.passed += 1;
        let want = self.passed * self.gate.parties;
        self.gate.arrived.fetch_add(1, Ordering::AcqRel);
        let t = Instant::now();
        while self.gate.arrived.load(Ordering::Acquire) < want {
            if t.elapsed() > BARRIER_WAIT {
                return Err(format!("waited {BARRIER_WAIT:?} at barrier {} for the other ranks", self.passed));
            }
            std::thread::yield_now();
        }
        Ok(())
    }
    /// A new device buffer of `bytes` (256-byte aligned, not cleared).
    pub fn alloc_dev(&mut self, bytes: usize) -> DevBuf {
        let ptr = self.next;
        let take = (bytes.max(1) as u64).div_ceil(256) * 256;
        assert!(ptr + take <= self.end, "test region exhausted ({bytes} bytes asked)");
        self.next += take;
        DevBuf { ptr, len: bytes }
    }
    /// Copies `data` to `dst` after draining the rank's stream.
    pub fn upload(&self, dst: u64, data: &[u8]) {
        self.stream.synchronize().expect("sync");
        if !data.is_empty() {
            runtime::copy_to_device(data, dst).expect("hipMemcpy (upload)");
        }
    }
    /// Reads `len` bytes at `src` after everything enqueued on the rank's stream.
    pub fn download(&self, src: u64, len: usize) -> Vec<u8> {
        self.stream.synchronize().expect("sync");
        let mut v = vec![0u8; len];
        if len > 0 {
            runtime::copy_to_host(src, &mut v).expect("hipMemcpy (download)");
        }
        v
    }
}

impl RankEnv for HipRank {
    type Comm = HipIpcCollective;
    type Buf = DevBuf;
    fn comm(&self) -> &HipIpcCollective {
        &self.comm
    }
    fn stream(&self) -> &Stream {
        &self.stream
    }
    fn alloc(&mut self, bytes: usize) -> DevBuf {
        self.alloc_dev(bytes)
    }
    fn write(&mut self, buf: &mut DevBuf, data: &[u8]) {
        assert!(data.len() <= buf.len);
        self.upload(buf.ptr, data);
    }
    fn read(&mut self, buf: &DevBuf) -> Vec<u8> {
        self.download(buf.ptr, buf.len)
    }
    fn view<'b>(&self, buf: &'b DevBuf, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.len, "suite view out of bounds");
        // SAFETY: in bounds of a live device buffer the view borrows.
        unsafe { RawRef::from_raw(buf.ptr + byte_offset as u64, len, dtype) }
    }
    fn view_mut<'b>(&self, buf: &'b mut DevBuf, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.len, "suite view out of bounds");
        // SAFETY: as above, borrowed uniquely.
        unsafe { RawMut::from_raw(buf.ptr + byte_offset as u64, len, dtype) }
    }
}

/// A case on one rank, then its stream drained and a recorded kernel failure surfaced.
pub fn checked(rank: &mut HipRank, case: &(dyn Fn(&mut HipRank) -> Result<(), String> + Sync)) -> Result<(), String> {
    let r = case(rank);
    let synced = rank.stream.synchronize().map_err(|e| format!("stream: {e}"));
    let recorded = rank.comm.check().map_err(|e| format!("recorded kernel failure: {e}"));
    r.and(synced).and(recorded)
}

/// Runs `f(rank)` for every rank of `comms` on its own thread, on the rank's device with its
/// own stream and [`REGION_BYTES`] of memory allocated before any thread starts (allocating
/// while a peer's kernel spins could stall the world); then synchronises each rank's stream
/// and closes it.
pub fn run_ranks<F>(comms: Vec<HipIpcCollective>, f: F) -> Result<(), String>
where
    F: Fn(&mut HipRank) -> Result<(), String> + Sync,
{
    let world = comms.len();
    let devices: Vec<usize> = comms.iter().map(|c| c.device().ordinal()).collect();
    let regions = devices
        .iter()
        .map(|&d| DeviceMemory::new(d, REGION_BYTES).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    let streams = devices.iter().map(|&d| Stream::new(d).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    let gate = Gate::new(world);
    let slots = Mutex::new(comms.into_iter().zip(streams).map(Some).collect::<Vec<_>>());
    let r = collective_core::conformance::run_threads(world, |r| {
        let (comm, stream) = slots.lock().map_err(|e| e.to_string())?[r].take().ok_or("rank taken")?;
        // Raw runtime calls of this thread (copies) go to the rank's device.
        runtime::set_device(devices[r]).map_err(|e| e.to_string())?;
        let mut rank = HipRank::borrowing(comm, stream, gate.clone(), regions[r].ptr(), REGION_BYTES);
        let result = f(&mut rank);
        let synced = rank.stream.synchronize().map_err(|e| format!("stream: {e}"));
        let closed = rank.comm.close().map_err(|e| format!("close: {e}"));
        result.and(synced).and(closed)
    });
    drop(regions);
    r
}
