//! [`TransportCollective`]: the deterministic collectives over NCCL/RCCL.
//!
//! Per call: closed/poison check, `validate` (before any device work), one
//! `ncclCommGetAsyncError` poll, a [`Plan`], then — under the collective's lock — the NCCL
//! calls and the local tree launches on the caller's stream. No host synchronisation except
//! when the workspace grows.
//!
//! Where asynchronous NCCL errors are polled, always with a bound:
//!
//! * at the start of every call ([`Communicator::poll`]): one `ncclCommGetAsyncError`;
//! * after every NCCL call that returns `ncclInProgress`: polled until done, at most
//!   `timeouts.peer` ([`Communicator::wait`]);
//! * in [`TransportCollective::synchronize`]: stream completion and the communicator's state
//!   are polled together; past the bound the communicator is aborted (stopping a hung kernel);
//! * in [`TransportCollective::poll_async_error`], for callers with their own watchdog;
//! * by the built-in watchdog thread ([`crate::watchdog`], on by default): every 1-5 ms, and
//!   it bounds each call's device time from when the call started on the device, so a caller
//!   that waits with its own stream synchronisation gets an error instead of a hang;
//! * at close: `ncclCommFinalize` polled until done, at most `timeouts.close`.
//!
//! Any failure after validation poisons the collective (every later call returns
//! [`Error::Poisoned`]) and aborts the communicator: its peers are in an unknown state.
use crate::agree::{self, Hello};
use crate::comm::Communicator;
use crate::config::TransportConfig;
use crate::device::{Device, RawStream};
use crate::error::{BACKEND, NcclError};
use crate::loader;
use crate::plan::{self, Addr, Exchange, Plan, Step, Transfer};
use crate::sys::NcclLibrary;
use crate::version::Version;
use crate::watchdog::{Call, Tracking, WatchdogThread, Watched};
use collective_core::bootstrap::Bootstrap;
use collective_core::process::ProcessOwner;
use collective_core::{Capabilities, Collective, Error, Io, Op, Route, validate, validate_many};
use detcoll_protocol::Poison;
use detcoll_protocol::Workspace;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// What the lock protects: the communicator (NCCL forbids concurrent calls on it), the
/// workspace, and the watchdog's producer side.
#[derive(Debug)]
pub(crate) struct State<D: Device> {
    pub(crate) comm: Communicator,
    pub(crate) ws: Workspace<D>,
    pub(crate) tracking: Tracking<D>,
}

impl<D: Device> Watched for State<D> {
    fn comm(&self) -> &Communicator {
        &self.comm
    }
    fn fail(&mut self, poison: &Poison, e: Error) -> Error {
        State::fail(self, poison, e)
    }
}

impl<D: Device> State<D> {
    /// Records a failure: poisons (for errors that leave peers in an unknown state) and aborts
    /// the communicator so nothing keeps waiting on it.
    pub(crate) fn fail(&mut self, poison: &Poison, e: Error) -> Error {
        let e = poison.record(e);
        if poison.is_poisoned() {
            let _ = self.comm.abort();
        }
        e
    }

    /// Runs `work` (the call's device work on `stream`) between the watchdog's start and end
    /// records.
    ///
    /// # Safety
    /// `stream` is a live stream of `dev`.
    pub(crate) unsafe fn tracked(
        &mut self,
        dev: &D,
        stream: RawStream,
        call: Call,
        work: impl FnOnce(&mut Self) -> Result<(), Error>,
    ) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        let ticket = unsafe { self.tracking.begin(dev, stream)? };
        let r = work(self);
        // SAFETY: as above; the stream `ticket` was begun on.
        let ended = unsafe { self.tracking.end(ticket, dev, stream, call) };
        r.and(ended)
    }
}

