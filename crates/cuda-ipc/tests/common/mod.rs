//! Shared by the GPU test files: device discovery (with a printed skip), a lock that keeps one
//! world on the GPU at a time, device buffers and the rank environment of the conformance suite.
#![allow(dead_code)]
use collective_core::conformance::{RankEnv, TestBackend};
use collective_core::{DType, RawMut, RawRef};
use cuda_ipc::CudaIpcCollective;
use cuda_ipc::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use std::sync::{Arc, Barrier, Mutex, MutexGuard};

/// Number of CUDA devices, or why there are none usable.
pub fn device_count() -> Result<usize, String> {
    match cuda_ipc::driver::device_count().map_err(|e| e.to_string())? {
        0 => Err("the driver reports 0 devices".into()),
        n => Ok(n),
    }
}

/// A device's context, or why it could not be opened.
type Opened = Result<Arc<CudaContext>, String>;

/// Device `ordinal`'s context (opened once per process), or why it cannot be opened.
pub fn open_gpu(ordinal: usize) -> Opened {
    static OPENED: Mutex<Vec<(usize, Opened)>> = Mutex::new(Vec::new());
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, r)) = opened.iter().find(|(o, _)| *o == ordinal) {
        return r.clone();
    }
    let r = device_count().and_then(|n| {
        if ordinal >= n {
            return Err(format!("device {ordinal} asked for, the driver reports {n}"));
        }
        let ctx = cuda_ipc::driver::open_device(ordinal).map_err(|e| e.to_string())?;
        // SAFETY: every buffer of these tests is used on one stream at a time, and graph
        // capture must not record cudarc's tracking events.
        unsafe { ctx.disable_event_tracking() };
        Ok(ctx)
    });
    opened.push((ordinal, r.clone()));
    r
}

/// Device `ordinal`, or `None` after printing "skipped: no CUDA device".
pub fn gpu_at(ordinal: usize) -> Option<Arc<CudaContext>> {
    match open_gpu(ordinal) {
        Ok(c) => Some(c),
        Err(e) => {
            collective_core::conformance::skip(&format!("no CUDA device ({e})"));
            None
        }
    }
}

/// The GPU the single-device tests use (device 0), or `None` after printing the skip.
pub fn gpu() -> Option<Arc<CudaContext>> {
    gpu_at(0)
}

/// The device of rank `rank` when ranks are spread round-robin over every device.
pub fn rank_device(rank: usize) -> Result<usize, String> {
    Ok(rank % device_count()?)
}

/// One world on the GPU at a time: ranks of a world spin waiting for each other, and worlds
/// of concurrently running tests could together exceed what the GPU keeps resident.
pub fn gpu_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Device address of a cudarc buffer.
pub fn addr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _guard) = buf.device_ptr(stream);
    p
}

/// Device memory of one rank, carved from a region allocated before the world starts.
///
/// Why not cudarc's (stream-ordered) allocations: allocating or freeing device memory can
/// synchronise the device, and a rank blocked there while a peer's kernel spins waiting for
/// this rank's next call deadlocks until the timeout. So every rank takes all its memory up
/// front and never allocates or frees while collectives may be in flight.
#[derive(Debug)]
pub struct DevBuf {
    pub ptr: u64,
    pub len: usize,
}

/// A plain `cuMemAlloc` region, freed on drop (after its world has finished).
pub struct Region {
    ctx: Arc<CudaContext>,
    base: u64,
    bytes: usize,
}

impl Region {
    pub fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Region {
        ctx.bind_to_thread().expect("bind");
        let mut base = 0u64;
        // SAFETY: out-pointer to a local.
        unsafe { sys::cuMemAlloc_v2(&mut base, bytes) }.result().expect("cuMemAlloc (test region)");
        Region { ctx: ctx.clone(), base, bytes }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: allocated above; every rank of the world has synchronised.
        let _ = unsafe { sys::cuMemFree_v2(self.base) };
    }
}

