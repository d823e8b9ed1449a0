//! NVIDIA GPUs as a bench backend.
//!
//! * Processes (the default): every rank builds what downstream crates get,
//!   `collective_factory::nvidia::from_bootstrap` (CUDA IPC routes, NCCL where the table says), on
//!   GPU `local_rank % device count`; where every rank has its own GPU it also builds two plain
//!   NCCL communicators for the native, NON-deterministic reference columns (library default,
//!   and `NCCL_ALGO=Tree NCCL_PROTO=Simple`).
//! * Threads (`--threads`): the CUDA IPC twin as a thread group, rank r on GPU r % count (no
//!   NCCL: it refuses two ranks of one process on one GPU, and the factory's IPC exchange needs
//!   processes).
//!
//! Buffers are plain device allocations, the baseline is a device-to-device copy of the same
//! bytes, and time is CUDA events on the rank's stream (device time, not host time).
use super::args::BenchOp;
use super::backend::{BenchBackend, NativeKind};
use super::native::{self, Natives};
use anyhow::Context;
use ccl_transport::TransportCollective;
use collective_core::bootstrap::Bootstrap;
use collective_core::{Collective, DType, Io, Op, RawMut, RawRef, Route};
use collective_factory::{Config, Platform, Routing, nvidia};
use cuda_ipc::CudaDevice;
use cuda_ipc::cudarc::driver::{CudaContext, CudaEvent, CudaSlice, CudaStream, DevicePtr, sys};
use cuda_ipc::{CudaIpcCollective, CudaIpcConfig};
use std::sync::Arc;
use std::time::Duration;

/// `backend` of process runs (the factory's composition).
pub const NAME: &str = "cuda";
/// `backend` of thread runs (the IPC twin alone).
pub const THREADS_NAME: &str = "cuda-ipc-threads";

/// Whether this process can drive an NVIDIA GPU (libcuda loadable, a device present). Never
/// panics without libcuda.
pub fn available() -> bool {
    cuda_ipc::driver::driver_present() && cuda_ipc::driver::device_count().is_ok_and(|n| n > 0)
}

/// CUDA devices visible to this process (0 without a driver).
pub fn device_count() -> usize {
    if cuda_ipc::driver::driver_present() { cuda_ipc::driver::device_count().unwrap_or(0) } else { 0 }
}

/// One rank on one GPU.
pub struct CudaBackend<C> {
    comm: C,
    name: &'static str,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// Native references in [`NativeKind::ALL`] order (None: not available on this world).
    natives: Natives<CudaDevice>,
}

/// A device buffer and its address.
pub struct DevBuf {
    slice: CudaSlice<u8>,
    ptr: u64,
}

