//! The collective handle of one rank and its per-call path: the HIP twin of
//! `cuda-ipc/src/collective.rs`, on the shared protocol (`collective_core::protocol`: layout,
//! plan, parameter packing, error-record decoding).
//!
//! Per call: closed/poison check (one atomic load and one volatile load of the host-mapped
//! error record), `validate`, `Plan`, parameter packing into a stack struct
//! ([`collective_core::protocol::params::pack`]), one `hipModuleLaunchKernel`. No host
//! synchronisation, no host allocation, no round trip.
//!
//! Nothing of this file has run on an AMD GPU (none was available): see docs/rocm.md.
use crate::BACKEND;
use crate::group::Staging;
use crate::kernels::Module;
use crate::result::{api, check};
use crate::runtime::{self, HostMapped, IpcMapping, Stream};
use crate::sys::{self, HipFunction, HipStream};
use collective_core::bootstrap::Bootstrap;
use collective_core::protocol::close::CloseOnce;
use collective_core::protocol::params::{
    self, CopyParams, Fixed, ParamsMany, ParamsSingle, RankMemory, THREADS, copy_grid,
};
use collective_core::protocol::status::{self, RECORD_WORDS};
use collective_core::protocol::{CLOSE_ACK, IpcConfig, Layout, Plan, Poison, close};
use collective_core::{Capabilities, Collective, Error, Io, Op, Route, validate, validate_many};
use core::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The kernels of one device: the loaded code object and the functions the collective launches.
#[derive(Debug)]
pub(crate) struct Kernels {
    pub(crate) module: Module,
    pub(crate) collective_single: HipFunction,
    pub(crate) collective_many: HipFunction,
    pub(crate) copy: HipFunction,
    /// The fused tree W inputs -> 1 output (`detcoll_tree`, [`crate::FusedTree`]): the packed
    /// hardware arithmetic the collectives use.
    pub(crate) tree: HipFunction,
    /// The same tree in the software arithmetic (`detcoll_tree_soft`), for parity tests.
    pub(crate) tree_soft: HipFunction,
    /// Most blocks of the world-1 copy kernel and of the fused tree (both grid-stride): 4
    /// blocks of `THREADS` per compute unit.
    pub(crate) grid: u32,
}

// SAFETY: module and function handles may be used from any thread of the process.
unsafe impl Send for Kernels {}
// SAFETY: launching the same function from several threads is allowed.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// Loads the code object for device `ordinal` and checks its ABI against
    /// [`params::abi_table`].
    pub(crate) fn load(ordinal: usize) -> Result<Arc<Kernels>, Error> {
        let module = Module::load(ordinal, params::abi_table())?;
        Ok(Arc::new(Kernels {
            collective_single: module.function("detcoll_collective_s")?,
            collective_many: module.function("detcoll_collective_m")?,
            copy: module.function("detcoll_copy")?,
            tree: module.function("detcoll_tree")?,
            tree_soft: module.function("detcoll_tree_soft")?,
            grid: (runtime::multiprocessors(ordinal)? * 4) as u32,
            module,
        }))
    }
}

/// One `hipModuleLaunchKernel` of `f` with `params` (a single by-value struct argument).
///
/// # Safety
/// `f` must be a kernel taking exactly one parameter of type `P`'s C twin; every address in
/// `params` must be valid for the kernel's accesses; `stream` must belong to the device `f`
/// was loaded on.
pub(crate) unsafe fn launch<P>(
    f: HipFunction,
    grid: u32,
    threads: u32,
    params: &P,
    stream: HipStream,
) -> Result<(), Error> {
    let api = api()?;
    let mut args = [(params as *const P).cast_mut().cast::<c_void>()];
    // SAFETY: forwarded from the caller; the runtime copies the parameter bytes before returning.
    let r = unsafe {
        (api.hipModuleLaunchKernel)(f, grid, 1, 1, threads, 1, 1, 0, stream, args.as_mut_ptr(), core::ptr::null_mut())
    };
    check(api, r, "hipModuleLaunchKernel")
}