/// One rank of a deterministic collective over NCCL (NVIDIA) or RCCL (ROCm).
///
/// * all_gather: `ncclAllGather` straight into the caller's output (in place: NCCL's in-place
///   form);
/// * all_reduce / reduce_scatter / reduce_scatter_many: a rank-ordered `ncclAllGather` of the
///   inputs into a workspace, then the local fixed-tree kernel (the IPC twins' device code)
///   over the `W` stacked inputs — for `W > 8`, in passes of at most 8 inputs (block partials
///   in extra workspace, the same canonical tree: see the `plan` module). reduce_scatter
///   reduces only this rank's shard. NCCL never does arithmetic here, so the bits equal
///   `fixed-tree` and every other route. Any world from 1 to
///   [`collective_core::MAX_WORLD_SIZE`].
///
/// The native (non-deterministic) NCCL reductions exist only as a labelled benchmark
/// reference: see [`crate::nonstrict`].
///
/// Views passed in an [`Io`] must be device memory of this rank's device.
///
/// A watchdog thread (on by default, [`TransportConfig::watchdog`]) bounds every call's device
/// time: see [`crate::watchdog`].
#[derive(Debug)]
pub struct TransportCollective<D: Device> {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) config: TransportConfig,
    /// Shared with the watchdog thread (as are `poison` and `state`).
    pub(crate) device: Arc<D>,
    pub(crate) version: Version,
    pub(crate) library: String,
    pub(crate) poison: Arc<Poison>,
    pub(crate) closed: AtomicBool,
    pub(crate) state: Arc<Mutex<State<D>>>,
    /// The running watchdog; `None` when off or after close.
    pub(crate) watchdog: Mutex<Option<WatchdogThread<D>>>,
    /// The process that built this handle: it fails closed in a forked child.
    owner: ProcessOwner,
}

fn load_library(config: &TransportConfig, vendor: loader::Vendor) -> Result<Arc<NcclLibrary>, Error> {
    Ok(match &config.library {
        Some(path) => loader::load_path(path)?,
        None => loader::load(Some(vendor))?,
    })
}

impl<D: Device> TransportCollective<D> {
    /// Builds this rank's collective. Collective over `boot`: every rank builds its device
    /// side (`make_device`) and loads the library, then all ranks agree — the same library
    /// version and configuration everywhere, or every rank fails with one error naming the
    /// culprits (never a silent per-rank fallback) — and create the NCCL communicator
    /// (rank 0's unique id shared through `boot`).
    ///
    /// ```no_run
    /// use ccl_transport::{TransportCollective, TransportConfig};
    /// use collective_core::bootstrap::TcpBootstrap;
    /// let boot = TcpBootstrap::from_env().expect("rendezvous");
    /// let config = TransportConfig::new(1 << 20);
    /// let nccl = TransportCollective::with_device(|| cuda_ipc::CudaDevice::open(0), &boot, &config).expect("NCCL");
    /// # let _ = nccl;
    /// ```
    pub fn with_device(
        make_device: impl FnOnce() -> Result<D, Error>,
        boot: &dyn Bootstrap,
        config: &TransportConfig,
    ) -> Result<Self, Error> {
        Self::build(make_device, boot, config, true)
    }

    /// [`TransportCollective::with_device`] for a composer whose own agreement already compared
    /// every rank's library version and [`TransportConfig::agreement`] (the factory's): the
    /// handshake here exchanges readiness and the NCCL/RCCL unique id only.
    pub fn with_agreed_device(
        make_device: impl FnOnce() -> Result<D, Error>,
        boot: &dyn Bootstrap,
        config: &TransportConfig,
    ) -> Result<Self, Error> {
        Self::build(make_device, boot, config, false)
    }

