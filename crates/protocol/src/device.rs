//! The one small trait a device implements (the wgpu-hal of detcoll): memory, IPC
//! export/import, kernels, launches, streams and events. Everything above it — the IPC
//! collective ((`ipc_engine::IpcCollective`)) and the NCCL/RCCL transport (`ccl-transport`) — is
//! written once. The CUDA implementation lives in `cuda-ipc` (cudarc), the HIP one in `hip-ipc`
//! (our own runtime-loaded binding), the host one in `shm-ipc` (`HostDevice`: host memory, and
//! the reference executor of the kernel ABI as its kernel); they differ only where the
//! hardware does.
use crate::norm::NormArgs;
use crate::params::{CollectiveNormParams, CopyParams, ParamsMany, ParamsSingle, RankMemory};
use crate::status::RECORD_WORDS;
use crate::{Header, Layout};
use collective_core::{DType, Error};
use core::ffi::c_void;
use core::fmt;
use std::sync::Arc;
use std::time::Duration;

/// A raw stream handle (`CUstream` / `hipStream_t`; null is the legacy default stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawStream(pub *mut c_void);

// SAFETY: a stream handle is an opaque token that may be passed between threads; every use of
// it goes through an unsafe function whose caller vouches for its validity.
unsafe impl Send for RawStream {}
// SAFETY: as above.
unsafe impl Sync for RawStream {}

impl RawStream {
    /// Identity of the stream, for "same stream as last time" checks.
    pub fn key(self) -> usize {
        self.0 as usize
    }
}

/// Which vendor a device is: NCCL drives CUDA streams, RCCL HIP streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Vendor {
    /// NVIDIA (CUDA, `libnccl.so.2`).
    Nvidia,
    /// AMD (ROCm/HIP, `librccl.so.1`).
    Amd,
    /// The host (the CPU twin's executor): no transport library.
    Host,
}