/// Who owns the staging allocations a rank reads.
pub(crate) enum Owner {
    /// In-process ranks (threads) share every allocation; it is freed when the last rank of the
    /// group is dropped, so no rank can free memory another rank's kernel still reads.
    Group(#[allow(dead_code)] Arc<GroupShared>),
    /// One process per rank: this rank's allocation, and its mappings of the peers'.
    Process {
        own: Mutex<Option<Staging>>,
        mappings: Mutex<Vec<IpcMapping>>,
        #[allow(dead_code)]
        boot: Box<dyn Bootstrap>,
    },
}

impl std::fmt::Debug for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Group(_) => f.write_str("Owner::Group"),
            Owner::Process { .. } => f.write_str("Owner::Process"),
        }
    }
}

/// Allocations of an in-process group.
#[derive(Debug)]
pub(crate) struct GroupShared {
    /// Held only so that it is freed with the last rank.
    #[allow(dead_code)]
    pub(crate) staging: Vec<Staging>,
}

/// The protocol state of a rank of a world of 2 or more.
#[derive(Debug)]
pub(crate) struct IpcState {
    pub(crate) kernels: Arc<Kernels>,
    pub(crate) layout: Layout,
    pub(crate) fixed: Fixed,
    /// Every rank's control block and frames, as this rank addresses them.
    pub(crate) mems: Vec<RankMemory>,
    pub(crate) err: HostMapped,
    pub(crate) owner: Owner,
}

/// One rank of a HIP IPC collective.
///
/// `Collective::Stream` is [`crate::runtime::Stream`]; the `enqueue*` methods take a raw
/// `hipStream_t` instead (unsafe).
///
/// Views passed in an [`Io`] must be device memory this rank's device can address (its own
/// allocations, or mapped pinned host memory): the kernel dereferences them.
#[derive(Debug)]
pub struct HipIpcCollective {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) device: usize,
    pub(crate) config: IpcConfig,
    pub(crate) ipc: Option<IpcState>,
    /// World 1: the copy kernel; `None` when no code object could be loaded, then
    /// `hipMemcpyAsync` is used.
    pub(crate) local_copy: Option<Arc<Kernels>>,
    pub(crate) poison: Poison,
    pub(crate) closed: AtomicBool,
    pub(crate) close_once: CloseOnce,
}

impl HipIpcCollective {
    /// The HIP device ordinal this rank's kernels run on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The configuration this collective was built with (blocks resolved).
    pub fn config(&self) -> &IpcConfig {
        &self.config
    }

    /// Bytes of device staging (control lines and frames) this rank retains; 0 for world 1.
    pub fn staging_bytes(&self) -> usize {
        self.ipc.as_ref().map_or(0, |ipc| ipc.layout.total_bytes())
    }

    /// Where the code object came from; `None` when none is loaded (world 1 without one).
    pub fn kernel_origin(&self) -> Option<&str> {
        self.ipc.as_ref().map(|s| &s.kernels).or(self.local_copy.as_ref()).map(|k| k.module.origin.as_str())
    }

    /// World 1, out of place: one copy.
    fn copy_local(&self, dst: u64, src: u64, bytes: usize, stream: HipStream) -> Result<(), Error> {
        if src == dst || bytes == 0 {
            return Ok(());
        }
        let r = match &self.local_copy {
            Some(k) => {
                let p = CopyParams { dst, src, bytes: bytes as u64 };
                // SAFETY: `detcoll_copy` takes `DcCopyParams`; validated, non-overlapping device
                // ranges of `bytes` bytes.
                unsafe { launch(k.copy, copy_grid(bytes, k.grid), THREADS, &p, stream) }
            }
            None => {
                let (d, s) = (dst as *mut c_void, src as *const c_void);
                // SAFETY: as above.
                unsafe { runtime::memcpy_async(d, s, bytes, sys::HIP_MEMCPY_DEVICE_TO_DEVICE, stream) }
            }
        };
        r.map_err(|e| self.fail(e))
    }