    fn build(
        make_device: impl FnOnce() -> Result<D, Error>,
        boot: &dyn Bootstrap,
        config: &TransportConfig,
        check: bool,
    ) -> Result<Self, Error> {
        let world = boot.world_size();
        // Resolved inside the agreement: a rank whose environment is invalid reports it to
        // every peer instead of leaving them waiting.
        let resolved = config.resolved();
        let local = (|| {
            let config = resolved?;
            // Any world the canonical tree takes: the plans split trees over more than 8
            // inputs into passes of at most 8 (`plan::push_tree`).
            collective_core::check_world_size(world)?;
            // Everything that can fail locally happens before the agreement, so no rank drops
            // out after it and leaves its peers waiting in the unique-id exchange.
            let device = make_device()?;
            device.bind()?;
            // The kernel worlds the plans' tree steps launch (each at most 8), nothing else.
            for w in plan::tree_worlds(world) {
                device.load_tree(w)?;
            }
            let ws = Workspace::new(&device, BACKEND)?;
            let tracking = Tracking::new(&device, config.watchdog_bound())?;
            let lib = load_library(&config, D::VENDOR)?;
            let version = lib.version()?;
            let hello = Hello { version, words: config.agreement_words() };
            Ok(((device, ws, tracking, lib, version, config), hello))
        })();
        let (device, ws, tracking, lib, version, config) = agree::agree(boot, local, check)?;
        let library = lib.path().to_string();
        let comm = Communicator::new(lib, boot, config.comm_options())?;
        Self::assemble(&config, device, version, library, State { comm, ws, tracking })
    }

    /// The collective over a created communicator, its watchdog started. Failing to start it
    /// (the OS refused a thread) poisons, so the communicator is aborted on the way out.
    fn assemble(
        config: &TransportConfig,
        device: D,
        version: Version,
        library: String,
        state: State<D>,
    ) -> Result<Self, Error> {
        let ring = state.tracking.ring().cloned();
        let mut c = TransportCollective {
            rank: state.comm.rank(),
            world: state.comm.world_size(),
            config: config.clone(),
            device: Arc::new(device),
            version,
            library,
            poison: Arc::default(),
            closed: AtomicBool::new(false),
            state: Arc::new(Mutex::new(state)),
            watchdog: Mutex::new(None),
            owner: ProcessOwner::current(),
        };
        if let Some(ring) = ring {
            let w = WatchdogThread::spawn(c.rank, &ring, c.device.clone(), c.state.clone(), c.poison.clone())
                .map_err(|e| c.poison.record(e))?;
            *c.watchdog.get_mut().unwrap_or_else(PoisonError::into_inner) = Some(w);
        }
        Ok(c)
    }

    /// A collective over a communicator made elsewhere (tests: a fake NCCL's).
    #[cfg(test)]
    pub(crate) fn from_parts(device: D, comm: Communicator, config: &TransportConfig) -> Result<Self, Error> {
        let ws = Workspace::new(&device, BACKEND)?;
        let tracking = Tracking::new(&device, config.watchdog_bound())?;
        let library = comm.library().path().to_string();
        Self::assemble(config, device, Version::from_code(0), library, State { comm, ws, tracking })
    }

    /// Whether a watchdog thread runs (tests).
    #[cfg(test)]
    pub(crate) fn watchdog_running(&self) -> bool {
        self.watchdog.lock().is_ok_and(|w| w.as_ref().is_some_and(|w| !w.is_finished()))
    }

    /// The device side.
    pub fn device(&self) -> &D {
        &self.device
    }
    /// The configuration it was built with.
    pub fn config(&self) -> &TransportConfig {
        &self.config
    }
    /// The library's version (equal on every rank: checked at construction).
    pub fn library_version(&self) -> Version {
        self.version
    }
    /// The library file it runs on (`libnccl.so.2`, `librccl.so.1`, ...).
    pub fn library(&self) -> &str {
        &self.library
    }

