//! NVIDIA GPUs as a bench backend.
//!
//! * Processes (the default): every rank builds what downstream crates get,
//!   `collective_factory::nvidia::from_bootstrap` (CUDA IPC routes, NCCL where the table says), on
//!   GPU `local_rank % device count`; where every rank has its own GPU it also builds two plain
//!   NCCL communicators for the native, NON-deterministic reference columns (library default,
//!   and `NCCL_ALGO=Tree NCCL_PROTO=Simple`).
//! * Threads (`--threads`): the factory's thread group (`nvidia::thread_group`), rank r on GPU
//!   r % count, routed by the run's routing table (the
//!   `--route` table, else `DETCOLL_ROUTING_TABLE`, else the built-in table for the world), so
//!   thread runs route every call as process runs do. No NCCL: it refuses two ranks of one
//!   process on one GPU, and the factory's IPC exchange needs processes; a table with a
//!   transport route is an error. Ranks sharing a GPU enqueue independently: the engine's
//!   lockstep launches each call of all of them together (`ipc_engine::IpcCollective::group`).
//!   The bench binaries also default
//!   `CUDA_DEVICE_MAX_CONNECTIONS` to 32 for thread runs, so graph replays (which are not
//!   ordered) of up to 8 ranks get a hardware queue each; the collective kernels' grids are
//!   capped so every sharing rank's kernel is resident at once (the IPC twin's default).
//!
//! Buffers are plain device allocations, the baseline is a device-to-device copy of the same
//! bytes, the launch floor is the empty kernel `detcoll_noop` (the IPC device's `FusedTree`),
//! and time is CUDA events on the rank's stream (device time, not host time). `--graph`
//! captures calls on the rank's stream (thread-local capture mode, so ranks capturing at once
//! on different threads do not interfere) into a CUDA graph, instantiates and uploads it, and
//! times replays.
use super::args::BenchOp;
use super::backend::{BenchBackend, NativeKind};
use super::native::{self, Natives};
use anyhow::Context;
use ccl_transport::TransportCollective;
use collective_core::bootstrap::Bootstrap;
use collective_core::{Collective, DType, Io, RawMut, RawRef};
use collective_factory::{Config, Routing, nvidia};
use cuda_ipc::CudaIpcCollective;
use cuda_ipc::cudarc::driver::{CudaContext, CudaEvent, CudaGraph, CudaSlice, CudaStream, DevicePtr, sys};
use cuda_ipc::{CudaDevice, FusedTree};
use std::sync::Arc;
use std::time::Duration;

/// `backend` of process runs (the factory's composition).
pub const NAME: &str = "cuda";
/// `backend` of thread runs (the IPC twin alone, routed by the table).
pub const THREADS_NAME: &str = "cuda-ipc-threads";

/// A thread rank's collective: the factory's, routed by the run's table (no transport route).
pub type ThreadCollective = collective_factory::NvidiaCollective;

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
    /// The IPC device's kernels, for the empty-kernel row (None: no IPC backend was built).
    noop: Option<FusedTree>,
    /// The IPC backend's LL push capacity (None: no IPC backend).
    ll_capacity: Option<usize>,
}