/// The kernel parameter block of one collective launch: which entry point takes it.
#[derive(Debug, Clone, Copy)]
pub enum Launch<'a> {
    /// `detcoll_collective_s` (single-lane calls).
    Single(&'a ParamsSingle),
    /// `detcoll_collective_m` (`reduce_scatter_many`).
    Many(&'a ParamsMany),
    /// `detcoll_copy` (world 1).
    Copy(&'a CopyParams),
    /// `detcoll_collective_norm`: the last launch of a fused all_reduce + residual + RMSNorm,
    /// the collective of `params.call` and then the norm of `args` (`params.norm`, packed from
    /// them) as one kernel. A host executor runs the two in that order.
    SingleNorm { params: &'a CollectiveNormParams, args: &'a NormArgs },
}

/// What the NCCL/RCCL transport needs from a GPU runtime: streams, plain memory, copies,
/// events and the local fixed-tree kernel. [`IpcDevice`] adds what the IPC engine needs.
///
/// Implementations must make every enqueuing call asynchronous on the given stream and
/// evaluate [`Device::tree`] exactly as the fixed balanced rank tree of `fixed-tree` (the
/// kernels of `kernels/`), so that every route gives the same bits.
pub trait Device: Send + Sync + fmt::Debug + Sized + 'static {
    /// The safe stream type of `Collective::Stream`.
    type Stream: ?Sized;
    /// An owned plain device allocation, freed on drop.
    type Allocation: Send + Sync + fmt::Debug;
    /// An event ordering work across streams, destroyed on drop.
    type Event: Send + Sync + fmt::Debug;

    /// The vendor, which picks the transport library.
    const VENDOR: Vendor;

    /// Device and kernel origin, for logs and bench output.
    fn describe(&self) -> String;
    /// The raw handle of `stream`, after checking it belongs to this device.
    fn raw_stream(&self, stream: &Self::Stream) -> Result<RawStream, Error>;
    /// Makes this device current on the calling thread.
    fn bind(&self) -> Result<(), Error>;
    /// Loads what [`Device::tree`] runs for `world` inputs (compiling it if need be), so that a
    /// missing compiler or a stale image fails at construction, not at the first reduction.
    /// `world` is a kernel world (1 to 8): a collective of more ranks asks for each world its
    /// multi-pass trees launch (the transport: 8, the blocks' remainders and the last pass's).
    fn load_tree(&self, world: usize) -> Result<(), Error> {
        let _ = world;
        Ok(())
    }

    /// Allocates `bytes` of plain device memory.
    fn alloc(&self, bytes: usize) -> Result<Self::Allocation, Error>;
    /// Device address of an allocation (at least 256-byte aligned).
    fn address(&self, allocation: &Self::Allocation) -> u64;
    /// Keeps `allocation`'s memory allocated forever (it may still be in use by a kernel that
    /// could not be stopped).
    fn leak(&self, allocation: Self::Allocation);

    /// Enqueues a device-to-device copy of `bytes` bytes.
    ///
    /// # Safety
    /// Both ranges are device memory of this device, valid until `stream` has executed the
    /// copy; they do not overlap; `stream` is a live stream of this device.
    unsafe fn copy(&self, dst: u64, src: u64, bytes: usize, stream: RawStream) -> Result<(), Error>;

    /// Enqueues a copy of `bytes` bytes from device memory `src` to host memory `dst`: how a
    /// transport that runs on the host (the host-staged transport of ranks sharing a GPU) reads
    /// a call's device bytes. Binds the device first. The copy may still be in flight when this
    /// returns (a runtime may return before the DMA lands even for pageable memory): read `dst`
    /// only after [`Device::synchronize_stream`].
    ///
    /// # Safety
    /// `src` is device memory of this device, readable for `bytes` bytes until `stream` has
    /// executed the copy; `dst` is host memory writable for `bytes` bytes, valid and otherwise
    /// untouched until `stream` has executed the copy; `stream` is a live stream of this device.
    unsafe fn copy_to_host(&self, dst: *mut u8, src: u64, bytes: usize, stream: RawStream) -> Result<(), Error>;

    /// Enqueues a copy of `bytes` bytes from host memory `src` to device memory `dst` (the way
    /// back of [`Device::copy_to_host`]). Binds the device first. `src` must stay valid until
    /// the stream has executed the copy: synchronise the stream before freeing or reusing it.
    ///
    /// # Safety
    /// `dst` is device memory of this device, writable for `bytes` bytes until `stream` has
    /// executed the copy; `src` is host memory readable for `bytes` bytes, valid and unchanged
    /// until `stream` has executed the copy; `stream` is a live stream of this device.
    unsafe fn copy_from_host(&self, dst: u64, src: *const u8, bytes: usize, stream: RawStream) -> Result<(), Error>;

    /// Enqueues `out[i] = tree(inputs[0][i], ..., inputs[W-1][i])` for `i < count`, `W =
    /// inputs.len()` in 1..=8 (the canonical tree of that many ranks), in `dtype`'s own arithmetic.
    ///
    /// # Safety
    /// Every input holds `count` readable and `out` `count` writable elements of `dtype`,
    /// device memory valid until `stream` has executed the kernel; `out` overlaps no input;
    /// `stream` is a live stream of this device.
    unsafe fn tree(&self, inputs: &[u64], out: u64, count: usize, dtype: DType, stream: RawStream)
    -> Result<(), Error>;

    /// A new event.
    fn event(&self) -> Result<Self::Event, Error>;
    /// Records `event` at the current end of `stream`.
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn record(&self, event: &Self::Event, stream: RawStream) -> Result<(), Error>;
    /// Makes later work on `stream` wait for `event`'s last recording.
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn wait_event(&self, stream: RawStream, event: &Self::Event) -> Result<(), Error>;
    /// Whether the work before `event`'s last recording has completed (never blocks).
    fn event_done(&self, event: &Self::Event) -> Result<bool, Error>;
    /// Whether every operation enqueued on `stream` so far has completed (never blocks).
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn stream_done(&self, stream: RawStream) -> Result<bool, Error>;
    /// Whether `stream` is being captured into a graph (work enqueued on it does not run now).
    /// The default: never (runtimes without capture).
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn is_capturing(&self, stream: RawStream) -> Result<bool, Error> {
        let _ = stream;
        Ok(false)
    }
    /// Blocks until every operation enqueued on `stream` so far has completed. The default
    /// polls [`Device::stream_done`]; runtimes override it with their own stream
    /// synchronisation.
    ///
    /// # Safety
    /// `stream` is a live stream of this device.
    unsafe fn synchronize_stream(&self, stream: RawStream) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        while !unsafe { self.stream_done(stream) }? {
            std::thread::yield_now();
        }
        Ok(())
    }

    /// The tree over `world` inputs stacked rank-major `stride` bytes apart from `first` —
    /// the layout an all_gather leaves in the workspace. This is exactly what the transport
    /// launches after each gather.
    ///
    /// `world` is the kernel's: 1 to 8 ([`collective_core::MAX_NODE_WORLD_SIZE`]); anything
    /// else is [`Error::UnsupportedWorldSize`], before any launch. A collective of more ranks
    /// (up to [`collective_core::MAX_WORLD_SIZE`]) never asks for more: the transport's plan
    /// evaluates its canonical tree in passes of at most 8 inputs each (blocks of 8
    /// consecutive inputs, then the tree over the block partials: the same tree, see
    /// `ccl-transport`'s `plan` module).
    ///
    /// # Safety
    /// As [`Device::tree`] for inputs `first + q * stride`, `q < world`.
    #[allow(clippy::too_many_arguments)] // the kernel's parameters, one for one
    unsafe fn tree_stacked(
        &self,
        first: u64,
        stride: usize,
        world: usize,
        out: u64,
        count: usize,
        dtype: DType,
        stream: RawStream,
    ) -> Result<(), Error> {
        collective_core::check_node_world_size(world)?;
        let mut inputs = [0u64; 8];
        for (q, x) in inputs.iter_mut().enumerate().take(world) {
            *x = first + (q * stride) as u64;
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.tree(&inputs[..world], out, count, dtype, stream) }
    }
}

