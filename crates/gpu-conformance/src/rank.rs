//! One rank of a GPU test world ([`GpuRank`]) and the runner of worlds of ranks as threads.
use crate::{StreamOf, TestGpu};
use collective_core::conformance::RankEnv;
use collective_core::{Collective, DType, RawMut, RawRef};
use ipc_engine::{Device, IpcCollective};
use std::borrow::Borrow;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Device memory of one rank, carved from a region allocated before the world starts.
///
/// Why not allocate per buffer: allocating or freeing device memory can synchronise the
/// device, and a rank blocked there while a peer's kernel spins waiting for this rank's next
/// call deadlocks until the timeout. So every rank takes all its memory up front and never
/// allocates or frees while collectives may be in flight.
#[derive(Debug)]
pub struct DevBuf {
    pub ptr: u64,
    pub len: usize,
}

/// A barrier of the rank threads of one world with a bounded wait: a rank that failed or
/// panicked before reaching it makes the others fail after [`Gate::WAIT`], never hang.
#[derive(Debug)]
pub struct Gate {
    arrived: AtomicUsize,
    parties: usize,
}

impl Gate {
    /// Bound on waiting at a gate.
    pub const WAIT: Duration = Duration::from_secs(60);

    /// A gate for `parties` rank threads.
    pub fn new(parties: usize) -> Arc<Gate> {
        Arc::new(Gate { arrived: AtomicUsize::new(0), parties })
    }
}

/// One rank of a test world: its collective, its own stream, a bump allocator over its region
/// and the barrier of the world's rank threads.
pub struct GpuRank<G: TestGpu> {
    pub comm: IpcCollective<G::Device>,
    pub stream: G::Stream,
    gate: Arc<Gate>,
    /// Barriers this rank passed.
    passed: usize,
    next: u64,
    end: u64,
    /// Owned here when the rank is a process of its own; threads' regions outlive the world.
    /// Declared last: freed after the collective and the stream.
    _region: Option<<G::Device as Device>::Allocation>,
}

impl<G: TestGpu> std::fmt::Debug for GpuRank<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuRank")
            .field("comm", &self.comm)
            .field("passed", &self.passed)
            .field("free", &(self.next..self.end))
            .finish_non_exhaustive()
    }
}

impl<G: TestGpu> GpuRank<G> {
    /// A rank owning its memory (one process per rank; its barrier is its own).
    pub fn owning(
        comm: IpcCollective<G::Device>,
        stream: G::Stream,
        region: <G::Device as Device>::Allocation,
    ) -> GpuRank<G> {
        let base = comm.device().address(&region);
        let bytes = G::REGION_BYTES as u64;
        GpuRank { comm, stream, gate: Gate::new(1), passed: 0, next: base, end: base + bytes, _region: Some(region) }
    }

    /// The rank's stream as the collective takes it.
    pub fn stream(&self) -> &StreamOf<G> {
        self.stream.borrow()
    }

    /// Waits (at most [`Gate::WAIT`]) until every thread of the world has reached its barrier
    /// as often as this one.
    pub fn barrier(&mut self) -> Result<(), String> {
        self.passed += 1;
        let want = self.passed * self.gate.parties;
        self.gate.arrived.fetch_add(1, Ordering::AcqRel);
        let t = Instant::now();
        while self.gate.arrived.load(Ordering::Acquire) < want {
            if t.elapsed() > Gate::WAIT {
                return Err(format!("waited {:?} at barrier {} for the other ranks", Gate::WAIT, self.passed));
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

    /// A device copy of `data` in the rank's region.
    pub fn put(&mut self, data: &[u8]) -> DevBuf {
        let b = self.alloc_dev(data.len());
        self.upload(b.ptr, data);
        b
    }

    /// Copies `data` to `dst` and waits.
    ///
    /// The stream is drained *before* the copy: a copy queued behind a pending collective waits
    /// in a copy-engine queue shared with the other ranks' streams, where it can hold up a
    /// peer's copy that the pending collective itself waits for (a deadlock until the timeout
    /// when all ranks share one GPU).
    pub fn upload(&self, dst: u64, data: &[u8]) {
        G::synchronize(&self.stream).expect("sync");
        if !data.is_empty() {
            G::upload(&self.stream, dst, data).expect("upload");
        }
    }

    /// Reads `len` bytes at `src` after everything enqueued on the rank's stream (drained
    /// first, for the reason given at [`GpuRank::upload`]).
    pub fn download(&self, src: u64, len: usize) -> Vec<u8> {
        G::synchronize(&self.stream).expect("sync");
        let mut v = vec![0u8; len];
        if len > 0 {
            G::download(&self.stream, src, &mut v).expect("download");
        }
        v
    }
}

impl<G: TestGpu> RankEnv for GpuRank<G> {
    type Comm = IpcCollective<G::Device>;
    type Buf = DevBuf;
    fn comm(&self) -> &Self::Comm {
        &self.comm
    }
    fn stream(&self) -> &StreamOf<G> {
        self.stream.borrow()
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

/// A case on one rank, then its stream drained and a recorded kernel failure surfaced (the
/// case's own error first).
pub fn checked<G: TestGpu>(
    rank: &mut GpuRank<G>,
    case: &(dyn Fn(&mut GpuRank<G>) -> Result<(), String> + Sync),
) -> Result<(), String> {
    let r = case(rank);
    let synced = G::synchronize(&rank.stream).map_err(|e| format!("stream: {e}"));
    let recorded = rank.comm.check().map_err(|e| format!("recorded kernel failure: {e}"));
    r.and(synced).and(recorded)
}

/// Runs `f(rank)` for every rank of `comms` on its own thread, on the rank's device with its
/// own stream and `region` bytes of memory allocated before any thread starts (allocating
/// while a peer's kernel spins could stall the world); then synchronises each rank's stream
/// and closes it. Every failing rank's message is returned, joined.
pub fn run_ranks<G, F>(comms: Vec<IpcCollective<G::Device>>, region: usize, f: F) -> Result<(), String>
where
    G: TestGpu,
    F: Fn(&mut GpuRank<G>) -> Result<(), String> + Sync,
{
    let world = comms.len();
    let regions =
        comms.iter().map(|c| c.device().alloc(region).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    let bases: Vec<u64> = comms.iter().zip(&regions).map(|(c, r)| c.device().address(r)).collect();
    let streams = comms.iter().map(|c| G::new_stream(c.device())).collect::<Result<Vec<_>, _>>()?;
    let gate = Gate::new(world);
    let slots = Mutex::new(comms.into_iter().zip(streams).map(Some).collect::<Vec<_>>());
    let r = collective_core::conformance::run_threads(world, |r| {
        let (comm, stream) = slots.lock().map_err(|e| e.to_string())?[r].take().ok_or("rank taken")?;
        // Raw runtime calls of this thread (copies, memsets) go to the rank's device.
        comm.device().bind().map_err(|e| format!("bind: {e}"))?;
        let mut rank = GpuRank::<G> {
            comm,
            stream,
            gate: gate.clone(),
            passed: 0,
            next: bases[r],
            end: bases[r] + region as u64,
            _region: None,
        };
        let result = f(&mut rank);
        let synced = G::synchronize(&rank.stream).map_err(|e| format!("stream: {e}"));
        let closed = rank.comm.close().map_err(|e| format!("close: {e}"));
        result.and(synced).and(closed)
    });
    drop(regions);
    r
}