/// One rank of the suite: its collective, its own stream, a bump allocator over its region and
/// a barrier shared by the world's rank threads.
pub struct CudaRank {
    pub comm: CudaIpcCollective,
    pub stream: Arc<CudaStream>,
    pub barrier: Arc<Barrier>,
    next: u64,
    end: u64,
    /// Owned here when the rank is a process of its own; threads' regions outlive the world.
    _region: Option<Region>,
}

impl CudaRank {
    /// A rank owning its memory (one process per rank).
    pub fn owning(comm: CudaIpcCollective, stream: Arc<CudaStream>, region: Region) -> CudaRank {
        let (next, end) = (region.base, region.base + region.bytes as u64);
        CudaRank { comm, stream, barrier: Arc::new(Barrier::new(1)), next, end, _region: Some(region) }
    }

    /// A new device buffer of `bytes` (256-byte aligned, zeroed lazily by the caller).
    pub fn alloc_dev(&mut self, bytes: usize) -> DevBuf {
        let ptr = self.next;
        let take = (bytes.max(1) as u64).div_ceil(256) * 256;
        assert!(ptr + take <= self.end, "test region exhausted ({} bytes asked)", bytes);
        self.next += take;
        DevBuf { ptr, len: bytes }
    }

    /// Copies `data` to `dst` on the rank's stream and waits.
    ///
    /// The stream is drained *before* the copy is enqueued: a copy queued behind a pending
    /// collective waits in a copy-engine queue shared with the other ranks' streams, where it
    /// can hold up a peer's copy that the pending collective itself waits for (a deadlock until
    /// the timeout when all ranks share one GPU).
    pub fn upload(&self, dst: u64, data: &[u8]) {
        self.stream.synchronize().expect("sync");
        if data.is_empty() {
            return;
        }
        // SAFETY: `dst` holds `data.len()` bytes of this rank's region; the host buffer lives
        // until the synchronisation below.
        unsafe { sys::cuMemcpyHtoDAsync_v2(dst, data.as_ptr().cast(), data.len(), self.stream.cu_stream()) }
            .result()
            .expect("cuMemcpyHtoDAsync");
        self.stream.synchronize().expect("sync");
    }

    /// Reads `len` bytes at `src` after everything enqueued on the rank's stream (drained
    /// first, for the reason given at [`CudaRank::upload`]).
    pub fn download(&self, src: u64, len: usize) -> Vec<u8> {
        self.stream.synchronize().expect("sync");
        let mut v = vec![0u8; len];
        if len > 0 {
            // SAFETY: as above, in the other direction.
            unsafe { sys::cuMemcpyDtoHAsync_v2(v.as_mut_ptr().cast(), src, len, self.stream.cu_stream()) }
                .result()
                .expect("cuMemcpyDtoHAsync");
        }
        self.stream.synchronize().expect("sync");
        v
    }
}