/// What the IPC engine needs on top of [`Device`]: protocol memory, IPC export/import, the
/// collective kernels and their launch, the host-mapped error record.
///
/// Implementations run the kernels of `kernels/` unchanged (the protocol lives there). A
/// device value is cheap to clone (reference-counted handles) and names one GPU in one context
/// of this process.
pub trait IpcDevice: Device + Clone {
    /// One rank's protocol memory (control block and two frames: one allocation or two),
    /// zeroed, header written; freed on drop.
    type Staging: Send + Sync + fmt::Debug;
    /// A peer process's staging mapped into this one (IPC), unmapped on drop.
    type PeerMapping: Send + Sync + fmt::Debug;
    /// The loaded kernels of this device.
    type Kernels: Send + Sync + fmt::Debug;
    /// Host-mapped memory the kernels write failures into, [`RECORD_WORDS`] words.
    type Record: Send + Sync + fmt::Debug;

    /// Backend name in [`Error::Backend`].
    const BACKEND: &'static str;
    /// Whether captured graphs of this runtime replay the collectives correctly (tested).
    const GRAPH_CAPTURE: bool;
    /// Whether this runtime's fused norm launch can read the gathered sums in place
    /// ([`CollectiveNormParams::new`]; CUDA and the host executor, not HIP: the kernel's
    /// warp-per-row form is written for 32-wide warps).
    const NORM_READS_GATHERED: bool = false;
    /// Whether this runtime's fused one-shot launch normalises rows of one protocol tile in
    /// registers right after their reduce however many rows a block has (the row loop,
    /// `dc_norm_rows_kept` in kernels/detcoll_norm.h), and rows of two tiles when each has a
    /// block of its own however many blocks stage them (`dc_norm_two_tile_rows`): CUDA; the host
    /// executor runs every launch's rows whatever their form, so it says yes too and its front
    /// door takes the same forms.
    const NORM_ROW_LOOP: bool = false;

    // ---- identity ----

