//! Shared by the GPU test files, whatever the vendor: device and library discovery (with a
//! printed skip), a lock that keeps one world on the GPUs at a time, the conformance rank
//! environment and the GPU checks of `checks`, all generic over a [`Gpu`]: [`cuda::Cuda`]
//! (NCCL, feature `cuda`) or [`hip::Hip`] (RCCL, feature `rocm`).
//!
//! Run on an NVIDIA host with `NCCL_NVLS_ENABLE=0` (NVLS multicast is not used by these tests
//! and must stay off on the shared machines).
#![allow(dead_code)]
use ccl_transport::{Device, TransportCollective, TransportConfig};
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::conformance::{RankEnv, TestBackend};
use collective_core::{Collective, DType, Error, RawMut, RawRef};
use std::borrow::Borrow;
use std::marker::PhantomData;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

pub mod checks;
pub mod cuda;
pub mod hip;

/// Bound on waiting for a test stream (a hung NCCL kernel aborts instead of hanging the test).
pub const SYNC_BOUND: Duration = Duration::from_secs(120);

/// One GPU runtime the transport tests run on: a handle on one device, its streams and plain
/// device buffers, and the transport's [`Device`] on it.
pub trait Gpu: Sized + Send + Sync + 'static {
    /// The transport's device side.
    type Dev: Device;
    /// A stream the tests own; borrows as the collective's stream.
    type Stream: Borrow<<Self::Dev as Device>::Stream> + Send + Sync;
    /// A device buffer of at least one byte.
    type Mem: Send + Sync;

    /// `CUDA` / `HIP`, in skip messages.
    const RUNTIME: &'static str;
    /// `NCCL` / `RCCL`, in skip messages and logs.
    const LIBRARY: &'static str;

    /// Devices this process sees (0 without the runtime).
    fn device_count() -> usize;
    /// Device `ordinal`, or `None` when it cannot be opened.
    fn open(ordinal: usize) -> Option<Self>;
    /// A new stream on this device.
    fn stream(&self) -> Result<Self::Stream, String>;
    /// The transport's device side alone (the tree kernel loaded), without a communicator.
    fn tree_device(&self) -> Result<Self::Dev, Error>;
    /// This rank's transport on this device. Collective over `boot`.
    fn transport(
        &self,
        boot: &dyn Bootstrap,
        config: &TransportConfig,
    ) -> Result<TransportCollective<Self::Dev>, Error>;

    /// A zeroed buffer of `bytes.max(1)` bytes on `stream`'s device.
    fn alloc(stream: &Self::Stream, bytes: usize) -> Self::Mem;
    /// Writes `data` to the start of `mem`, ordered before later work on `stream`.
    fn write(stream: &Self::Stream, mem: &mut Self::Mem, data: &[u8]);
    /// The whole of `mem` after the work enqueued on `stream` so far (unbounded wait).
    fn read(stream: &Self::Stream, mem: &Self::Mem) -> Vec<u8>;
    /// Device address of `mem`.
    fn addr(stream: &Self::Stream, mem: &Self::Mem) -> u64;
    /// Waits for the work enqueued on `stream` so far.
    fn synchronize(stream: &Self::Stream);
}

/// A buffer holding `data` (at least one byte).
pub fn upload<G: Gpu>(stream: &G::Stream, data: &[u8]) -> G::Mem {
    let mut mem = G::alloc(stream, data.len());
    if !data.is_empty() {
        G::write(stream, &mut mem, data);
    }
    mem
}

/// Number of `G` devices, or `None` after printing why the test is skipped.
pub fn devices<G: Gpu>() -> Option<usize> {
    let n = G::device_count();
    if n == 0 {
        collective_core::conformance::skip(&format!("no {} device", G::RUNTIME));
        return None;
    }
    Some(n)
}

/// GPU 0 when a `G` device is present.
pub fn gpu<G: Gpu>() -> Option<G> {
    devices::<G>()?;
    G::open(0)
}