    /// Reports a failure a kernel of this rank recorded. Calls are asynchronous: synchronise
    /// the stream first to learn whether the calls enqueued so far succeeded. The first report
    /// of a failure is its typed error (`PeerTimeout`, `SignatureMismatch`, ...); from then on
    /// the collective is poisoned and every call returns [`Error::Poisoned`].
    pub fn check(&self) -> Result<(), Error> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.poison.check()?;
        if let Some(ipc) = &self.ipc {
            if ipc.err.read(0) != 0 {
                let mut w = [0u64; RECORD_WORDS];
                for (i, x) in w.iter_mut().enumerate() {
                    *x = ipc.err.read(i);
                }
                return Err(self.poison.record(status::decode(&w, self.config.timeouts().peer, BACKEND)));
            }
        }
        Ok(())
    }

    fn route_of(&self, op: Op, bytes: usize) -> Route {
        if self.world == 1 {
            Route::Local
        } else if op == Op::AllReduce && bytes > 0 && bytes >= self.config.rsag_threshold {
            Route::IpcReduceScatterAllGather
        } else {
            Route::IpcOneShot
        }
    }

    fn fail(&self, e: Error) -> Error {
        self.poison.record(e)
    }

    /// Enqueues one single-lane call on a raw stream.
    ///
    /// # Safety
    /// `stream` must be a live stream of this rank's device (or null for its default stream),
    /// and the views in `io` must be device-addressable memory that stays valid and otherwise
    /// untouched until the stream has executed the call.
    pub unsafe fn enqueue(&self, op: Op, io: Io<'_>, stream: HipStream) -> Result<(), Error> {
        self.check()?;
        let call = validate(op, &io, self.rank, self.world, self.config.capacity)?;
        runtime::set_device(self.device)?;
        let Some(ipc) = &self.ipc else {
            return self.copy_local(call.dst, call.src, call.bytes_out(), stream);
        };
        let route = self.route_of(op, call.bytes_in());
        let plan = Plan::single(&call, self.rank, self.world, route)?;
        let p: ParamsSingle = params::pack(&ipc.fixed, &plan, call.in_place && op == Op::AllGather, BACKEND)?;
        // SAFETY: the single-lane kernel takes `DcParams<16>`; the addresses are the group's
        // allocations (alive while `self` is) and the caller's validated views.
        unsafe { launch(ipc.kernels.collective_single, p.h.grid, ipc.fixed.threads, &p, stream) }
            .map_err(|e| self.fail(e))
    }

    /// Enqueues a `reduce_scatter_many` on a raw stream.
    ///
    /// # Safety
    /// As [`HipIpcCollective::enqueue`], for every lane.
    pub unsafe fn enqueue_many(&self, lanes: &[Io<'_>], stream: HipStream) -> Result<(), Error> {
        self.check()?;
        let (calls, sig) = validate_many(lanes, self.rank, self.world, self.config.capacity)?;
        runtime::set_device(self.device)?;
        let Some(ipc) = &self.ipc else {
            for l in &calls {
                self.copy_local(l.call.dst, l.call.src, l.call.bytes_out(), stream)?;
            }
            return Ok(());
        };
        let plan = Plan::many(&calls, sig, self.rank);
        let p: ParamsMany = params::pack(&ipc.fixed, &plan, false, BACKEND)?;
        // SAFETY: the many-lane kernel takes `DcParams<32>`; addresses as in `enqueue`.
        unsafe { launch(ipc.kernels.collective_many, p.h.grid, ipc.fixed.threads, &p, stream) }
            .map_err(|e| self.fail(e))
    }

    fn check_stream(&self, stream: &Stream) -> Result<(), Error> {
        if stream.device() == self.device {
            Ok(())
        } else {
            Err(Error::InvalidConfig {
                detail: format!(
                    "the stream belongs to HIP device {}, this rank runs on {}",
                    stream.device(),
                    self.device
                ),
            })
        }
    }

    /// Close of a process-mode rank: wait (bounded) until every peer acknowledged, then free.
    fn wait_acks_and_free(&self, ipc: &IpcState) -> Result<(), Error> {
        let Owner::Process { own, mappings, .. } = &ipc.owner else { return Ok(()) };
        let base = ipc.mems[self.rank].control;
        let missing =
            close::first_missing_ack(&ipc.layout, self.rank, self.world, self.config.timeouts().close, |off| {
                let mut w = [0u8; 8];
                runtime::copy_to_host(base + off as u64, &mut w)?;
                Ok(u64::from_le_bytes(w))
            })?;
        // Our mappings of the peers' memory are no longer used by any kernel of ours.
        if let Ok(mut m) = mappings.lock() {
            m.clear();
        }
        let mut own =
            own.lock().map_err(|_| Error::Backend { backend: BACKEND, detail: "staging lock poisoned".into() })?;
        match missing {
            None => {
                own.take();
                Ok(())
            }
            Some(peer) => {
                // A peer might still read our frames: keep them allocated rather than free
                // memory under it.
                if let Some(s) = own.as_mut() {
                    s.leak();
                }
                own.take();
                Err(Error::PeerTimeout { peer, what: "acknowledge close", waited: self.config.timeouts().close })
            }
        }
    }
}