    /// A stable identity of the physical GPU (CUDA: its UUID; HIP: from its PCI bus id), so
    /// ranks of different processes can tell they share one.
    fn identity(&self) -> Result<[u8; 16], Error>;
    /// Multiprocessors (CUDA SMs, AMD compute units): the kernels' block budget.
    fn multiprocessors(&self) -> Result<usize, Error>;
    /// Whether `other` is the same GPU in the same context as `self`.
    fn same_device(&self, other: &Self) -> bool;
    /// Lets kernels on `self` read `to`'s memory (no-op on the same device); an error if the
    /// devices cannot reach each other.
    fn enable_peer_access(&self, to: &Self) -> Result<(), Error>;
    /// Waits for every operation of this device's context (bounded by the driver).
    fn synchronize(&self) -> Result<(), Error>;
    /// The kernels' bound on one wait in the units of their clock (CUDA `%globaltimer`:
    /// nanoseconds; AMD `s_memrealtime`: ticks of the device's wall clock rate).
    fn wait_bound(&self, timeout: Duration) -> Result<u64, Error> {
        Ok(u64::try_from(timeout.as_nanos()).unwrap_or(u64::MAX))
    }

    // ---- kernels ----

    /// The kernels of `kernels/` that run collectives of `world` ranks on this device, loaded
    /// once (prebuilt, or compiled at run time for the worlds asked for: a run-time compiler's
    /// time grows with every world instantiated) and ABI-checked.
    fn kernels(&self, world: usize) -> Result<Arc<Self::Kernels>, Error>;
    /// Where `kernels` came from (a file, or the run-time compiler and target).
    fn kernel_origin(kernels: &Self::Kernels) -> String;
    /// Most blocks of the grid-stride kernels (copy, tree): enough to fill the device.
    fn grid_limit(kernels: &Self::Kernels) -> u32;
    /// Enqueues one launch of the entry point that takes `params`, `grid` blocks of
    /// [`crate::params::THREADS`] threads.
    ///
    /// # Safety
    /// Every address in `params` must be valid for the kernel's accesses until `stream` has
    /// executed it; `stream` is a live stream of this device.
    unsafe fn launch(
        &self,
        kernels: &Self::Kernels,
        params: Launch<'_>,
        grid: u32,
        stream: RawStream,
    ) -> Result<(), Error>;

    // ---- protocol memory ----

    /// Allocates and initialises one rank's staging for `layout` (zeroed, `header` written)
    /// with synchronous calls, so every later launch sees it.
    fn alloc_staging(&self, layout: &Layout, header: &Header) -> Result<Self::Staging, Error>;
    /// Where the kernels of this process address `staging`.
    fn staging_memory(staging: &Self::Staging, layout: &Layout) -> RankMemory;
    /// Keeps `staging` allocated forever (a peer may still read it).
    fn leak_staging(staging: Self::Staging);
    /// The process id of rank `peer` when this device knows its process has exited (ranks that
    /// are processes of this host whose liveness the device watches: the CPU twin's); `None`
    /// otherwise, and for ranks that are threads. Close does not wait for the acknowledgement
    /// of a peer that exited. GPU devices answer `None`: a peer process in another PID
    /// namespace cannot be told from a dead one, and freeing memory it still maps is not safe.
    fn peer_exited(&self, peer: usize) -> Option<u32> {
        let _ = peer;
        None
    }
    /// The bytes a peer process passes to [`IpcDevice::import_staging`].
    fn export_staging(&self, staging: &Self::Staging) -> Result<Vec<u8>, Error>;
    /// Maps rank `peer`'s exported staging; malformed bytes are an error before any runtime
    /// call.
    fn import_staging(&self, peer: usize, exported: &[u8]) -> Result<Self::PeerMapping, Error>;
    /// Where the kernels of this process address a mapped peer staging.
    fn mapping_memory(mapping: &Self::PeerMapping, layout: &Layout) -> RankMemory;
    /// Copies `words.len()` words from device address `src` (synchronous).
    fn read_words(&self, src: u64, words: &mut [u64]) -> Result<(), Error>;
    /// Writes one word to device address `dst` (synchronous).
    fn write_word(&self, dst: u64, value: u64) -> Result<(), Error>;
    /// A zeroed, host-mapped error record of [`RECORD_WORDS`] words.
    fn error_record(&self) -> Result<Self::Record, Error>;
    /// The device address kernels write the record at.
    fn record_address(record: &Self::Record) -> u64;
    /// The record as the host sees it now (volatile reads; word 0 is the code, 0 = healthy,
    /// written last by the kernel).
    fn record_words(record: &Self::Record) -> [u64; RECORD_WORDS];
    /// Word 0 of the record alone: the per-call health check.
    fn record_code(record: &Self::Record) -> u64;
}
