//! AMD GPUs (ROCm) as a bench backend.
//!
//! * Processes (the default): every rank builds what downstream crates get,
//!   `collective_factory::rocm::from_bootstrap` (HIP IPC routes, RCCL where the MI300X table says),
//!   on GPU `local_rank % device count`, plus the native (NOT deterministic) RCCL columns
//!   from plain RCCL communicators (`super::native`), as on NVIDIA.
//! * Threads (`--threads`): the factory's thread group (`rocm::thread_group`), rank r on GPU
//!   r % count, routed by the run's routing table (as on NVIDIA; a transport route is an error).
//!
//! No `--graph` and no empty-kernel row here: hip-ipc exposes no graph capture to the bench
//! and no empty kernel.
//!
//! Buffers are plain `hipMalloc` allocations, the baseline is a device-to-device
//! `hipMemcpyAsync` of the same bytes, and time is HIP events on the rank's stream (device
//! time, not host time).
//!
//! Written and compiled, never executed: no AMD GPU was available (docs/rocm.md). Without
//! `libamdhip64` [`available`] is false and every constructor returns an error.
use super::args::BenchOp;
use super::backend::{BenchBackend, NativeKind};
use super::cuda::Retained;
use super::native::{self, Natives};
use anyhow::Context;
use ccl_transport::TransportCollective;
use collective_core::bootstrap::Bootstrap;
use collective_core::{Collective, DType, Io, RawMut, RawRef};
use collective_factory::{Config, RocmCollective, Routing, rocm};
use hip_ipc::HipDevice;
use hip_ipc::runtime::{DeviceMemory, Event};
use hip_ipc::{HipIpcCollective, Stream};
use std::sync::Arc;
use std::time::Duration;

/// `backend` of process runs (the factory's composition).
pub const NAME: &str = "hip";
/// `backend` of thread runs (the IPC twin alone, routed by the table).
pub const THREADS_NAME: &str = "hip-ipc-threads";

/// A thread rank's collective: the factory's, routed by the run's table (no transport route).
pub type ThreadCollective = RocmCollective;

/// Whether this process can drive an AMD GPU (libamdhip64 loadable, a device present). Never
/// panics without libamdhip64.
pub fn available() -> bool {
    device_count() > 0
}

/// HIP devices visible to this process (0 without the runtime).
pub fn device_count() -> usize {
    hip_ipc::runtime::device_count().unwrap_or(0)
}

/// Ranks of one host that share GPUs are refused: the factory's HIP IPC collective sizes its
/// grid for one rank per GPU (`max_blocks: None`), so ranks sharing a GPU might not be resident
/// together and would time out instead of measuring.
fn check_one_rank_per_gpu(ranks: usize, count: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        ranks <= count,
        "{ranks} rank processes on {count} AMD GPU(s): the ROCm collective assumes one rank process per GPU; \
         use --nproc {count} or fewer, or --threads"
    );
    Ok(())
}

/// Checks, before ranks are started, that `nproc` rank processes fit on this host's GPUs.
pub fn check_processes(nproc: usize) -> anyhow::Result<()> {
    check_one_rank_per_gpu(nproc, device_count())
}

/// One rank of a process world: the factory's collective on GPU `local_rank % count`;
/// `routing`: the `--route` table, else the factory's own choice. Collective: every rank
/// calls it.
pub fn process(
    boot: Arc<dyn Bootstrap>,
    capacity: usize,
    routing: Option<Routing>,
) -> anyhow::Result<HipBackend<RocmCollective>> {
    let count = hip_ipc::runtime::device_count()?;
    anyhow::ensure!(count > 0, "no HIP device");
    check_one_rank_per_gpu(boot.local_world_size(), count)?;
    let fallback = boot.local_rank() % count;
    // One GPU per rank (checked above): RCCL communicators are possible. Built before the
    // factory's collective (see `Natives::build`).
    let natives = if native::wanted()? {
        Natives::build(&*boot, capacity, |b, c| TransportCollective::with_device(|| HipDevice::open(fallback), b, c))
    } else {
        Natives::none()
    };
    let mut config = Config::new().with_capacity(capacity);
    if let Some(r) = routing {
        config = config.with_routing(r);
    }
    let comm = rocm::from_bootstrap(boot, &config).context("building the ROCm collective")?;
    let device = comm.ipc().map_or(fallback, |c| c.device().ordinal());
    let stream = Stream::new(device).context("creating the bench stream")?;
    let ll_capacity = comm.ipc().map(|c| c.config().ll_capacity);
    Ok(HipBackend { comm, name: NAME, stream, natives, ll_capacity })
}

/// A world of `world` ranks as threads, rank r on GPU r % count, built by the factory as users
/// build it (`rocm::thread_group`) under `routing` (which must take no transport route).
pub fn group(world: usize, capacity: usize, routing: &Routing) -> anyhow::Result<Vec<HipBackend<ThreadCollective>>> {
    super::routes::check_no_transport(routing, "a --threads run")?;
    let count = hip_ipc::runtime::device_count()?;
    anyhow::ensure!(count > 0, "no HIP device");
    let per_gpu = world.div_ceil(count);
    anyhow::ensure!(
        per_gpu <= 2,
        "--threads with {world} ranks on {count} AMD GPU(s) puts {per_gpu} ranks on one GPU; the bench's rank \
         threads enqueue independently, which the HIP IPC group supports for at most two ranks per GPU"
    );
    let config = Config::new().with_capacity(capacity).with_routing(routing.clone());
    let comms = rocm::thread_group(world, &config).context("building the HIP thread group")?;
    comms
        .into_iter()
        .map(|comm| {
            let ipc = comm.ipc().context("the thread group built no IPC backend")?;
            let stream = Stream::new(ipc.device().ordinal()).context("creating the bench stream")?;
            let ll_capacity = Some(ipc.config().ll_capacity);
            Ok(HipBackend { comm, name: THREADS_NAME, stream, natives: Natives::none(), ll_capacity })
        })
        .collect()
}