fn context(ordinal: usize) -> anyhow::Result<Arc<CudaContext>> {
    let ctx = cuda_ipc::driver::open_device(ordinal).with_context(|| format!("opening CUDA device {ordinal}"))?;
    // SAFETY: every buffer of the bench is used on its rank's stream only, which orders it;
    // without tracking, raw addresses carry no per-use event bookkeeping.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// The all_reduce RS+AG threshold of the built-in NVIDIA table for `world` (thread runs).
fn rsag_threshold(world: usize) -> usize {
    Routing::default_for_world(Platform::Nvidia, world)
        .first_bytes(Op::AllReduce, Route::IpcReduceScatterAllGather)
        .unwrap_or(usize::MAX)
}

/// One rank of a process world: the factory's collective on GPU `local_rank % count`, plus the
/// native references when every rank has its own GPU. Collective: every rank calls it.
pub fn process(
    boot: Arc<dyn Bootstrap>,
    capacity: usize,
) -> anyhow::Result<CudaBackend<collective_factory::NvidiaCollective>> {
    let count = cuda_ipc::driver::device_count()?;
    anyhow::ensure!(count > 0, "no CUDA device");
    let ctx = context(boot.local_rank() % count)?;
    // Every rank has its own GPU when the world fits on this host's devices (same decision on
    // every rank of one host; NCCL refuses two ranks on one GPU).
    let own_gpu = boot.world_size() <= count;
    let natives = if own_gpu && native::wanted()? {
        Natives::build(&*boot, capacity, |b, c| TransportCollective::with_device(|| CudaDevice::new(&ctx), b, c))
    } else {
        if boot.rank() == 0 && native::wanted()? {
            eprintln!(
                "[bench] {} ranks share {count} GPU(s): no native NCCL columns (NCCL needs one GPU per rank); \
                 ranks sharing a GPU run concurrently only under MPS (nvidia-cuda-mps-control -d)",
                boot.world_size()
            );
        }
        Natives::none()
    };
    let comm = nvidia::from_bootstrap(boot, &Config::new().with_capacity(capacity))
        .context("building the NVIDIA collective")?;
    let stream = ctx.new_stream()?;
    Ok(CudaBackend { comm, name: NAME, ctx, stream, natives })
}

/// A world of `world` ranks as threads, rank r on GPU r % count (the IPC twin only).
pub fn group(world: usize, capacity: usize) -> anyhow::Result<Vec<CudaBackend<CudaIpcCollective>>> {
    let count = cuda_ipc::driver::device_count()?;
    anyhow::ensure!(count > 0, "no CUDA device");
    let per_gpu = world.div_ceil(count);
    anyhow::ensure!(
        per_gpu <= 2,
        "--threads with {world} ranks on {count} GPU(s) puts {per_gpu} ranks on one GPU context; ranks that are \
         threads sharing one context must enqueue in global call order, which the bench does not do. \
         Run without --threads (one process per rank; under MPS when ranks share a GPU)"
    );
    let ctxs = (0..world).map(|r| context(r % count)).collect::<anyhow::Result<Vec<_>>>()?;
    let config = CudaIpcConfig::new(capacity).with_rsag_threshold(rsag_threshold(world));
    let comms = cuda_ipc::group(&ctxs, &config).context("building the CUDA IPC thread group")?;
    comms
        .into_iter()
        .zip(ctxs)
        .map(|(comm, ctx)| {
            let stream = ctx.new_stream()?;
            Ok(CudaBackend { comm, name: THREADS_NAME, ctx, stream, natives: Natives::none() })
        })
        .collect()
}

/// Device memory a collective retains between calls.
pub trait Retained {
    fn retained_bytes(&self) -> usize;
}

impl Retained for CudaIpcCollective {
    fn retained_bytes(&self) -> usize {
        self.staging_bytes()
    }
}

impl Retained for collective_factory::NvidiaCollective {
    /// IPC staging plus the transport's (lazily grown) workspace.
    fn retained_bytes(&self) -> usize {
        self.ipc().map_or(0, CudaIpcCollective::staging_bytes) + self.transport().map_or(0, |t| t.workspace_bytes())
    }
}

impl<C> CudaBackend<C> {
    /// The native library references (closed by the caller after the collective's calls).
    pub fn natives(&self) -> &Natives<CudaDevice> {
        &self.natives
    }

    fn sync(&self) -> anyhow::Result<()> {
        self.stream.synchronize().context("synchronizing the bench stream")
    }
}

fn cu(r: sys::CUresult, what: &str) -> anyhow::Result<()> {
    anyhow::ensure!(r == sys::CUresult::CUDA_SUCCESS, "{what} failed: {r:?}");
    Ok(())
}

impl<C: Collective<Stream = CudaStream> + Retained> BenchBackend for CudaBackend<C> {
    type Comm = C;
    type Buf = DevBuf;
    type Mark = CudaEvent;

    fn name(&self) -> &'static str {
        self.name
    }
    fn copy_name(&self) -> &'static str {
        "device_copy"
    }
    fn comm(&self) -> &C {
        &self.comm
    }
    fn stream(&self) -> &CudaStream {
        &self.stream
    }
    fn alloc(&self, bytes: usize) -> anyhow::Result<DevBuf> {
        // SAFETY: contents unspecified until written, as the trait says.
        let slice = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }.context("cuMemAllocAsync")?;
        let ptr = slice.device_ptr(&self.stream).0;
        Ok(DevBuf { slice, ptr })
    }
    fn write(&self, buf: &mut DevBuf, data: &[u8]) -> anyhow::Result<()> {
        anyhow::ensure!(data.len() <= buf.slice.len(), "write of {} bytes into {}", data.len(), buf.slice.len());
        // Drained first: a copy queued behind a pending collective could hold up a peer's
        // copy that the collective waits for when ranks share a GPU's copy queues.
        self.sync()?;
        let (dst, len, stream) = (buf.ptr, data.len(), self.stream.cu_stream());
        // SAFETY: `len` bytes fit in the allocation; the host slice outlives the sync below.
        let r = unsafe { sys::cuMemcpyHtoDAsync_v2(dst, data.as_ptr().cast(), len, stream) };
        cu(r, "cuMemcpyHtoDAsync")?;
        self.sync()
    }
    fn read(&self, buf: &DevBuf, bytes: usize) -> anyhow::Result<Vec<u8>> {
        anyhow::ensure!(bytes <= buf.slice.len(), "read of {bytes} bytes from {}", buf.slice.len());
        self.sync()?;
        let mut v = vec![0u8; bytes];
        let stream = self.stream.cu_stream();
        // SAFETY: as in `write`, in the other direction.
        let r = unsafe { sys::cuMemcpyDtoHAsync_v2(v.as_mut_ptr().cast(), buf.ptr, bytes, stream) };
        cu(r, "cuMemcpyDtoHAsync")?;
        self.sync()?;
        Ok(v)
    }
    fn view<'b>(&self, buf: &'b DevBuf, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.slice.len(), "view outside its buffer");
        // SAFETY: inside the allocation (checked), which the borrow keeps alive.
        unsafe { RawRef::from_raw(buf.ptr + byte_offset as u64, len, dtype) }
    }
    fn view_mut<'b>(&self, buf: &'b mut DevBuf, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.slice.len(), "view outside its buffer");
        // SAFETY: as in `view`, borrowed mutably.
        unsafe { RawMut::from_raw(buf.ptr + byte_offset as u64, len, dtype) }
    }
    fn copy(&self, dst: &mut DevBuf, src: &DevBuf, bytes: usize) -> anyhow::Result<()> {
        anyhow::ensure!(bytes <= dst.slice.len() && bytes <= src.slice.len(), "copy of {bytes} bytes out of range");
        // SAFETY: both allocations hold `bytes`; ordered on this rank's stream.
        cu(unsafe { sys::cuMemcpyDtoDAsync_v2(dst.ptr, src.ptr, bytes, self.stream.cu_stream()) }, "cuMemcpyDtoDAsync")
    }
    fn start_timer(&self) -> anyhow::Result<CudaEvent> {
        let e = self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        e.record(&self.stream)?;
        Ok(e)
    }
    fn elapsed(&self, mark: CudaEvent) -> anyhow::Result<Duration> {
        let end = self.ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
        end.record(&self.stream)?;
        end.synchronize()?;
        let ms = mark.elapsed_ms(&end)?;
        Ok(Duration::from_secs_f64(f64::from(ms) / 1e3))
    }
    fn workspace_bytes(&self) -> usize {
        self.comm.retained_bytes()
    }
    fn peak_temp_bytes(&self) -> usize {
        0
    }
    fn has_native(&self, kind: NativeKind, op: BenchOp) -> bool {
        self.natives.has(kind, op)
    }
    fn native(&self, kind: NativeKind, op: BenchOp, io: Io<'_>) -> anyhow::Result<()> {
        self.natives.call(kind, op, io, &self.stream)
    }
}
