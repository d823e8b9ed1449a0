//! The NCCL communicator: created through a [`Bootstrap`], every wait bounded, destroyed on
//! drop (aborted when it failed).
//!
//! Communicators are created non-blocking by default (`ncclConfig_t::blocking = 0`): then no
//! NCCL call blocks the host. A call that cannot finish at once (communicator creation, the
//! first call that sets up connections, finalize) returns `ncclInProgress`, and we poll
//! `ncclCommGetAsyncError` until the state is `ncclSuccess` — with a time bound. Past the
//! bound, or on any error, the communicator is aborted (`ncclCommAbort`, which also stops its
//! in-flight kernels) and the caller gets an error instead of a hang. NCCL requires exactly
//! this: after `ncclInProgress`, query until success before the next NCCL call or any kernel
//! on the stream.
use crate::error::NcclError;
use crate::result::Progress;
use crate::sys::{NcclLibrary, cudaStream_t, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclUniqueId};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;
use core::ffi::{c_int, c_void};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How a communicator is created and bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommOptions {
    /// NCCL's blocking mode. `false` (default) makes every wait bounded; `true` lets NCCL
    /// block inside calls (creation, connection setup, destroy) without a bound.
    pub blocking: bool,
    /// Bound on one call staying `ncclInProgress`, and on finalize at close.
    pub timeout: Duration,
    /// Bound on creation: every rank must join `ncclCommInitRank` within this.
    pub init_timeout: Duration,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions { blocking: false, timeout: Duration::from_secs(10), init_timeout: Duration::from_secs(120) }
    }
}

/// One rank's NCCL (or RCCL) communicator.
///
/// Calls that enqueue work take `&mut self`: NCCL forbids concurrent calls on one
/// communicator, and the owner ([`crate::TransportCollective`]) serialises them under its
/// lock. [`Communicator::async_error`] takes `&self`: `ncclCommGetAsyncError` may be called
/// concurrently with other calls (watchdog threads do).
#[derive(Debug)]
pub struct Communicator {
    lib: Arc<NcclLibrary>,
    /// Null once aborted or destroyed.
    comm: ncclComm_t,
    rank: usize,
    world: usize,
    opts: CommOptions,
    /// Set by a failure: drop aborts instead of destroying.
    failed: bool,
    /// Inside `group`: calls must not wait for `ncclInProgress` before `ncclGroupEnd`.
    in_group: bool,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time (`&mut self`).
unsafe impl Send for Communicator {}
// SAFETY: the only `&self` entry point that reaches NCCL is `ncclCommGetAsyncError`, which NCCL
// allows concurrently with other calls; everything that may free the handle takes `&mut self`.
unsafe impl Sync for Communicator {}

fn c_int_of(what: &str, v: usize) -> Result<c_int, NcclError> {
    c_int::try_from(v).map_err(|_| NcclError::InvalidArgument(format!("{what} {v} does not fit a C int")))
}

/// Polls with a short spin, then yields, then sleeps: most `ncclInProgress` periods end within
/// microseconds, but a rank waiting for a slow peer must not burn a core for seconds.
fn backoff(start: Instant, polls: &mut u32) {
    *polls += 1;
    if *polls < 64 {
        std::hint::spin_loop();
    } else if start.elapsed() < Duration::from_millis(2) {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(100));
    }
}

impl Communicator {
    /// Creates this rank's communicator: rank 0 makes the unique id, every rank receives it
    /// through `boot.all_gather_bytes` (rank 0's failure reaches every rank as an error), then
    /// every rank joins `ncclCommInitRankConfig` with `boot`'s rank and world size.
    ///
    /// The device NCCL binds the communicator to is the calling thread's current CUDA (HIP)
    /// device: make it current first. Collective: every rank of `boot` must call this.
    pub fn new(lib: Arc<NcclLibrary>, boot: &dyn Bootstrap, opts: CommOptions) -> Result<Communicator, Error> {
        let id = crate::agree::share_unique_id(boot, || lib.unique_id())?;
        Ok(Self::init_rank(lib, &id, boot.rank(), boot.world_size(), opts)?)
    }

