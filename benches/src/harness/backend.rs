//! What the bench needs from a backend, and the CPU implementations.
//!
//! A GPU backend plugs in by implementing [`BenchBackend`] for one rank (device buffers, a
//! stream, device-side timing; `super::cuda` and `super::hip` are the GPU ones) and adding a
//! branch to `bench::resolve_backend`; the measurement loop ([`super::run`]) is generic and
//! never touches memory directly.
use super::args::BenchOp;
use collective_core::conformance::HostBuf;
use collective_core::{Collective, DType, Io, RawMut, RawRef};
use std::time::{Duration, Instant};

/// One rank's backend, as the bench drives it. Every method takes `&self` so the timed loop can
/// borrow buffers and the collective at the same time.
pub trait BenchBackend {
    /// The collective under test.
    type Comm: Collective;
    /// An owned buffer in the backend's memory.
    type Buf;
    /// A timing mark ([`BenchBackend::start_timer`]).
    type Mark;
    /// A captured, instantiated sequence of calls ([`BenchBackend::capture`]; a CUDA graph).
    type Graph;

    /// `backend` field of the report, e.g. `cpu-twin`, `cuda-ipc`.
    fn name(&self) -> &'static str;
    /// Name of the copy baseline, e.g. `host_memcpy`, `device_copy`.
    fn copy_name(&self) -> &'static str;
    /// This rank's collective.
    fn comm(&self) -> &Self::Comm;
    /// The stream calls are enqueued on.
    fn stream(&self) -> &<Self::Comm as Collective>::Stream;

    /// A buffer of `bytes` bytes (contents unspecified).
    fn alloc(&self, bytes: usize) -> anyhow::Result<Self::Buf>;
    /// Writes `data` to the start of `buf`, ordered before later calls on the stream.
    fn write(&self, buf: &mut Self::Buf, data: &[u8]) -> anyhow::Result<()>;
    /// Reads the first `bytes` bytes of `buf` after everything enqueued so far completed.
    fn read(&self, buf: &Self::Buf, bytes: usize) -> anyhow::Result<Vec<u8>>;
    /// A view of `len` elements of `dtype` starting `byte_offset` bytes into `buf`.
    fn view<'b>(&self, buf: &'b Self::Buf, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b>;
    /// A writable view of `len` elements of `dtype` starting `byte_offset` bytes into `buf`.
    fn view_mut<'b>(&self, buf: &'b mut Self::Buf, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b>;
    /// Enqueues a plain copy of `bytes` bytes (the baseline every row is compared with).
    fn copy(&self, dst: &mut Self::Buf, src: &Self::Buf, bytes: usize) -> anyhow::Result<()>;

    /// Marks the start of a timed region (GPU: records an event on the stream).
    fn start_timer(&self) -> anyhow::Result<Self::Mark>;
    /// Time from `mark` to now, after everything enqueued so far completed.
    fn elapsed(&self, mark: Self::Mark) -> anyhow::Result<Duration>;

    /// Staging/workspace bytes this rank retains between calls.
    fn workspace_bytes(&self) -> usize;
    /// Peak temporary (per-call) device memory; 0 where calls allocate nothing.
    fn peak_temp_bytes(&self) -> usize;

    /// Waits until everything enqueued on the stream has completed.
    fn drain(&self) -> anyhow::Result<()> {
        Ok(())
    }

    /// Whether [`BenchBackend::capture`] works (`--graph`).
    fn supports_graph(&self) -> bool {
        false
    }
    /// Captures `calls` back-to-back runs of `enqueue` on the stream into one graph and
    /// instantiates it, the stream drained before and after (instantiation may wait for the
    /// device). Nothing runs until [`BenchBackend::replay`].
    fn capture(&self, calls: usize, enqueue: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<Self::Graph> {
        let _ = (calls, enqueue);
        anyhow::bail!("{} cannot capture graphs (--graph needs the CUDA backend)", self.name())
    }
    /// Enqueues one replay of `graph` on the stream.
    fn replay(&self, graph: &Self::Graph) -> anyhow::Result<()> {
        let _ = graph;
        anyhow::bail!("{} cannot replay graphs", self.name())
    }

    /// Whether [`BenchBackend::empty_kernel`] exists (the launch-floor baseline row).
    fn has_empty_kernel(&self) -> bool {
        false
    }
    /// Enqueues one empty kernel (`detcoll_noop`) on the stream.
    fn empty_kernel(&self) -> anyhow::Result<()> {
        anyhow::bail!("{} has no empty kernel", self.name())
    }

    /// The LL push capacity of the collective's IPC backend (payload bytes per rank; push calls
    /// that send more take the one-shot route), when the backend knows it.
    fn ll_capacity(&self) -> Option<usize> {
        None
    }

    /// Whether the native library (NCCL/RCCL, NOT deterministic) can run `op` as `kind`.
    fn has_native(&self, _kind: NativeKind, _op: BenchOp) -> bool {
        false
    }
    /// Enqueues one native call of `op` (only where [`BenchBackend::has_native`]).
    fn native(&self, kind: NativeKind, op: BenchOp, _io: Io<'_>) -> anyhow::Result<()> {
        anyhow::bail!("{} has no native {kind:?} {}", self.name(), op.name())
    }
}

/// Which native-library reference a row measures next to the strict collective.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NativeKind {
    /// The library's own choice of algorithm and protocol.
    Default,
    /// `NCCL_ALGO=Tree NCCL_PROTO=Simple`: what deterministic inference stacks pin today.
    TreeSimple,
}