// The same measure of retained device memory as the NVIDIA backend.
impl Retained for HipIpcCollective {
    fn retained_bytes(&self) -> usize {
        self.staging_bytes()
    }
}

impl Retained for RocmCollective {
    /// IPC staging plus the RCCL transport's (lazily grown) workspace.
    fn retained_bytes(&self) -> usize {
        self.ipc().map_or(0, HipIpcCollective::staging_bytes) + self.transport().map_or(0, |t| t.workspace_bytes())
    }
}

/// One rank on one AMD GPU.
pub struct HipBackend<C> {
    comm: C,
    name: &'static str,
    stream: Stream,
    natives: Natives<HipDevice>,
    /// The IPC backend's LL push capacity (None: no IPC backend).
    ll_capacity: Option<usize>,
}

impl<C> HipBackend<C> {
    /// The native library references (closed by the caller after the collective's calls).
    pub fn natives(&self) -> &Natives<HipDevice> {
        &self.natives
    }

    fn sync(&self) -> anyhow::Result<()> {
        self.stream.synchronize().context("synchronizing the bench stream")
    }
}

/// Checks that a view of `len` elements of `dtype` at `byte_offset` lies inside `buf`.
fn view_in(buf: &DeviceMemory, byte_offset: usize, len: usize, dtype: DType) -> u64 {
    assert!(byte_offset + len * dtype.size() <= buf.len(), "view outside its buffer");
    buf.ptr() + byte_offset as u64
}

impl<C: Collective<Stream = Stream> + Retained> BenchBackend for HipBackend<C> {
    type Comm = C;
    type Buf = DeviceMemory;
    type Mark = Event;
    type Graph = std::convert::Infallible;

    fn name(&self) -> &'static str {
        self.name
    }
    fn copy_name(&self) -> &'static str {
        "device_copy"
    }
    fn comm(&self) -> &C {
        &self.comm
    }
    fn stream(&self) -> &Stream {
        &self.stream
    }
    fn alloc(&self, bytes: usize) -> anyhow::Result<DeviceMemory> {
        DeviceMemory::new(self.stream.device(), bytes).context("hipMalloc")
    }
    fn write(&self, buf: &mut DeviceMemory, data: &[u8]) -> anyhow::Result<()> {
        // Drained first, as on CUDA: a copy queued behind a pending collective could hold up a
        // peer's copy that the collective waits for when ranks share a GPU.
        self.sync()?;
        self.stream.write_sync(buf, data).context("copying to the device")
    }
    fn read(&self, buf: &DeviceMemory, bytes: usize) -> anyhow::Result<Vec<u8>> {
        self.sync()?;
        let mut v = vec![0u8; bytes];
        self.stream.read_sync(buf, &mut v).context("copying to the host")?;
        Ok(v)
    }
    fn view<'b>(&self, buf: &'b DeviceMemory, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b> {
        let ptr = view_in(buf, byte_offset, len, dtype);
        // SAFETY: inside the allocation (checked), which the borrow keeps alive.
        unsafe { RawRef::from_raw(ptr, len, dtype) }
    }
    fn view_mut<'b>(&self, buf: &'b mut DeviceMemory, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b> {
        let ptr = view_in(buf, byte_offset, len, dtype);
        // SAFETY: as in `view`, borrowed mutably.
        unsafe { RawMut::from_raw(ptr, len, dtype) }
    }
    fn copy(&self, dst: &mut DeviceMemory, src: &DeviceMemory, bytes: usize) -> anyhow::Result<()> {
        self.stream.copy(dst, src, bytes).context("hipMemcpyAsync (device to device)")
    }
    fn start_timer(&self) -> anyhow::Result<Event> {
        self.stream.record_event().context("recording a HIP event")
    }
    fn elapsed(&self, mark: Event) -> anyhow::Result<Duration> {
        let end = self.stream.record_event().context("recording a HIP event")?;
        end.synchronize().context("waiting for a HIP event")?;
        let ms = mark.elapsed_ms(&end).context("hipEventElapsedTime")?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_the_runtime_nothing_panics() {
        if hip_ipc::result::runtime_present() {
            eprintln!("skipped: libamdhip64 is present");
            return;
        }
        assert!(!available());
        assert_eq!(device_count(), 0);
        assert!(group(2, 1 << 16, &Routing::default_for(collective_factory::Platform::Rocm)).is_err());
        assert!(check_processes(1).is_err());
    }

    #[test]
    fn ranks_sharing_a_gpu_are_refused() {
        check_one_rank_per_gpu(8, 8).unwrap();
        check_one_rank_per_gpu(1, 8).unwrap();
        let e = check_one_rank_per_gpu(4, 2).unwrap_err().to_string();
        assert!(e.contains("--nproc 2") && e.contains("--threads"), "{e}");
    }
}