    /// Joins the communicator `id` as `rank` of `world` (the id already shared by the caller):
    /// `ncclCommInitRankConfig` with `blocking = 0` polled until done within
    /// `opts.init_timeout`, or plain `ncclCommInitRank` in blocking mode.
    pub fn init_rank(
        lib: Arc<NcclLibrary>,
        id: &ncclUniqueId,
        rank: usize,
        world: usize,
        opts: CommOptions,
    ) -> Result<Communicator, NcclError> {
        let nranks = c_int_of("world size", world)?;
        let r = c_int_of("rank", rank)?;
        if rank >= world {
            return Err(NcclError::InvalidArgument(format!("rank {rank} is not below world size {world}")));
        }
        let mut comm: ncclComm_t = core::ptr::null_mut();
        let (code, call) = if opts.blocking {
            // SAFETY: out-pointer to a local; the id is 128 bytes passed by value as nccl.h
            // declares. Blocks until every rank joined (blocking mode has no bound).
            (unsafe { (lib.fns().ncclCommInitRank)(&mut comm, nranks, *id, r) }, "ncclCommInitRank")
        } else {
            let mut config = ncclConfig_t::initializer();
            config.blocking = 0;
            // SAFETY: as above; `config` is an initializer-built struct that outlives the call.
            let code = unsafe { (lib.fns().ncclCommInitRankConfig)(&mut comm, nranks, *id, r, &mut config) };
            (code, "ncclCommInitRankConfig")
        };
        let mut me = Communicator { lib, comm, rank, world, opts, failed: false, in_group: false };
        match me.lib.check(code, call, me.comm) {
            Ok(Progress::Done) => Ok(me),
            Ok(Progress::InProgress) => {
                me.wait(call, opts.init_timeout)?;
                Ok(me)
            }
            Err(e) => {
                me.failed = true;
                let _ = me.abort();
                Err(e)
            }
        }
    }

    /// Wraps a communicator handle of `lib` created elsewhere (tests: a fake NCCL's).
    #[cfg(test)]
    pub(crate) fn from_raw(
        lib: Arc<NcclLibrary>,
        comm: ncclComm_t,
        rank: usize,
        world: usize,
        opts: CommOptions,
    ) -> Communicator {
        Communicator { lib, comm, rank, world, opts, failed: false, in_group: false }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }
    /// Number of ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }
    /// The library this communicator runs on.
    pub fn library(&self) -> &Arc<NcclLibrary> {
        &self.lib
    }
    /// The options it was created with.
    pub fn options(&self) -> CommOptions {
        self.opts
    }
    /// Whether it can still be used (not aborted, destroyed or failed).
    pub fn is_usable(&self) -> bool {
        !self.comm.is_null() && !self.failed
    }
    /// The raw handle (null once aborted or destroyed), for calls this type does not wrap.
    pub fn raw(&self) -> ncclComm_t {
        self.comm
    }

    /// One `ncclCommGetAsyncError`: `Done` when healthy and idle, `InProgress` while NCCL is
    /// still carrying out a call, an error when the communicator failed (e.g. a peer died).
    pub fn async_error(&self) -> Result<Progress, NcclError> {
        if self.comm.is_null() {
            return Err(NcclError::Unusable("aborted or destroyed"));
        }
        let mut state = crate::sys::ncclResult_t::ncclSuccess;
        // SAFETY: live communicator, out-pointer to a local.
        let r = unsafe { (self.lib.fns().ncclCommGetAsyncError)(self.comm, &mut state) };
        self.lib.check_done(r, "ncclCommGetAsyncError")?;
        self.lib.check(state, "ncclCommGetAsyncError (communicator state)", self.comm)
    }

    /// Marks the communicator failed and aborts it; returns `e`. Inside a group the abort waits
    /// until `ncclGroupEnd` has closed the group ([`Communicator::group`] does it).
    fn fail(&mut self, e: NcclError) -> NcclError {
        self.failed = true;
        if !self.in_group {
            let _ = self.abort();
        }
        e
    }

    /// Polls the state until it is `ncclSuccess`, for at most `timeout`; aborts the
    /// communicator on an error or on timeout (so nothing keeps waiting on it).
    pub fn wait(&mut self, call: &'static str, timeout: Duration) -> Result<(), NcclError> {
        let start = Instant::now();
        let mut polls = 0;
        loop {
            match self.async_error() {
                Ok(Progress::Done) => return Ok(()),
                Ok(Progress::InProgress) => {}
                Err(e) => return Err(self.fail(e)),
            }
            if start.elapsed() >= timeout {
                return Err(self.fail(NcclError::Timeout { call, waited: timeout }));
            }
            backoff(start, &mut polls);
        }
    }

