//! Shared by the GPU test files: device and NCCL discovery (with a printed skip), a lock that
//! keeps one world on the GPUs at a time, device buffers and the conformance rank environment.
//!
//! Run on a GPU host with `NCCL_NVLS_ENABLE=0` (NVLS multicast is not used by these tests and
//! must stay off on the shared machines).
#![allow(dead_code)]
use ccl_transport::cuda_ipc::cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use ccl_transport::{CudaDevice, TransportCollective, TransportConfig, Vendor};
use collective_core::bootstrap::LocalBootstrap;
use collective_core::conformance::RankEnv;
use collective_core::{Collective, DType, RawMut, RawRef};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// Bound on waiting for a test stream (a hung NCCL kernel aborts instead of hanging the test).
pub const SYNC_BOUND: Duration = Duration::from_secs(120);

/// Number of CUDA devices, or `None` after printing why the test is skipped.
pub fn cuda_devices() -> Option<usize> {
    static N: OnceLock<usize> = OnceLock::new();
    let n = *N.get_or_init(|| ccl_transport::cuda_ipc::driver::device_count().unwrap_or(0));
    if n == 0 {
        collective_core::conformance::skip("no CUDA device");
        return None;
    }
    Some(n)
}

/// Context of device `ordinal` (event tracking off: each buffer is used on one stream at a
/// time and the transport orders its own workspace).
pub fn context(ordinal: usize) -> Option<Arc<CudaContext>> {
    let ctx = ccl_transport::cuda_ipc::driver::open_device(ordinal).ok()?;
    // SAFETY: see above.
    unsafe { ctx.disable_event_tracking() };
    Some(ctx)
}

/// GPU 0's context when a CUDA device is present.
pub fn gpu() -> Option<Arc<CudaContext>> {
    cuda_devices()?;
    context(0)
}

/// Number of CUDA devices when NCCL is loadable too, or `None` after printing the skip.
pub fn nccl_devices() -> Option<usize> {
    let n = ccl_transport::cuda_ipc::driver::device_count().unwrap_or(0);
    if n == 0 {
        collective_core::conformance::skip("no CUDA device / no NCCL");
        return None;
    }
    if let Err(e) = ccl_transport::load(Some(Vendor::Nvidia)) {
        collective_core::conformance::skip(&format!("no CUDA device / no NCCL ({e})"));
        return None;
    }
    Some(n)
}

/// One world at a time: NCCL kernels of concurrently running tests would compete for SMs.
pub fn gpu_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Device address of a cudarc buffer.
pub fn addr<T>(buf: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _guard) = buf.device_ptr(stream);
    p
}

/// A buffer holding `data` (at least one byte).
pub fn upload(stream: &Arc<CudaStream>, data: &[u8]) -> CudaSlice<u8> {
    let mut b = stream.alloc_zeros::<u8>(data.len().max(1)).expect("alloc");
    if !data.is_empty() {
        stream.memcpy_htod(data, &mut b.slice_mut(..data.len())).expect("htod");
    }
    b
}

/// World 1 through NCCL on GPU 0 (`ncclCommInitRank` with one rank).
pub fn world1(ctx: &Arc<CudaContext>, config: &TransportConfig) -> TransportCollective<CudaDevice> {
    let boot = LocalBootstrap::group(1).pop().expect("one bootstrap");
    TransportCollective::new_cuda(ctx, &boot, config).expect("world-1 NCCL transport")
}

/// A suite buffer: at least one byte of device memory (zero-byte allocations are not allowed),
/// and the length the suite asked for (what `read` returns).
pub struct Buf {
    slice: CudaSlice<u8>,
    len: usize,
}

/// One rank of the suite: its collective and its own stream.
pub struct Rank {
    pub comm: TransportCollective<CudaDevice>,
    pub stream: Arc<CudaStream>,
}

impl RankEnv for Rank {
    type Comm = TransportCollective<CudaDevice>;
    type Buf = Buf;
    fn comm(&self) -> &Self::Comm {
        &self.comm
    }
    fn stream(&self) -> &CudaStream {
        &self.stream
    }
    fn alloc(&mut self, bytes: usize) -> Buf {
        Buf { slice: self.stream.alloc_zeros::<u8>(bytes.max(1)).expect("cuMemAlloc"), len: bytes }
    }
    fn write(&mut self, buf: &mut Buf, data: &[u8]) {
        assert!(data.len() <= buf.len, "suite write out of bounds");
        if !data.is_empty() {
            self.stream.memcpy_htod(data, &mut buf.slice.slice_mut(..data.len())).expect("memcpy_htod");
        }
    }
    fn read(&mut self, buf: &Buf) -> Vec<u8> {
        // Bounded: a hung transport call aborts its communicator instead of blocking the copy.
        self.comm.synchronize(&self.stream, SYNC_BOUND).expect("transport calls completed");
        let mut v = self.stream.clone_dtoh(&buf.slice).expect("clone_dtoh");
        v.truncate(buf.len);
        v
    }
    fn view<'b>(&self, buf: &'b Buf, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.len, "suite view out of bounds");
        // SAFETY: in bounds of a live device buffer the view borrows.
        unsafe { RawRef::from_raw(addr(&buf.slice, &self.stream) + byte_offset as u64, len, dtype) }
    }
    fn view_mut<'b>(&self, buf: &'b mut Buf, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.len, "suite view out of bounds");
        // SAFETY: as above, borrowed uniquely.
        unsafe { RawMut::from_raw(addr(&buf.slice, &self.stream) + byte_offset as u64, len, dtype) }
    }
}

/// Runs `f` on `world` ranks, one thread and one GPU each (NCCL refuses two ranks on one
/// GPU), then synchronises (bounded) and closes every rank. `None` (skipped, printed) when
/// fewer than `world` GPUs or no NCCL.
pub fn run_ranks<F>(world: usize, config: &TransportConfig, f: F) -> Option<Result<(), String>>
where
    F: Fn(&mut Rank) -> Result<(), String> + Sync,
{
    let n = nccl_devices()?;
    if world > n {
        collective_core::conformance::skip(&format!(
            "world {world} needs {world} GPUs (NCCL refuses two ranks on one GPU); {n} present"
        ));
        return None;
    }
    let _one_world = gpu_lock();
    let boots = Mutex::new(LocalBootstrap::group(world).into_iter().map(Some).collect::<Vec<_>>());
    Some(collective_core::conformance::run_threads(world, |r| {
        let boot = boots.lock().map_err(|e| e.to_string())?[r].take().ok_or("bootstrap taken")?;
        let ctx = context(r).ok_or("no context")?;
        let comm = TransportCollective::new_cuda(&ctx, &boot, config).map_err(|e| e.to_string())?;
        let stream = ctx.new_stream().map_err(|e| e.to_string())?;
        let mut rank = Rank { comm, stream };
        let result = f(&mut rank);
        let synced = rank.comm.synchronize(&rank.stream, SYNC_BOUND).map_err(|e| format!("synchronize: {e}"));
        let closed = rank.comm.close().map_err(|e| format!("close: {e}"));
        result.and(synced).and(closed)
    }))
}
