//! Shared by the GPU test files: device discovery (with a printed skip), a lock that keeps one
//! world on the GPU at a time, device buffers and the rank environment of the conformance suite.
#![allow(dead_code)]
use collective_core::conformance::RankEnv;
use collective_core::{DType, RawMut, RawRef};
use cuda_ipc::CudaIpcCollective;
use cuda_ipc::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, sys};
use std::sync::{Arc, Barrier, Mutex, MutexGuard, OnceLock};

/// The GPU every test uses, or `None` after printing "skipped: no CUDA device".
pub fn gpu() -> Option<Arc<CudaContext>> {
    static CTX: OnceLock<Result<Arc<CudaContext>, String>> = OnceLock::new();
    let ctx = CTX.get_or_init(|| {
        let n = cuda_ipc::driver::device_count().map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("the driver reports 0 devices".into());
        }
        let ctx = cuda_ipc::driver::open_device(0).map_err(|e| e.to_string())?;
        // SAFETY: every buffer of these tests is used on one stream at a time, and graph
        // capture must not record cudarc's tracking events.
        unsafe { ctx.disable_event_tracking() };
        Ok(ctx)
    });
    match ctx {
        Ok(c) => Some(c.clone()),
        Err(e) => {
            collective_core::conformance::skip(&format!("no CUDA device ({e})"));
            None
        }
    }
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

/// Runs `f(rank)` for every rank of `comms` on its own thread with its own stream and a
/// `region` bytes of memory allocated before any thread starts; synchronises, surfaces
/// recorded kernel failures and closes each rank afterwards.
pub fn run_ranks_with<F>(
    ctx: &Arc<CudaContext>,
    comms: Vec<CudaIpcCollective>,
    region: usize,
    f: F,
) -> Result<(), String>
where
    F: Fn(&mut CudaRank) -> Result<(), String> + Sync,
{
    use collective_core::Collective;
    let world = comms.len();
    let regions: Vec<Region> = (0..world).map(|_| Region::new(ctx, region)).collect();
    let streams = (0..world).map(|_| ctx.new_stream().map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
    let barrier = Arc::new(Barrier::new(world));
    let slots = Mutex::new(comms.into_iter().zip(streams).map(Some).collect::<Vec<_>>());
    let r = collective_core::conformance::run_threads(world, |r| {
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

/// [`run_ranks_with`] with [`REGION_BYTES`] per rank.
pub fn run_ranks<F>(ctx: &Arc<CudaContext>, comms: Vec<CudaIpcCollective>, f: F) -> Result<(), String>
where
    F: Fn(&mut CudaRank) -> Result<(), String> + Sync,
{
    run_ranks_with(ctx, comms, REGION_BYTES, f)
}