impl RankEnv for CudaRank {
    type Comm = CudaIpcCollective;
    type Buf = DevBuf;
    fn comm(&self) -> &CudaIpcCollective {
        &self.comm
    }
    fn stream(&self) -> &CudaStream {
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

/// Device bytes every rank of a test world gets up front.
pub const REGION_BYTES: usize = 768 << 20;

/// Runs `f(rank)` for every rank of `comms` on its own thread, rank `r` in `ctxs[r]` (one
/// context per rank: the same one repeated for ranks sharing a GPU), with its own stream and
/// `region` bytes of memory allocated before any thread starts; synchronises, surfaces
/// recorded kernel failures and closes each rank afterwards.
pub fn run_ranks_with<F>(
    ctxs: &[Arc<CudaContext>],
    comms: Vec<CudaIpcCollective>,
    region: usize,
    f: F,
) -> Result<(), String>
where
    F: Fn(&mut CudaRank) -> Result<(), String> + Sync,
{
    use collective_core::Collective;
    let world = comms.len();
    if ctxs.len() != world {
        return Err(format!("{} contexts for {world} ranks", ctxs.len()));
    }
    let regions: Vec<Region> = ctxs.iter().map(|c| Region::new(c, region)).collect();
    let streams = ctxs.iter().map(|c| c.new_stream().map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    let barrier = Arc::new(Barrier::new(world));
    let slots = Mutex::new(comms.into_iter().zip(streams).map(Some).collect::<Vec<_>>());
    let r = collective_core::conformance::run_threads(world, |r| {
        // Raw driver calls of this thread (copies, memsets) run in the rank's context.
        ctxs[r].bind_to_thread().map_err(|e| format!("bind: {e}"))?;
        let (comm, stream) = slots.lock().map_err(|e| e.to_string())?[r].take().ok_or("rank taken")?;
        let base = regions[r].base;
        let mut rank = CudaRank {
            comm,
            stream,
            barrier: barrier.clone(),
            next: base,
            end: base + regions[r].bytes as u64,
            _region: None,
        };
        let result = f(&mut rank);
        let synced = rank.stream.synchronize().map_err(|e| format!("stream: {e}"));
        let closed = rank.comm.close().map_err(|e| format!("close: {e}"));
        result.and(synced).and(closed)
    });
    drop(regions);
    r
}

/// A conformance case on one rank, then its stream drained and a recorded kernel failure
/// surfaced.
pub fn checked_case(
    rank: &mut CudaRank,
    case: &(dyn Fn(&mut CudaRank) -> Result<(), String> + Sync),
) -> Result<(), String> {
    let r = case(rank);
    rank.stream.synchronize().map_err(|e| e.to_string())?;
    rank.comm.check().map_err(|e| format!("recorded kernel failure: {e}"))?;
    r
}

/// The conformance suites' configuration: `capacity` bytes of staging, a 32 KiB RS+AG
/// threshold so both all_reduce routes run (the suite's sizes go up to its 256 KiB capacity),
/// and `peer` as the bound on every wait for a peer.
pub fn suite_config(capacity: usize, peer: std::time::Duration) -> cuda_ipc::CudaIpcConfig {
    let mut config = cuda_ipc::CudaIpcConfig::new(capacity).with_rsag_threshold(32 << 10);
    config.timeouts = Some(collective_core::protocol::Timeouts { peer: peer, ..Default::default() });
    config
}

/// A conformance world of ranks as threads of this process, rank `r` in `ctxs[r]` (one GPU or
/// several): `case` on every rank through [`checked_case`].
pub fn run_thread_world(
    ctxs: &[Arc<CudaContext>],
    capacity: usize,
    case: &(dyn Fn(&mut CudaRank) -> Result<(), String> + Sync),
) -> Result<(), String> {
    let config = suite_config(capacity, std::time::Duration::from_secs(20));
    let comms = cuda_ipc::group(ctxs, &config).map_err(|e| e.to_string())?;
    run_ranks_with(ctxs, comms, REGION_BYTES, |rank| checked_case(rank, case))
}

/// Rank `r`'s context of a world of `world` ranks as threads, `Ok(None)` after printing why
/// such a world cannot run here.
pub type PlaceRanks = fn(world: usize) -> Result<Option<Vec<Arc<CudaContext>>>, String>;

/// A conformance backend of ranks as threads of this process, placed by `place` (one GPU or
/// several), one world on the GPUs at a time (see [`run_thread_world`]).
pub struct ThreadRanks {
    pub name: &'static str,
    pub place: PlaceRanks,
}

impl TestBackend for ThreadRanks {
    type Rank = CudaRank;
    fn name(&self) -> String {
        self.name.into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut CudaRank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let Some(ctxs) = (self.place)(world)? else { return Ok(()) };
        let _one_world = gpu_lock();
        run_thread_world(&ctxs, capacity, case)
    }
}

/// [`run_ranks_with`] with every rank in `ctx` and [`REGION_BYTES`] per rank.
pub fn run_ranks<F>(ctx: &Arc<CudaContext>, comms: Vec<CudaIpcCollective>, f: F) -> Result<(), String>
where
    F: Fn(&mut CudaRank) -> Result<(), String> + Sync,
{
    run_ranks_with(&vec![ctx.clone(); comms.len()], comms, REGION_BYTES, f)
}