    pub(crate) fn lock(&self) -> Result<MutexGuard<'_, State<D>>, Error> {
        self.state
            .lock()
            .map_err(|_| Error::Backend { backend: BACKEND, detail: "transport state lock poisoned by a panic".into() })
    }

    /// Bytes of device workspace retained between calls.
    pub fn workspace_bytes(&self) -> usize {
        self.lock().map(|s| s.ws.retained()).unwrap_or(0)
    }

    /// Grows the workspace to at least `bytes` now, so later calls up to that size never wait
    /// on the host to grow it. Local (no NCCL call): a failure here does not poison.
    pub fn reserve_workspace(&self, bytes: usize) -> Result<(), Error> {
        self.check_open()?;
        let mut st = self.lock()?;
        self.device.bind()?;
        st.ws.reserve(&self.device, bytes, self.config.timeouts().peer)
    }

    /// `Closed` after close, the recorded cause once poisoned.
    pub(crate) fn check_open(&self) -> Result<(), Error> {
        self.owner.check()?;
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        self.poison.check()
    }

    /// Records a failure ([`State::fail`]).
    pub(crate) fn fail(&self, st: &mut State<D>, e: Error) -> Error {
        st.fail(&self.poison, e)
    }

    /// Checks the communicator's asynchronous state now (one `ncclCommGetAsyncError`; a call
    /// still in progress is waited for, bounded). An error poisons the collective.
    pub fn poll_async_error(&self) -> Result<(), Error> {
        self.check_open()?;
        let mut st = self.lock()?;
        let r = st.comm.poll();
        r.map_err(|e| self.fail(&mut st, e.into()))
    }

    /// Waits until every call enqueued on `stream` so far has completed, polling the stream
    /// and the communicator's state for at most `timeout`. Past the bound the communicator is
    /// aborted (which stops a kernel waiting for a peer that never comes), the collective is
    /// poisoned, and an error is returned — never a hang.
    pub fn synchronize(&self, stream: &D::Stream, timeout: Duration) -> Result<(), Error> {
        let raw = self.device.raw_stream(stream)?;
        // SAFETY: `raw` comes from a live stream of this device, borrowed for this call.
        unsafe { self.synchronize_raw(raw, timeout) }
    }

    /// [`TransportCollective::synchronize`] on a raw stream.
    ///
    /// # Safety
    /// `stream` is a live stream of this collective's device.
    pub unsafe fn synchronize_raw(&self, stream: RawStream, timeout: Duration) -> Result<(), Error> {
        self.check_open()?;
        let start = Instant::now();
        loop {
            {
                let mut st = self.lock()?;
                if let Err(e) = st.comm.async_error() {
                    return Err(self.fail(&mut st, e.into()));
                }
            }
            // SAFETY: forwarded from the caller.
            if unsafe { self.device.stream_done(stream)? } {
                return Ok(());
            }
            if start.elapsed() >= timeout {
                let mut st = self.lock()?;
                return Err(self.fail(
                    &mut st,
                    NcclError::Timeout { call: "the stream's transport calls", waited: timeout }.into(),
                ));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }

    fn exchange_for(&self, bytes_in: usize) -> Exchange {
        if bytes_in >= self.config.all_to_all_threshold { Exchange::AllToAll } else { Exchange::AllGather }
    }

    /// Enqueues one single-lane call on a raw stream.
    ///
    /// # Safety
    /// `stream` is a live stream of this collective's device, and the views in `io` are device
    /// memory of that device that stays valid and otherwise untouched until the stream has
    /// executed the call.
    pub unsafe fn enqueue(&self, op: Op, io: Io<'_>, stream: RawStream) -> Result<(), Error> {
        self.check_open()?;
        // all_gather needs no workspace, so the capacity (a workspace bound) does not apply.
        let capacity = if op == Op::AllGather { usize::MAX } else { self.config.capacity };
        let call = validate(op, &io, self.rank, self.world, capacity)?;
        let plan = match op {
            Op::AllGather => Plan::all_gather(&call, self.world),
            Op::AllReduce => Plan::all_reduce(&call, self.world)?,
            Op::ReduceScatter | Op::ReduceScatterMany => {
                Plan::reduce_scatter(&call, self.rank, self.world, self.exchange_for(call.bytes_in()))?
            }
        };
        // SAFETY: forwarded from the caller; the plan only touches the validated views and
        // the workspace.
        unsafe { self.run(&plan, stream, Call::Strict(op)) }
    }

    /// Enqueues a `reduce_scatter_many` on a raw stream: packed into one all_gather when the
    /// lanes' payload is at most `pack_threshold` bytes, else one all_gather per lane; one
    /// tree per lane either way.
    ///
    /// # Safety
    /// As [`TransportCollective::enqueue`], for every lane.
    pub unsafe fn enqueue_many(&self, lanes: &[Io<'_>], stream: RawStream) -> Result<(), Error> {
        self.check_open()?;
        let (calls, sig) = validate_many(lanes, self.rank, self.world, self.config.capacity)?;
        let payload = sig.count as usize * sig.dtype.size();
        let plan = Plan::many(&calls, self.rank, self.world, payload <= self.config.pack_threshold)?;
        // SAFETY: as in `enqueue`.
        unsafe { self.run(&plan, stream, Call::Strict(Op::ReduceScatterMany)) }
    }

    /// Executes `plan` under the lock. Every call polls the communicator's state first, also
    /// calls with nothing to move (all ranks make the same calls, so empty calls are skipped
    /// by everyone alike).
    unsafe fn run(&self, plan: &Plan, stream: RawStream, call: Call) -> Result<(), Error> {
        let mut st = self.lock()?;
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Err(e) = st.comm.poll() {
            return Err(self.fail(&mut st, e.into()));
        }
        if plan.steps.is_empty() {
            return Ok(());
        }
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.execute(&mut st, plan, stream, call) };
        r.map_err(|e| self.fail(&mut st, e))
    }

    unsafe fn execute(&self, st: &mut State<D>, plan: &Plan, stream: RawStream, call: Call) -> Result<(), Error> {
        self.device.bind()?;
        let base = if plan.workspace > 0 {
            // SAFETY: `stream` is live (caller).
            unsafe { st.ws.acquire(&self.device, plan.workspace, stream, self.config.timeouts().peer)? }
        } else {
            0
        };
        let work = |st: &mut State<D>| {
            // SAFETY: forwarded; addresses are validated views or inside the acquired workspace.
            let steps = unsafe { self.steps(st, plan, base, stream) };
            // Record the workspace's last use even after a failure, so close never frees
            // memory that enqueued work still writes.
            let released = if plan.workspace > 0 {
                // SAFETY: as above.
                unsafe { st.ws.release(&self.device, stream) }
            } else {
                Ok(())
            };
            steps.and(released)
        };
        // SAFETY: `stream` is live (caller).
        unsafe { st.tracked(&self.device, stream, call, work) }
    }

    unsafe fn steps(&self, st: &mut State<D>, plan: &Plan, base: u64, stream: RawStream) -> Result<(), Error> {
        let at = |a: Addr| match a {
            Addr::User(p) => p,
            Addr::Ws(o) => base + o as u64,
        };
        let s = stream.0;
        // SAFETY (every unsafe block below): the addresses are validated caller views or lie
        // inside the workspace acquired for this plan (sizes computed by the plan); `stream`
        // is live (caller of `run`); the communicator belongs to this device.
        let one = |c: &mut Communicator, t: &Transfer| match *t {
            // SAFETY: see above.
            Transfer::AllGather { send, recv, bytes } => unsafe { c.all_gather(at(send), at(recv), bytes, s) },
            // SAFETY: see above.
            Transfer::Send { src, bytes, peer } => unsafe { c.send(at(src), bytes, peer, s) },
            // SAFETY: see above.
            Transfer::Recv { dst, bytes, peer } => unsafe { c.recv(at(dst), bytes, peer, s) },
        };
        for step in &plan.steps {
            match step {
                Step::Pack { src, dst, bytes } => {
                    // SAFETY: see above; the pack region does not overlap the caller's input.
                    unsafe { self.device.copy(base + *dst as u64, *src, *bytes, stream)? }
                }
                Step::Exchange(ts) => {
                    if let [t] = ts.as_slice() {
                        one(&mut st.comm, t)?;
                    } else {
                        st.comm.group(|c| ts.iter().try_for_each(|t| one(c, t)))?;
                    }
                }
                Step::Tree(t) => {
                    let first = base + t.first as u64;
                    // SAFETY: see above; the output is a caller view (disjoint from the
                    // workspace) or a scratch slot of a multi-pass tree, which the plan places
                    // after every region the step reads; `t.world` is at most 8 (the plan
                    // splits larger trees into passes).
                    unsafe {
                        self.device.tree_stacked(first, t.stride, t.world, at(t.out), t.count, plan.dtype, stream)?
                    }
                }
            }
        }
        Ok(())
    }

    /// Frees everything, bounded: finalizes and destroys the communicator (aborts it when
    /// poisoned or when finalize does not finish within `timeouts.close`), then frees the
    /// workspace once its last use completed (leaks it if that cannot be proven).
    fn shutdown(&self) -> Result<(), Error> {
        let mut st = self.lock()?;
        let t = self.config.timeouts().close;
        let comm = if self.poison.is_poisoned() { st.comm.abort() } else { st.comm.shutdown(t) };
        let _ = self.device.bind();
        let ws = st.ws.free(&self.device, t);
        comm.map_err(Error::from).and(ws)
    }
}

impl<D: Device> Collective for TransportCollective<D> {
    type Stream = D::Stream;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    /// Strict; no graph capture (the workspace may grow with a host wait, and the transport's
    /// capture has not been tested); capacity as configured.
    fn capabilities(&self) -> Capabilities {
        Capabilities::strict(self.config.capacity, false)
    }
    fn route(&self, _op: Op, _bytes: usize) -> Route {
        Route::Transport
    }
    fn host_memory(&self) -> bool {
        D::VENDOR == detcoll_protocol::Vendor::Host
    }
    /// The one entry of single-lane calls: the op goes to `enqueue` as a value.
    fn call(&self, op: Op, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        // Host slices (the safe `Io::host`) on device memory: refused before any work.
        self.check_address_space(op, &io)?;
        let raw = self.device.raw_stream(stream)?;
        if op == Op::ReduceScatterMany {
            // SAFETY: a live stream of this device; views from host slices were refused above,
            // the others' validity is the contract of their (unsafe) constructors.
            return unsafe { self.enqueue_many(&[io], raw) };
        }
        // SAFETY: as above.
        unsafe { self.enqueue(op, io, raw) }
    }
    fn all_reduce(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.call(Op::AllReduce, io, stream)
    }
    fn all_gather(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.call(Op::AllGather, io, stream)
    }
    fn reduce_scatter(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.call(Op::ReduceScatter, io, stream)
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], stream: &D::Stream) -> Result<(), Error> {
        for io in lanes {
            self.check_address_space(Op::ReduceScatterMany, io)?;
        }
        let raw = self.device.raw_stream(stream)?;
        // SAFETY: as in `all_reduce`.
        unsafe { self.enqueue_many(lanes, raw) }
    }

    /// The first failure recorded (by a call or the watchdog), or `Closed`.
    fn check(&self) -> Result<(), Error> {
        self.check_open()
    }
    fn synchronize(&self, stream: &D::Stream) -> Result<(), Error> {
        let raw = self.device.raw_stream(stream)?;
        // SAFETY: a live stream of this device (checked by `raw_stream`).
        unsafe { self.device.synchronize_stream(raw) }.map_err(|e| self.poison.record(e))?;
        self.check_open()
    }

    /// Stops and joins the watchdog, destroys the communicator and frees the workspace (see
    /// the bounds in the module doc). Later calls return [`Error::Closed`]. Drop does the same.
    fn close(&self) -> Result<(), Error> {
        if !self.owner.is_current() {
            // A forked child: the communicator and its watchdog are the parent's.
            return Err(self.owner.foreign());
        }
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // Before the state lock: the thread may be waiting for it.
        let watchdog = self.watchdog.lock().unwrap_or_else(PoisonError::into_inner).take();
        if let Some(w) = watchdog {
            w.stop();
        }
        self.shutdown()
    }
}

impl<D: Device> Drop for TransportCollective<D> {
    fn drop(&mut self) {
        if !self.owner.is_current() {
            // A forked child: the watchdog thread does not exist here and the communicator is
            // the parent's; joining or destroying either could hang or disturb the parent.
            let w = self.watchdog.lock().unwrap_or_else(PoisonError::into_inner).take();
            std::mem::forget(w);
            std::mem::forget(self.state.clone());
            return;
        }
        let _ = self.close();
    }
}