/// Number of `G` devices when its collective library (NCCL / RCCL) is loadable too, or `None`
/// after printing the skip.
pub fn library_devices<G: Gpu>() -> Option<usize> {
    let why = format!("no {} device / no {}", G::RUNTIME, G::LIBRARY);
    let n = G::device_count();
    if n == 0 {
        collective_core::conformance::skip(&why);
        return None;
    }
    if let Err(e) = ccl_transport::load(Some(G::Dev::VENDOR)) {
        collective_core::conformance::skip(&format!("{why} ({e})"));
        return None;
    }
    Some(n)
}

/// One world at a time: NCCL/RCCL kernels of concurrently running tests would compete for the
/// GPUs' compute units.
pub fn gpu_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// World 1 through the library on `gpu` (`ncclCommInitRank` with one rank).
pub fn world1<G: Gpu>(gpu: &G, config: &TransportConfig) -> TransportCollective<G::Dev> {
    let boot = LocalBootstrap::group(1).pop().expect("one bootstrap");
    gpu.transport(&boot, config).unwrap_or_else(|e| panic!("world-1 {} transport: {e}", G::LIBRARY))
}

/// A suite buffer: at least one byte of device memory (zero-byte allocations are not allowed),
/// and the length the suite asked for (what `read` returns).
pub struct Buf<G: Gpu> {
    mem: G::Mem,
    len: usize,
}

/// One rank of the suite: its collective and its own stream.
pub struct Rank<G: Gpu> {
    pub comm: TransportCollective<G::Dev>,
    pub stream: G::Stream,
}

impl<G: Gpu> RankEnv for Rank<G> {
    type Comm = TransportCollective<G::Dev>;
    type Buf = Buf<G>;
    fn comm(&self) -> &Self::Comm {
        &self.comm
    }
    fn stream(&self) -> &<G::Dev as Device>::Stream {
        self.stream.borrow()
    }
    fn alloc(&mut self, bytes: usize) -> Buf<G> {
        Buf { mem: G::alloc(&self.stream, bytes), len: bytes }
    }
    fn write(&mut self, buf: &mut Buf<G>, data: &[u8]) {
        assert!(data.len() <= buf.len, "suite write out of bounds");
        if !data.is_empty() {
            G::write(&self.stream, &mut buf.mem, data);
        }
    }
    fn read(&mut self, buf: &Buf<G>) -> Vec<u8> {
        // Bounded: a hung transport call aborts its communicator instead of blocking the copy.
        self.comm.synchronize(self.stream.borrow(), SYNC_BOUND).expect("transport calls completed");
        let mut v = G::read(&self.stream, &buf.mem);
        v.truncate(buf.len);
        v
    }
    fn view<'b>(&self, buf: &'b Buf<G>, byte_offset: usize, len: usize, dtype: DType) -> RawRef<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.len, "suite view out of bounds");
        // SAFETY: in bounds of a live device buffer the view borrows.
        unsafe { RawRef::from_raw(G::addr(&self.stream, &buf.mem) + byte_offset as u64, len, dtype) }
    }
    fn view_mut<'b>(&self, buf: &'b mut Buf<G>, byte_offset: usize, len: usize, dtype: DType) -> RawMut<'b> {
        assert!(byte_offset + len * dtype.size() <= buf.len, "suite view out of bounds");
        // SAFETY: as above, borrowed uniquely.
        unsafe { RawMut::from_raw(G::addr(&self.stream, &buf.mem) + byte_offset as u64, len, dtype) }
    }
}

/// Runs `f` on `world` ranks, one thread and one GPU each (NCCL/RCCL refuse two ranks on one
/// GPU), then synchronises (bounded) and closes every rank. `None` (skipped, printed) when
/// fewer than `world` GPUs or no library.
pub fn run_ranks<G, F>(world: usize, config: &TransportConfig, f: F) -> Option<Result<(), String>>
where
    G: Gpu,
    F: Fn(&mut Rank<G>) -> Result<(), String> + Sync,
{
    let n = library_devices::<G>()?;
    if world > n {
        collective_core::conformance::skip(&format!(
            "world {world} needs {world} GPUs ({} refuses two ranks on one GPU); {n} present",
            G::LIBRARY
        ));
        return None;
    }
    let _one_world = gpu_lock();
    let boots = Mutex::new(LocalBootstrap::group(world).into_iter().map(Some).collect::<Vec<_>>());
    Some(collective_core::conformance::run_threads(world, |r| {
        let boot = boots.lock().map_err(|e| e.to_string())?[r].take().ok_or("bootstrap taken")?;
        let gpu = G::open(r).ok_or("no context")?;
        let comm = gpu.transport(&boot, config).map_err(|e| e.to_string())?;
        let stream = gpu.stream()?;
        let mut rank = Rank { comm, stream };
        let result = f(&mut rank);
        let synced = rank.comm.synchronize(rank.stream.borrow(), SYNC_BOUND).map_err(|e| format!("synchronize: {e}"));
        let closed = rank.comm.close().map_err(|e| format!("close: {e}"));
        result.and(synced).and(closed)
    }))
}