impl Collective for HipIpcCollective {
    type Stream = Stream;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn capabilities(&self) -> Capabilities {
        // Generations live on the device, as on CUDA; HIP graph capture is not exercised (no
        // AMD GPU was available), so it is not claimed.
        Capabilities::strict(self.config.capacity, false)
    }
    fn route(&self, op: Op, bytes: usize) -> Route {
        self.route_of(op, bytes)
    }
    fn all_reduce(&self, io: Io<'_>, stream: &Stream) -> Result<(), Error> {
        self.check_stream(stream)?;
        // SAFETY: the stream is this device's; the views' validity is the contract of their
        // (unsafe) constructors, documented on this type.
        unsafe { self.enqueue(Op::AllReduce, io, stream.raw()) }
    }
    fn all_gather(&self, io: Io<'_>, stream: &Stream) -> Result<(), Error> {
        self.check_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue(Op::AllGather, io, stream.raw()) }
    }
    fn reduce_scatter(&self, io: Io<'_>, stream: &Stream) -> Result<(), Error> {
        self.check_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue(Op::ReduceScatter, io, stream.raw()) }
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], stream: &Stream) -> Result<(), Error> {
        self.check_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue_many(lanes, stream.raw()) }
    }

    /// Synchronises this rank's device (no kernel of ours may still read a peer), writes
    /// `CLOSE_ACK` into every peer's `ack[rank]` line (a `hipMemcpy` to the peer pointer), then:
    /// * one process per rank: waits (bounded by `timeouts.close`) for every peer's
    ///   acknowledgement in its own block, unmaps the peers and frees its staging — or, on
    ///   timeout, keeps the staging allocated (a peer may still read it) and returns
    ///   `PeerTimeout`;
    /// * in-process group: returns; the shared allocations are freed with the last rank.
    ///
    /// A second close returns `Ok` after a successful one and [`Error::CloseFailed`] after a
    /// failed one.
    fn close(&self) -> Result<(), Error> {
        self.close_once.run(|| self.close_now())
    }
}

impl HipIpcCollective {
    fn close_now(&self) -> Result<(), Error> {
        self.closed.store(true, Ordering::Release);
        let Some(ipc) = &self.ipc else { return Ok(()) };
        let api = api()?;
        runtime::set_device(self.device)?;
        // SAFETY: plain call on the current device.
        check(api, unsafe { (api.hipDeviceSynchronize)() }, "hipDeviceSynchronize")?;
        for q in (0..self.world).filter(|&q| q != self.rank) {
            runtime::copy_to_device(&CLOSE_ACK.to_le_bytes(), ipc.mems[q].control + ipc.layout.ack(self.rank) as u64)?;
        }
        self.wait_acks_and_free(ipc)
    }
}

impl Drop for HipIpcCollective {
    fn drop(&mut self) {
        let _ = self.close();
    }
}