/// The empty kernel and LL capacity of an IPC backend.
fn ipc_extras(ipc: Option<&CudaIpcCollective>) -> anyhow::Result<(Option<FusedTree>, Option<usize>)> {
    match ipc {
        Some(i) => {
            Ok((Some(i.device().fused_tree().context("loading the empty kernel")?), Some(i.config().ll_capacity)))
        }
        None => Ok((None, None)),
    }
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

/// `DETCOLL_BENCH_GPU`: which GPU a process rank drives — `local-rank` (the default, what
/// torchrun users get: `LOCAL_RANK % count`), `rank` (`RANK % count`: virtual nodes of a
/// several-GPU host, every rank on a GPU of its own, so NCCL carries the step across nodes)
/// or `node` (`GROUP_RANK % count`: one GPU per virtual node, its ranks sharing it under MPS).
pub const GPU_ENV: &str = "DETCOLL_BENCH_GPU";

/// The GPU of this rank by [`GPU_ENV`].
fn gpu_of(boot: &dyn Bootstrap, count: usize) -> anyhow::Result<usize> {
    let by = std::env::var(GPU_ENV).unwrap_or_else(|_| "local-rank".into());
    let index = match by.as_str() {
        "local-rank" => boot.local_rank(),
        "rank" => boot.rank(),
        "node" => std::env::var("GROUP_RANK")
            .ok()
            .and_then(|g| g.parse().ok())
            .unwrap_or_else(|| boot.rank() / boot.local_world_size().max(1)),
        other => anyhow::bail!("{GPU_ENV}={other}: expected local-rank, rank or node"),
    };
    Ok(index % count)
}

/// One rank of a process world: the factory's collective on GPU `local_rank % count` (see
/// [`GPU_ENV`]), plus the
/// native references when every rank has its own GPU. `routing`: the `--route` table (every
/// rank builds the same one from the same arguments), else the factory's own choice
/// (`DETCOLL_ROUTING_TABLE`, else the built-in table). Collective: every rank calls it.
pub fn process(
    boot: Arc<dyn Bootstrap>,
    capacity: usize,
    routing: Option<Routing>,
) -> anyhow::Result<CudaBackend<collective_factory::NvidiaCollective>> {
    let count = cuda_ipc::driver::device_count()?;
    anyhow::ensure!(count > 0, "no CUDA device");
    let ctx = context(gpu_of(&*boot, count)?)?;
    // Every rank has its own GPU when the world fits on this host's devices (same decision on
    // every rank of one host; NCCL refuses two ranks on one GPU).
    let own_gpu = boot.world_size() <= count
        && match std::env::var(GPU_ENV).as_deref() {
            Ok("rank") => true,
            Ok("node") => false,
            // By local rank: distinct GPUs when one host holds the whole world (virtual nodes
            // repeat local ranks).
            _ => boot.local_world_size() == boot.world_size(),
        };
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
    let mut config = Config::new().with_capacity(capacity);
    if let Some(r) = routing {
        config = config.with_routing(r);
    }
    let comm = nvidia::from_bootstrap(boot, &config).context("building the NVIDIA collective")?;
    let stream = ctx.new_stream()?;
    let (mut noop, ll_capacity) = ipc_extras(comm.ipc())?;
    if noop.is_none() {
        // A transport-only table builds no IPC backend: the kernels are loaded here.
        noop = Some(CudaDevice::new(&ctx).and_then(|d| d.fused_tree()).context("loading the empty kernel")?);
    }
    Ok(CudaBackend { comm, name: NAME, ctx, stream, natives, noop, ll_capacity })
}

/// A world of `world` ranks as threads, rank r on GPU r % count, built by the factory as users
/// build it (`nvidia::thread_group`) under `routing` (which must take no transport route).
pub fn group(world: usize, capacity: usize, routing: &Routing) -> anyhow::Result<Vec<CudaBackend<ThreadCollective>>> {
    super::routes::check_no_transport(routing, "a --threads run")?;
    let config = Config::new().with_capacity(capacity).with_routing(routing.clone());
    let comms = nvidia::thread_group(world, &config).context("building the CUDA thread group")?;
    comms
        .into_iter()
        .map(|comm| {
            let ipc = comm.ipc().context("the thread group built no IPC backend")?;
            let ctx = ipc.device().context().clone();
            // SAFETY: as in `context`: every buffer of the bench is used on its rank's stream.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.new_stream()?;
            let (noop, ll_capacity) = ipc_extras(Some(ipc))?;
            Ok(CudaBackend { comm, name: THREADS_NAME, ctx, stream, natives: Natives::none(), noop, ll_capacity })
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
    type Graph = CudaGraph;

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
    fn drain(&self) -> anyhow::Result<()> {
        self.sync()
    }
    fn supports_graph(&self) -> bool {
        self.comm.capabilities().supports_graph_capture
    }
    fn capture(&self, calls: usize, enqueue: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<CudaGraph> {
        self.sync()?;
        // Thread-local: only this thread's unsafe calls break its capture, so ranks capturing
        // at once on other threads (or querying their own streams) do not interfere.
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        self.stream.begin_capture(mode).context("cuStreamBeginCapture")?;
        let mut enqueued = Ok(());
        for _ in 0..calls {
            enqueued = enqueue();
            if enqueued.is_err() {
                break;
            }
        }
        // The capture is always ended (also after a failed call), so the stream is usable.
        let graph = self.stream.end_capture(sys::CUgraphInstantiate_flags_enum(0));
        enqueued.context("a call during stream capture")?;
        let graph =
            graph.context("cuStreamEndCapture / cuGraphInstantiate")?.context("the capture recorded no work")?;
        graph.upload().context("cuGraphUpload")?;
        self.sync()?;
        Ok(graph)
    }
    fn replay(&self, graph: &CudaGraph) -> anyhow::Result<()> {
        graph.launch().context("cuGraphLaunch")
    }
    fn has_empty_kernel(&self) -> bool {
        self.noop.is_some()
    }
    fn empty_kernel(&self) -> anyhow::Result<()> {
        let tree = self.noop.as_ref().context("no empty kernel (no IPC backend)")?;
        // SAFETY: the bench stream belongs to this device's (primary) context, as the
        // collective's own launches on it do.
        unsafe { tree.launch_noop(self.stream.cu_stream()) }.context("launching the empty kernel")
    }
    fn ll_capacity(&self) -> Option<usize> {
        self.ll_capacity
    }
    fn has_native(&self, kind: NativeKind, op: BenchOp) -> bool {
        self.natives.has(kind, op)
    }
    fn native(&self, kind: NativeKind, op: BenchOp, io: Io<'_>) -> anyhow::Result<()> {
        self.natives.call(kind, op, io, &self.stream)
    }
}