/// The transport on `G`'s GPUs under the shared conformance suite, one rank per GPU as threads
/// of this process, configured by `config` from the suite's capacity.
pub struct Suite<G> {
    label: &'static str,
    config: fn(usize) -> TransportConfig,
    gpu: PhantomData<fn() -> G>,
}

impl<G: Gpu> Suite<G> {
    /// Both `reduce_scatter_many` paths in the suite's sizes (16 KiB packing crossover) and the
    /// all_gather exchange for reduce_scatter.
    pub const GATHER: Self = Suite {
        label: "all_gather exchange",
        config: |capacity| TransportConfig::new(capacity).with_pack_threshold(16 << 10),
        gpu: PhantomData,
    };

    /// reduce_scatter's all-to-all exchange for every size.
    pub const ALL_TO_ALL: Self = Suite {
        label: "all-to-all reduce_scatter",
        config: |capacity| TransportConfig::new(capacity).with_all_to_all_threshold(0).with_pack_threshold(usize::MAX),
        gpu: PhantomData,
    };
}

impl<G: Gpu> TestBackend for Suite<G> {
    type Rank = Rank<G>;
    fn name(&self) -> String {
        format!("ccl-transport ({}, {})", G::LIBRARY, self.label)
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut Rank<G>) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        run_ranks::<G, _>(world, &(self.config)(capacity), |rank| case(rank)).unwrap_or(Ok(()))
    }
}

/// The shared conformance suite on `$gpu` with both exchanges: the all_gather exchange at the
/// test binary's root, the all-to-all one in `all_to_all`.
#[allow(unused_macros)]
macro_rules! conformance {
    ($gpu:ty) => {
        type Platform = $gpu;
        const GATHER: common::Suite<Platform> = common::Suite::GATHER;
        collective_core::conformance_suite!(super::GATHER);

        mod all_to_all {
            const ALL_TO_ALL: super::common::Suite<super::Platform> = super::common::Suite::ALL_TO_ALL;
            collective_core::conformance_suite!(super::ALL_TO_ALL);
        }
    };
}
#[allow(unused_imports)]
pub(crate) use conformance;

/// The GPU tests of [`checks`] on `$gpu`, one `#[test]` each at the test binary's root.
#[allow(unused_macros)]
macro_rules! gpu_tests {
    ($gpu:ty) => {
        common::gpu_tests! {@tests $gpu;
            stacked_tree_matches_fixed_tree_for_w_2_4_8 => stacked_tree_matches_fixed_tree,
            world1_single_lane_ops_through_the_library_are_bit_exact => world1_single_lane_ops,
            world1_reduce_scatter_many_packed_and_per_lane_are_bit_exact => world1_reduce_scatter_many,
            world1_calls_alternating_streams_reuse_the_workspace_safely => world1_alternating_streams,
            world1_poll_close_and_validation_fail_closed => world1_poll_close_and_validation,
            world1_nonstrict_native_reference_runs => world1_nonstrict_native_reference,
            world2_watchdog_aborts_a_call_the_peer_never_makes => world2_watchdog,
        }
    };
    (@tests $gpu:ty; $($name:ident => $check:ident,)*) => {$(
        #[test]
        fn $name() {
            common::checks::$check::<$gpu>()
        }
    )*};
}
#[allow(unused_imports)]
pub(crate) use gpu_tests;