    /// One poll of the state (the check at the start of every collective call): `Ok` when
    /// healthy; waits (bounded) if a call is still in progress; aborts on an error.
    pub fn poll(&mut self) -> Result<(), NcclError> {
        match self.async_error() {
            Ok(Progress::Done) => Ok(()),
            Ok(Progress::InProgress) => self.wait("ncclCommGetAsyncError", self.opts.timeout),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// Result of an enqueuing call: done, or (outside a group) waited for; aborts on error.
    fn finish(&mut self, code: crate::sys::ncclResult_t, call: &'static str) -> Result<(), NcclError> {
        match self.lib.check(code, call, self.comm) {
            Ok(Progress::Done) => Ok(()),
            Ok(Progress::InProgress) if self.in_group => Ok(()),
            Ok(Progress::InProgress) => self.wait(call, self.opts.timeout),
            Err(e) => Err(self.fail(e)),
        }
    }

    fn live(&self) -> Result<ncclComm_t, NcclError> {
        if self.comm.is_null() || self.failed {
            Err(NcclError::Unusable("aborted or destroyed"))
        } else {
            Ok(self.comm)
        }
    }

    /// Runs `f` inside `ncclGroupStart`/`ncclGroupEnd` (NCCL fuses the calls into one launch);
    /// the group is closed even when `f` fails. Waits (bounded) for `ncclGroupEnd`'s progress.
    pub fn group<R>(&mut self, f: impl FnOnce(&mut Self) -> Result<R, NcclError>) -> Result<R, NcclError> {
        self.live()?;
        self.lib.group_start().map_err(|e| self.fail(e))?;
        self.in_group = true;
        let r = f(self);
        // The group is closed even after a failed call (NCCL requires balanced group calls);
        // only then is a failed communicator aborted.
        let end = self.lib.group_end(self.comm);
        self.in_group = false;
        let r = r.map_err(|e| self.fail(e))?;
        match end {
            Ok(Progress::Done) => Ok(r),
            Ok(Progress::InProgress) => self.wait("ncclGroupEnd", self.opts.timeout).map(|()| r),
            Err(e) => Err(self.fail(e)),
        }
    }

    /// `ncclAllGather` of `bytes` bytes per rank (as `ncclUint8`: the transport moves bytes, so
    /// any element type works) from `send` into `recv` (rank `q`'s bytes at `recv + q * bytes`).
    /// In place when `send == recv + rank * bytes`.
    ///
    /// # Safety
    /// `send` must hold `bytes` readable and `recv` `world * bytes` writable bytes of device
    /// memory of this communicator's device, valid until `stream` has executed the call;
    /// `stream` must be a live stream of that device.
    pub unsafe fn all_gather(
        &mut self,
        send: u64,
        recv: u64,
        bytes: usize,
        stream: cudaStream_t,
    ) -> Result<(), NcclError> {
        let comm = self.live()?;
        // SAFETY: forwarded from the caller.
        let code = unsafe {
            (self.lib.fns().ncclAllGather)(
                send as *const c_void,
                recv as *mut c_void,
                bytes,
                ncclDataType_t::ncclUint8,
                comm,
                stream,
            )
        };
        self.finish(code, "ncclAllGather")
    }

    /// `ncclSend` of `bytes` bytes to `peer` (inside a [`Communicator::group`] with the
    /// matching receives).
    ///
    /// # Safety
    /// As [`Communicator::all_gather`] for `bytes` readable bytes at `src`.
    pub unsafe fn send(&mut self, src: u64, bytes: usize, peer: usize, stream: cudaStream_t) -> Result<(), NcclError> {
        let comm = self.live()?;
        let peer = c_int_of("peer", peer)?;
        // SAFETY: forwarded from the caller.
        let code = unsafe {
            (self.lib.fns().ncclSend)(src as *const c_void, bytes, ncclDataType_t::ncclUint8, peer, comm, stream)
        };
        self.finish(code, "ncclSend")
    }

    /// `ncclRecv` of `bytes` bytes from `peer`.
    ///
    /// # Safety
    /// As [`Communicator::all_gather`] for `bytes` writable bytes at `dst`.
    pub unsafe fn recv(&mut self, dst: u64, bytes: usize, peer: usize, stream: cudaStream_t) -> Result<(), NcclError> {
        let comm = self.live()?;
        let peer = c_int_of("peer", peer)?;
        // SAFETY: forwarded from the caller.
        let code = unsafe {
            (self.lib.fns().ncclRecv)(dst as *mut c_void, bytes, ncclDataType_t::ncclUint8, peer, comm, stream)
        };
        self.finish(code, "ncclRecv")
    }

    /// Native `ncclAllReduce`: NOT deterministic (the library picks the operand order). Only
    /// for the non-strict reference timing of [`crate::nonstrict`].
    ///
    /// # Safety
    /// `send` and `recv` hold `count` elements of `dtype` (may be equal: in place); otherwise as
    /// [`Communicator::all_gather`].
    pub unsafe fn native_all_reduce(
        &mut self,
        send: u64,
        recv: u64,
        count: usize,
        dtype: ncclDataType_t,
        op: ncclRedOp_t,
        stream: cudaStream_t,
    ) -> Result<(), NcclError> {
        let comm = self.live()?;
        // SAFETY: forwarded from the caller.
        let code = unsafe {
            (self.lib.fns().ncclAllReduce)(send as *const c_void, recv as *mut c_void, count, dtype, op, comm, stream)
        };
        self.finish(code, "ncclAllReduce")
    }

    /// Native `ncclReduceScatter` (`recv_count` elements per rank): NOT deterministic. Only for
    /// the non-strict reference timing of [`crate::nonstrict`].
    ///
    /// # Safety
    /// `send` holds `world * recv_count` and `recv` `recv_count` elements of `dtype` (in place
    /// when `recv == send + rank * recv_count` elements); otherwise as
    /// [`Communicator::all_gather`].
    pub unsafe fn native_reduce_scatter(
        &mut self,
        send: u64,
        recv: u64,
        recv_count: usize,
        dtype: ncclDataType_t,
        op: ncclRedOp_t,
        stream: cudaStream_t,
    ) -> Result<(), NcclError> {
        let comm = self.live()?;
        // SAFETY: forwarded from the caller.
        let code = unsafe {
            (self.lib.fns().ncclReduceScatter)(
                send as *const c_void,
                recv as *mut c_void,
                recv_count,
                dtype,
                op,
                comm,
                stream,
            )
        };
        self.finish(code, "ncclReduceScatter")
    }

    /// Marks the communicator failed without aborting yet (drop will abort).
    pub fn mark_failed(&mut self) {
        self.failed = true;
    }

    /// `ncclCommAbort`: frees the communicator and stops its in-flight operations. Idempotent.
    pub fn abort(&mut self) -> Result<(), NcclError> {
        if self.comm.is_null() {
            return Ok(());
        }
        let comm = core::mem::replace(&mut self.comm, core::ptr::null_mut());
        self.failed = true;
        // SAFETY: a live communicator, aborted once (the handle is cleared first).
        let code = unsafe { (self.lib.fns().ncclCommAbort)(comm) };
        self.lib.check_done(code, "ncclCommAbort")
    }

    /// Orderly teardown, bounded by `timeout`: `ncclCommFinalize` (non-blocking mode, when the
    /// library has it) polled until done, then `ncclCommDestroy`. A failed communicator, a
    /// finalize error or timeout aborts instead. Idempotent.
    pub fn shutdown(&mut self, timeout: Duration) -> Result<(), NcclError> {
        if self.comm.is_null() {
            return Ok(());
        }
        if self.failed {
            return self.abort();
        }
        if let (false, Some(finalize)) = (self.opts.blocking, self.lib.fns().ncclCommFinalize) {
            // SAFETY: a live communicator.
            let code = unsafe { finalize(self.comm) };
            match self.lib.check(code, "ncclCommFinalize", self.comm) {
                Ok(Progress::Done) => {}
                Ok(Progress::InProgress) => self.wait("ncclCommFinalize", timeout)?,
                Err(e) => return Err(self.fail(e)),
            }
        }
        let comm = core::mem::replace(&mut self.comm, core::ptr::null_mut());
        // SAFETY: a live, finalized (or blocking-mode) communicator, destroyed once.
        let code = unsafe { (self.lib.fns().ncclCommDestroy)(comm) };
        self.lib.check_done(code, "ncclCommDestroy")
    }
}

impl Drop for Communicator {
    /// Destroys (bounded, see [`Communicator::shutdown`]) or, after a failure, aborts.
    fn drop(&mut self) {
        let _ = self.shutdown(self.opts.timeout);
    }
}