impl NativeKind {
    pub const ALL: [NativeKind; 2] = [NativeKind::Default, NativeKind::TreeSimple];
}

/// A host collective the CPU backend can run.
pub trait HostCollective: Collective<Stream = ()> {
    /// Staging bytes this rank retains.
    fn workspace_bytes(&self) -> usize;
}

impl HostCollective for collective_core::conformance::memory::MemoryCollective {
    fn workspace_bytes(&self) -> usize {
        0
    }
}

// impl HostCollective for shm_ipc::ShmCollective is in `super::cpu_twin`.

/// Host memory, host clock: the CPU twin (and the in-memory reference collective).
#[derive(Debug)]
pub struct HostBackend<C> {
    comm: C,
    name: &'static str,
    ll_capacity: Option<usize>,
}

impl<C: HostCollective> HostBackend<C> {
    pub fn new(comm: C, name: &'static str) -> Self {
        HostBackend { comm, name, ll_capacity: None }
    }

    /// Builder: the LL push capacity the collective was built with ([`BenchBackend::ll_capacity`]).
    pub fn with_ll_capacity(mut self, bytes: usize) -> Self {
        self.ll_capacity = Some(bytes);
        self
    }
}

impl<C: HostCollective> BenchBackend for HostBackend<C> {
    type Comm = C;
    type Buf = HostBuf;
    type Mark = Instant;
    type Graph = std::convert::Infallible;

    fn name(&self) -> &'static str {
        self.name
    }
    fn copy_name(&self) -> &'static str {
        "host_memcpy"
    }
    fn comm(&self) -> &C {
        &self.comm
    }
    fn stream(&self) -> &() {
        &()
    }
    fn alloc(&self, bytes: usize) -> anyhow::Result<HostBuf> {
        Ok(HostBuf::new(bytes))
    }
    fn write(&self, buf: &mut HostBuf, data: &[u8]) -> anyhow::Result<()> {
        anyhow::ensure!(data.len() <= buf.len(), "write of {} bytes into a {}-byte buffer", data.len(), buf.len());
        buf.as_bytes_mut()[..data.len()].copy_from_slice(data);
        Ok(())
    }
    fn read(&self, buf: &HostBuf, bytes: usize) -> anyhow::Result<Vec<u8>> {
        anyhow::ensure!(bytes <= buf.len(), "read of {bytes} bytes from a {}-byte buffer", buf.len());
        Ok(buf.as_bytes()[..bytes].to_vec())
    }
    fn view<'b>(&self, buf: &'b HostBuf, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b> {
        buf.view(byte_offset, len, dtype)
    }
    fn view_mut<'b>(&self, buf: &'b mut HostBuf, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b> {
        buf.view_mut(byte_offset, len, dtype)
    }
    fn copy(&self, dst: &mut HostBuf, src: &HostBuf, bytes: usize) -> anyhow::Result<()> {
        let d = std::hint::black_box(&mut dst.as_bytes_mut()[..bytes]);
        d.copy_from_slice(&src.as_bytes()[..bytes]);
        std::hint::black_box(d);
        Ok(())
    }
    fn start_timer(&self) -> anyhow::Result<Instant> {
        Ok(Instant::now())
    }
    fn elapsed(&self, mark: Instant) -> anyhow::Result<Duration> {
        Ok(mark.elapsed())
    }
    fn workspace_bytes(&self) -> usize {
        self.comm.workspace_bytes()
    }
    fn peak_temp_bytes(&self) -> usize {
        // Host calls allocate nothing per call: staging is retained (workspace_bytes).
        0
    }
    fn ll_capacity(&self) -> Option<usize> {
        self.ll_capacity
    }
}
