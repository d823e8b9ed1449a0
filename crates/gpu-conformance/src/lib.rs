//! The GPU test suite of the IPC backends, written once and instantiated per vendor.
//!
//! `cuda-ipc` and `hip-ipc` run the same engine ([`ipc_engine::IpcCollective`]) over their
//! own [`IpcDevice`]; their GPU tests used to be near-copies that drifted apart (the HIP side
//! lacked the lane-split, generation-wrap and peer-closed tests). Here each test is one generic
//! body over [`TestGpu`], the little a test needs from a vendor beyond [`IpcDevice`]; a vendor's
//! test files implement it once (`tests/common/mod.rs`) and expand the macros:
//!
//! * [`gpu_suite!`](crate::gpu_suite): the GPU behaviour beyond the conformance suite
//!   ([`cases`]): randomized back-to-back calls, generations wrapping, and the fail-closed
//!   protocol errors (mismatched counts and grids, mismatched lane splits, an absent rank, a
//!   call after the peer closed), and the fused tree kernel's hardware and software arithmetic
//!   against `fixed-tree`;
//! * `collective_core::conformance_suite!` over [`Threads`] (ranks as threads on one GPU,
//!   [`one_gpu`], or across GPUs, [`across_gpus`]) and [`Processes`] (one process per rank).
//!
//! Why a crate of its own (`publish = false`) rather than a feature of `ipc-engine`: the suite
//! is test code with test-only dependencies (the conformance suite and, through it, the
//! launcher); as a crate that no library depends on normally, none of it can reach a
//! published package, the engine's features and public surface stay what users see, and the
//! vendor crates take it as a path-only dev-dependency (which `cargo publish` drops).
//!
//! Every test prints `skipped: <reason>` (through [`collective_core::conformance::skip`]) and
//! passes where its GPUs are not there; outputs are compared bit for bit, never with a
//! tolerance.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cases;
mod rank;
mod worlds;

pub use rank::{DevBuf, Gate, GpuRank, checked, run_ranks};
pub use worlds::{Processes, Threads, across_gpus, one_gpu, suite_config};

use collective_core::{DType, Error};
use detcoll_protocol::IpcConfig;
use ipc_engine::{Device, IpcDevice};
use std::borrow::Borrow;
use std::sync::{Mutex, MutexGuard};

/// The device stream type of vendor `G` (`Collective::Stream` of its collective).
pub type StreamOf<G> = <<G as TestGpu>::Device as Device>::Stream;

/// What the GPU tests need from a vendor beyond [`IpcDevice`]: discovering and opening its
/// devices, an owned stream, host <-> device copies, and the standalone fused tree in both
/// arithmetics. Implemented once per vendor in its `tests/common/mod.rs` (on a unit type).
///
/// Memory comes from [`Device::alloc`] and the copy kernel of the randomized test is
/// [`Device::tree`] over one leaf, so those need nothing here.
pub trait TestGpu: Sized + 'static {
    /// The engine's device of this vendor.
    type Device: IpcDevice;
    /// An owned stream of [`TestGpu::Device`] (what the rank enqueues on).
    type Stream: Borrow<StreamOf<Self>> + Send + Sync;
    /// The standalone fused tree kernel, loaded on one device.
    type Tree;

    /// The runtime's name in skip messages ("CUDA", "HIP").
    const RUNTIME: &'static str;
    /// Device bytes every rank of a test world takes up front (see [`GpuRank`]).
    const REGION_BYTES: usize;
    /// The variable that must be `1` for [`Processes`] to run, and why it is needed.
    const PROCESS_ENV: (&'static str, &'static str);

    /// Number of devices, or why there are none usable (0 devices is an error).
    fn device_count() -> Result<usize, String>;
    /// Device `ordinal`, or why it cannot be opened. Opening one ordinal twice in a process
    /// must be cheap (a vendor keeps its contexts).
    fn open(ordinal: usize) -> Result<Self::Device, String>;
    /// A new stream of `device`, for one rank.
    fn new_stream(device: &Self::Device) -> Result<Self::Stream, String>;
    /// Waits for everything enqueued on `stream`.
    fn synchronize(stream: &Self::Stream) -> Result<(), String>;
    /// Copies `data` to device address `dst` and waits; called on a drained stream only.
    fn upload(stream: &Self::Stream, dst: u64, data: &[u8]) -> Result<(), String>;
    /// Copies `dst.len()` bytes from device address `src` and waits; called on a drained
    /// stream only.
    fn download(stream: &Self::Stream, src: u64, dst: &mut [u8]) -> Result<(), String>;

    /// The device of rank `rank` when every rank is a process of its own.
    fn process_ordinal(rank: usize) -> Result<usize, String>;
    /// The configuration a rank process builds its collective with, from the suite's
    /// (`config`), on `device` in a world of `world` processes.
    fn process_config(device: &Self::Device, world: usize, config: IpcConfig) -> Result<IpcConfig, String> {
        let _ = (device, world);
        Ok(config)
    }

    /// The fused tree kernel of `device`.
    fn tree(device: &Self::Device) -> Result<Self::Tree, String>;
    /// Enqueues `launch` (see [`TreeLaunch`]) on `stream`.
    ///
    /// # Safety
    /// Every input holds `count` readable and `out` `count` writable elements of `dtype`,
    /// device memory of the tree's device valid until `stream` has executed the launch; `out`
    /// overlaps no input; `stream` belongs to the tree's device.
    unsafe fn launch_tree(tree: &Self::Tree, launch: &TreeLaunch<'_>, stream: &Self::Stream) -> Result<(), Error>;
}

/// One launch of the standalone fused tree: `out[i] = tree(inputs[0][i], ..., inputs[W-1][i])`
/// for `i < count`, `W = inputs.len()`, in the hardware arithmetic or (`soft`) the software one
/// (widen to f32, one add, one rounding): both must give the dtype add's bits.
#[derive(Debug, Clone, Copy)]
pub struct TreeLaunch<'a> {
    pub inputs: &'a [u64],
    pub out: u64,
    pub count: usize,
    pub dtype: DType,
    pub soft: bool,
}

/// Number of `G` devices, or why there are none.
pub fn device_count<G: TestGpu>() -> Result<usize, String> {
    G::device_count()
}

/// Device `ordinal` of `G`, or `None` after printing "skipped: no `<runtime>` device (why)".
pub fn gpu_at<G: TestGpu>(ordinal: usize) -> Option<G::Device> {
    match G::device_count().and_then(|n| {
        if ordinal >= n {
            Err(format!("device {ordinal} asked for, the runtime reports {n}"))
        } else {
            G::open(ordinal)
        }
    }) {
        Ok(d) => Some(d),
        Err(e) => {
            collective_core::conformance::skip(&format!("no {} device ({e})", G::RUNTIME));
            None
        }
    }
}

/// The device the single-device tests use (device 0), or `None` after printing the skip.
pub fn gpu<G: TestGpu>() -> Option<G::Device> {
    gpu_at::<G>(0)
}

/// One world on the GPUs at a time: ranks of a world spin waiting for each other, and worlds
/// of concurrently running tests could together exceed what a GPU keeps resident.
pub fn gpu_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// The raw handle of `stream` (for launches through the engine's device), after the device's
/// own check that the stream is its.
pub fn raw_stream<G: TestGpu>(device: &G::Device, stream: &G::Stream) -> Result<ipc_engine::RawStream, Error> {
    device.raw_stream(stream.borrow())
}
