//! [`Routed`]: one collective composed of an IPC backend and a transport, calling each by the
//! agreed routing. Every route evaluates the same tree, so the bits never depend on the choice.
use crate::Routing;
use crate::chunked;
use crate::nodes::Nodes;
use crate::scratch::CallStream;
use crate::via::Via;
use collective_core::process::ProcessOwner;
use collective_core::{
    Capabilities, Collective, Error, Io, IpcRoute, Op, RawMut, Route, RouteSelect, Signature, ipc_route_for, validate,
};
use std::sync::{Mutex, PoisonError};

/// An IPC backend `I` and a transport `T` on the same stream type, routed by a table.
///
/// The route is decided here, once per call, by the table; the IPC backend is told which of
/// its routes to take ([`RouteSelect`]), so any table — monotone or not — is honoured and
/// [`Collective::route`] reports what runs.
#[derive(Debug)]
pub struct Routed<I: Collective, T> {
    rank: usize,
    world: usize,
    capacity: usize,
    routing: Routing,
    ipc: Option<I>,
    transport: Option<T>,
    /// The hierarchical route's backends (several nodes): this node's IPC collective and the
    /// transport across nodes.
    /// Boxed: a node's backends are as large as the rest of the handle, and one-node handles
    /// should not carry their space.
    nodes: Option<Box<Nodes<I, T>>>,
    /// Held for the whole of every single-lane call: a call routed to the hybrid makes two
    /// backend calls (IPC reduce_scatter, transport all_gather), which another thread's call
    /// on this handle must not come between (each backend would see another order than the
    /// peers' backends). Calls of one backend are atomic in the backend itself. Holds the
    /// number of calls this handle began, made or refused (`begin_call`).
    calls: Mutex<u32>,
    /// The process that built the handle: a forked child fails before the call lock, which
    /// it inherits as the parent held it (locked for good if a parent thread was in a call).
    owner: ProcessOwner,
}

/// The transport of platforms that have none: uninhabited, so `Routed<I, NoTransport<_>>` costs
/// nothing and can never take a transport route (agreement removed them).
#[derive(Debug)]
pub struct NoTransport<S: ?Sized>(pub(crate) core::convert::Infallible, core::marker::PhantomData<fn(&S)>);

impl<I: RouteSelect, T: Collective<Stream = I::Stream>> Routed<I, T> {
    /// Composes the agreed backends. `routing` must only take routes the backends given serve
    /// (agreement guarantees it); a route without its backend is an `InvalidConfig` error here.
    pub fn new(
        rank: usize,
        world: usize,
        capacity: usize,
        routing: Routing,
        ipc: Option<I>,
        transport: Option<T>,
    ) -> Result<Self, Error> {
        if world > 1 {
            for r in routing.routes() {
                let transport_missing = r.needs_transport() && !r.needs_nodes() && transport.is_none();
                if (r.needs_ipc() && ipc.is_none()) || transport_missing {
                    return Err(Error::InvalidConfig { detail: format!("route {} has no backend", r.name()) });
                }
            }
        }
        Ok(Routed {
            rank,
            world,
            capacity,
            routing,
            ipc,
            transport,
            nodes: None,
            calls: Mutex::new(0),
            owner: ProcessOwner::current(),
        })
    }

    /// With the hierarchical route's backends (what the table's `hierarchical` ranges run on).
    pub fn with_nodes(mut self, nodes: Nodes<I, T>) -> Self {
        self.nodes = Some(Box::new(nodes));
        self
    }

    /// The hierarchical route's backends, or why a call routed to them cannot run.
    pub(crate) fn nodes_backend(&self) -> Result<&Nodes<I, T>, Error> {
        self.nodes.as_deref().ok_or(Error::InvalidConfig { detail: "no hierarchical backends (one node)".into() })
    }

    /// `reduce_scatter_many` by the hierarchical route: several backend calls, held together
    /// against other threads' calls on this handle (as the hybrid's).
    /// (Under the call lock, as counted by `begin_call`: `split` its call number.)
    pub(crate) fn hierarchical_many(&self, lanes: &[Io<'_>], split: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        self.nodes_backend()?.reduce_scatter_many(lanes, split, via)
    }

    /// The hierarchical route's backends, if built (several nodes).
    pub fn nodes(&self) -> Option<&Nodes<I, T>> {
        self.nodes.as_deref()
    }

    /// The IPC backend, or why a call routed to it cannot run.
    pub(crate) fn ipc_backend(&self) -> Result<&I, Error> {
        self.ipc.as_ref().ok_or(Error::InvalidConfig { detail: "no IPC backend".into() })
    }

    /// The IPC route `route` (as [`Collective::route`] reports it) names.
    pub(crate) fn ipc_route(&self, route: Route) -> Result<IpcRoute, Error> {
        IpcRoute::of(route)
            .ok_or_else(|| Error::InvalidConfig { detail: format!("route {} is not an IPC route", route.name()) })
    }

    /// The IPC backend, if built.
    pub fn ipc(&self) -> Option<&I> {
        self.ipc.as_ref()
    }

    /// The transport, if built.
    pub fn transport(&self) -> Option<&T> {
        self.transport.as_ref()
    }

    /// The agreed routing.
    pub fn routing(&self) -> &Routing {
        &self.routing
    }

    /// One single-lane call by the table's route, reaching the backends through `via`
    /// (their safe stream type, or a raw stream). The route only needs the size; the backend
    /// validates the call (once). The hybrid splits the call into two backend calls on views it
    /// builds itself, so it validates the whole call first. Only all_reduce has a second half:
    /// a reduce_scatter routed to the hybrid is its IPC half alone, never an all_reduce.
    pub(crate) fn dispatch(&self, op: Op, io: Io<'_>, via: &impl Via<I, T>) -> Result<(), Error> {
        self.dispatch_as_part(op, io, 0, via)
    }

    /// [`Routed::dispatch`] signed with `part` as well as the call's number (0: the plain
    /// call): `Collective::call_as_part` of a composite of the caller's.
    fn dispatch_as_part(&self, op: Op, io: Io<'_>, part: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        let (_call, seq) = self.begin_call()?;
        self.check_address_space(op, &io)?;
        self.settle(self.dispatch_signed(op, io, Signature::call_split(seq, part), via))
    }

    /// This handle's call lock, and the number of the call it begins: every collective call
    /// of the front door takes it first and counts, whether it is then refused (a bad
    /// argument, a host view on a GPU) or made, and signs its launches with that number
    /// (`Signature::call_split`). So a call one rank refused while its peers made it leaves
    /// the ranks' numbers apart: the peers' call and the rank's next one fail with
    /// `SignatureMismatch` (and poison) instead of pairing, which returned `Ok` with another
    /// call's sums. Ranks that all refuse the same call stay in step. A thread that panicked
    /// inside a call left the backends' order unknown: fail closed.
    pub(crate) fn begin_call(&self) -> Result<(std::sync::MutexGuard<'_, u32>, u32), Error> {
        let mut calls = self.lock_calls()?;
        *calls = calls.wrapping_add(1);
        let seq = *calls;
        self.check_backends()?;
        Ok((calls, seq))
    }

    /// With several backends (a table that sends some calls to IPC and others to a transport,
    /// virtual nodes), a failure one of them recorded fails every later call through any of
    /// them, as `Poisoned` carrying it (the contract's "every later call"): each backend checks
    /// only its own calls, so a call routed to a healthy one returned `Ok` after another had
    /// failed. The healthy ones are abandoned with the cause, so peers waiting for this rank
    /// in them fail at once instead of at their bounds (the host transport's is the bootstrap's
    /// 60 s). A handle of one backend leaves it to that backend's own check (no extra work).
    fn check_backends(&self) -> Result<(), Error> {
        if self.backends() < 2 {
            return Ok(());
        }
        match Collective::check(self) {
            Ok(()) => Ok(()),
            Err(Error::Closed) => Err(Error::Closed),
            Err(e) => {
                let cause = match e {
                    Error::Poisoned { cause } => cause,
                    e => e.to_string(),
                };
                Collective::abandon(self, &cause);
                Err(Error::Poisoned { cause })
            }
        }
    }

    /// `result` of a call, its failure abandoning every backend when it is a poison and the
    /// handle has several: this rank makes no further call through any of them (every later
    /// one is `Poisoned`, `check_backends`), so peers waiting for it in a healthy backend fail
    /// at once, not only at this rank's next call or at their bounds. A failure found later
    /// (a kernel's, at `check` or `synchronize`) abandons them at the next call.
    pub(crate) fn settle(&self, result: Result<(), Error>) -> Result<(), Error> {
        if let Err(e) = &result
            && e.poisons()
            && self.backends() >= 2
        {
            Collective::abandon(self, &e.to_string());
        }
        result
    }

    /// How many backends this handle built (IPC, nodes, transport).
    fn backends(&self) -> usize {
        usize::from(self.ipc.is_some()) + usize::from(self.nodes.is_some()) + usize::from(self.transport.is_some())
    }

    /// The call lock (a forked child fails first: it inherits the lock as the parent held it).
    fn lock_calls(&self) -> Result<std::sync::MutexGuard<'_, u32>, Error> {
        self.owner.check()?;
        self.calls
            .lock()
            .map_err(|_| Error::Poisoned { cause: "a thread panicked inside a call of this handle".into() })
    }

    /// The calls this handle began, made or refused (`Routed::begin_call`), modulo 2^32: the
    /// number its next call is signed with, less one. Equal on every rank of a group whose
    /// ranks made and refused the same calls (a diagnostic: ranks whose counts differ fail their
    /// next call with `SignatureMismatch`). Waits for a call in flight on another thread.
    pub fn calls_begun(&self) -> Result<u32, Error> {
        self.lock_calls().map(|calls| *calls)
    }

    /// The route the table sends the all_reduce of a fused all_reduce + residual + RMSNorm of
    /// `bytes` per rank to (its `all_reduce_residual_rmsnorm` rules, else the all_reduce's), as
    /// the backends take it: what [`Collective::route`] is for the plain call.
    pub fn fused_norm_route(&self, bytes: usize) -> Route {
        self.taken(Op::AllReduce, bytes, self.routing.fused_norm_route(bytes))
    }

    /// The route a call of `op` contributing `bytes` per rank takes when the table says
    /// `route`: local at world 1; RS+AG and the hybrid are all_reduce routes (other ops take
    /// their one-shot IPC route there); LL push above the LL capacity is one-shot (the IPC
    /// backend's `route_taken`).
    fn taken(&self, op: Op, bytes: usize, route: Route) -> Route {
        if self.world == 1 {
            return Route::Local;
        }
        match route {
            Route::Transport => Route::Transport,
            Route::Hierarchical => Route::Hierarchical,
            Route::IpcReduceScatterTransportAllGather if op == Op::AllReduce => {
                Route::IpcReduceScatterTransportAllGather
            }
            r => match (ipc_route_for(op, r), &self.ipc) {
                (Route::IpcPushLl, Some(ipc)) if op != Op::ReduceScatterMany => {
                    ipc.route_taken(op, bytes, IpcRoute::PushLl)
                }
                (r, _) => r,
            },
        }
    }

    /// One call under the call lock the caller holds, whose signature's `split` is `split` (its
    /// number, `Signature::call_split`, joined with a fused call's norm). A composite route
    /// signs each of its parts with the whole call (`Signature::part_split`), so peers running parts of
    /// different calls fail with `SignatureMismatch`; an IPC route and the host transports
    /// sign the call with `split`; the NCCL/RCCL transport signs nothing.
    pub(crate) fn dispatch_signed(&self, op: Op, io: Io<'_>, split: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        let route = self.route(op, contributed_bytes(op, &io, self.world));
        self.dispatch_on(route, op, io, split, via)
    }

    /// [`Routed::dispatch_signed`] by `route` (a route [`Routed::taken`] gives).
    pub(crate) fn dispatch_on(
        &self,
        route: Route,
        op: Op,
        io: Io<'_>,
        split: u32,
        via: &impl Via<I, T>,
    ) -> Result<(), Error> {
        let ipc = || self.ipc_backend();
        let transport = || self.transport.as_ref().ok_or(Error::InvalidConfig { detail: "no transport".into() });
        match route {
            Route::Transport if op == Op::AllReduce => {
                let t = transport()?;
                // Elements one transport call takes; 0: not one (the transport refuses the call).
                let step = t.capabilities().max_call_bytes / chunked::element_size(&io);
                if step == 0 || chunked::elements(&io) <= step {
                    return via.transport(t, op, io, split);
                }
                // Larger: in chunks the transport takes, each signed with the whole call (as a
                // composite route's parts), so peers making other calls fail.
                let call = validate(op, &io, self.rank, self.world, usize::MAX)?;
                let part = Signature::part_split(&Signature { split, route: Route::Transport, ..call.signature() });
                // SAFETY: a validated all_reduce; `step` > 0.
                unsafe { chunked::all_reduce_in_chunks(io, step, |c| via.transport(t, op, c, part)) }
            }
            Route::Transport => via.transport(transport()?, op, io, split),
            Route::Hierarchical => self.nodes_backend()?.dispatch(op, io, split, via),
            Route::IpcReduceScatterTransportAllGather => {
                // A poisoned transport fails the call before the IPC step writes the output.
                let t = transport()?;
                t.check()?;
                // Any size: the IPC reduce_scatter chunks in the engine, and the gather goes in
                // chunks of whole shards the transport takes.
                let call = validate(op, &io, self.rank, self.world, usize::MAX)?;
                let whole = Signature { split, route: Route::IpcReduceScatterTransportAllGather, ..call.signature() };
                let part = Signature::part_split(&whole);
                let shard_step = t.capabilities().max_call_bytes / call.dtype.size();
                let step = shard_step.saturating_mul(self.world);
                if step == 0 || call.count_in % self.world != 0 {
                    // Uneven shards take IPC RS+AG whole; no shard the transport takes: it refuses.
                    return self.hybrid_all_reduce(io, ipc()?, t, part, via);
                }
                let ipc = ipc()?;
                // SAFETY: a validated all_reduce; `step` > 0, a multiple of the world, as is
                // every chunk (the call's length is one too).
                unsafe { chunked::all_reduce_in_chunks(io, step, |c| self.hybrid_all_reduce(c, ipc, t, part, via)) }
            }
            route => via.ipc(ipc()?, op, io, self.ipc_route(route)?, split),
        }
    }

    /// IPC reduce_scatter into this rank's shard of the output, then transport all_gather of
    /// the reduced shards in place: the same per-element tree as every other route. The IPC
    /// step is signed as a part of the whole call (`part`).
    fn hybrid_all_reduce(
        &self,
        io: Io<'_>,
        ipc: &I,
        transport: &T,
        part: u32,
        via: &impl Via<I, T>,
    ) -> Result<(), Error> {
        let n = match &io {
            Io::InPlace(b) => b.len(),
            Io::OutOfPlace { input, .. } => input.len(),
        };
        if n % self.world != 0 {
            // Equal shards are what the transport gathers; uneven sizes take IPC RS+AG, which
            // gives the same bits.
            return via.ipc(ipc, Op::AllReduce, io, IpcRoute::ReduceScatterAllGather, part);
        }
        let shard = n / self.world;
        let (out_addr, dtype) = match &io {
            Io::InPlace(b) => (b.addr(), b.dtype()),
            Io::OutOfPlace { output, .. } => (output.addr(), output.dtype()),
        };
        let out_shard = out_addr + (self.rank * shard * dtype.size()) as u64;
        let reduced = match io {
            Io::InPlace(b) => via.ipc(ipc, Op::ReduceScatter, Io::InPlace(b), IpcRoute::OneShot, part),
            Io::OutOfPlace { input, output: _ } => {
                // SAFETY: shard `rank` of `output`, which this call borrows uniquely.
                let shard_view = unsafe { RawMut::from_raw(out_shard, shard, dtype) };
                let io = Io::OutOfPlace { input, output: shard_view };
                via.ipc(ipc, Op::ReduceScatter, io, IpcRoute::OneShot, part)
            }
        };
        if let Err(e) = reduced {
            // This rank skips the gather its peers may already wait in: they must not wait
            // for it in vain.
            if e.poisons() {
                transport.abandon(&e.to_string());
            }
            return Err(e);
        }
        // SAFETY: the whole output, borrowed by this call; the reduced shard is at `rank`.
        let whole = unsafe { RawMut::from_raw(out_addr, n, dtype) };
        via.transport(transport, Op::AllGather, Io::InPlace(whole), part)
    }

    /// A `reduce_scatter_many` numbered `split`, by the table's route.
    fn many_signed(&self, lanes: &[Io<'_>], split: u32, stream: &I::Stream) -> Result<(), Error> {
        // Saturating: lanes whose bytes overflow are refused by validation, not by a panic here.
        let bytes = lanes
            .iter()
            .fold(0usize, |sum, io| sum.saturating_add(contributed_bytes(Op::ReduceScatterMany, io, self.world)));
        match self.route(Op::ReduceScatterMany, bytes) {
            Route::Hierarchical => self.hierarchical_many(lanes, split, &OnStream(stream)),
            Route::Transport => self
                .transport
                .as_ref()
                .ok_or(Error::InvalidConfig { detail: "no transport".into() })?
                .reduce_scatter_many_as_part(lanes, split, stream),
            route => {
                self.ipc_backend()?.reduce_scatter_many_on_route_as_part(lanes, self.ipc_route(route)?, split, stream)
            }
        }
    }
}

/// The safe path: the backends' own stream type.
pub(crate) struct OnStream<'s, S: ?Sized>(pub(crate) &'s S);

impl<I: RouteSelect, T: Collective<Stream = I::Stream>> Via<I, T> for OnStream<'_, I::Stream> {
    fn ipc(&self, ipc: &I, op: Op, io: Io<'_>, route: IpcRoute, part: u32) -> Result<(), Error> {
        ipc.call_on_route_as_part(op, io, route, part, self.0)
    }
    fn transport(&self, transport: &T, op: Op, io: Io<'_>, part: u32) -> Result<(), Error> {
        transport.call_as_part(op, io, part, self.0)
    }
    fn ipc_many(&self, ipc: &I, lanes: &[Io<'_>], route: IpcRoute, part: u32) -> Result<(), Error> {
        ipc.reduce_scatter_many_on_route_as_part(lanes, route, part, self.0)
    }
    fn stream(&self) -> CallStream<'_, I::Stream> {
        CallStream::Safe(self.0)
    }
}

/// Bytes this rank contributes, read off the views without validating them (routing only needs
/// the size; an invalid call is rejected by the backend it is routed to, before any work).
pub(crate) fn contributed_bytes(op: Op, io: &Io<'_>, world: usize) -> usize {
    match io {
        Io::OutOfPlace { input, .. } => input.bytes(),
        Io::InPlace(buf) if op == Op::AllGather => buf.bytes() / world,
        Io::InPlace(buf) => buf.bytes(),
    }
}

impl<I: RouteSelect, T: Collective<Stream = I::Stream>> Collective for Routed<I, T> {
    type Stream = I::Stream;

    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    /// Graph capture when every built backend supports it. `max_call_bytes` by the routes the
    /// table takes: the IPC routes chunk calls of any size through their staging
    /// (`usize::MAX`), the transport route promises its own limit (its capacity), and the
    /// hybrid all_reduce is checked against `capacity`; a route limits only when the table sends
    /// it a size above its limit (a transport range starting above the capacity limits calls
    /// to just below its start).
    fn capabilities(&self) -> Capabilities {
        let ipc = self.ipc.as_ref().map(|i| i.capabilities());
        let transport = self.transport.as_ref().map(|t| t.capabilities());
        let nodes = self.nodes.as_ref().map(|n| n.capabilities());
        let graph = ipc.is_none_or(|c| c.supports_graph_capture)
            && transport.is_none_or(|c| c.supports_graph_capture)
            && nodes.is_none_or(|c| c.supports_graph_capture);
        let ipc_max = ipc.map_or(self.capacity, |c| c.max_call_bytes);
        if self.world == 1 {
            return Capabilities::strict(self.capacity, graph).with_max_call_bytes(ipc_max);
        }
        let transport_max = transport.map_or(self.capacity, |c| c.max_call_bytes);
        let mut max = usize::MAX;
        for rule in &self.routing.table().rules {
            let (Some(op), Some(route)) = (Op::parse(&rule.op), Route::parse(&rule.route)) else { continue };
            let limit = match route {
                // An all_reduce runs in chunks on both (`chunked`).
                Route::Transport | Route::IpcReduceScatterTransportAllGather if op == Op::AllReduce => usize::MAX,
                Route::Transport => transport_max,
                Route::Hierarchical => nodes.map_or(self.capacity, |c| c.max_call_bytes),
                _ => ipc_max,
            };
            // Sizes of this rule above `limit` fail: from max(min, limit + 1) on.
            if rule.max_bytes.is_none_or(|m| u128::from(m) > limit as u128 + 1) {
                let below = usize::try_from(rule.min_bytes.saturating_sub(1)).unwrap_or(usize::MAX);
                max = max.min(below.max(limit));
            }
        }
        Capabilities::strict(self.capacity, graph).with_max_call_bytes(max)
    }
    /// What a call of `op` contributing `bytes` per rank runs: the table's route, as the
    /// backend takes it (RS+AG and the hybrid are all_reduce routes; other ops take their
    /// one-shot IPC route there).
    fn route(&self, op: Op, bytes: usize) -> Route {
        self.taken(op, bytes, self.routing.route(op, bytes))
    }
    /// The backends' (one platform's: all read host memory, or none).
    fn host_memory(&self) -> bool {
        match (&self.ipc, &self.nodes, &self.transport) {
            (Some(i), _, _) => i.host_memory(),
            (None, Some(n), _) => n.local().host_memory(),
            (None, None, Some(t)) => t.host_memory(),
            (None, None, None) => false,
        }
    }
    fn all_reduce(&self, io: Io<'_>, stream: &Self::Stream) -> Result<(), Error> {
        self.dispatch(Op::AllReduce, io, &OnStream(stream))
    }
    fn all_gather(&self, io: Io<'_>, stream: &Self::Stream) -> Result<(), Error> {
        self.dispatch(Op::AllGather, io, &OnStream(stream))
    }
    fn reduce_scatter(&self, io: Io<'_>, stream: &Self::Stream) -> Result<(), Error> {
        self.dispatch(Op::ReduceScatter, io, &OnStream(stream))
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], stream: &Self::Stream) -> Result<(), Error> {
        self.reduce_scatter_many_as_part(lanes, 0, stream)
    }
    /// A call of this handle (numbered like every call) signed with `part` too: a composite
    /// of the caller's that runs its own calls as parts through this front door (the trait's
    /// default dropped `part`, so two ranks making the same-sized parts of different calls
    /// paired and returned `Ok` with one another's data). `part` 0 is the plain call.
    fn call_as_part(&self, op: Op, io: Io<'_>, part: u32, stream: &Self::Stream) -> Result<(), Error> {
        if op == Op::ReduceScatterMany {
            return self.reduce_scatter_many_as_part(&[io], part, stream);
        }
        self.dispatch_as_part(op, io, part, &OnStream(stream))
    }
    /// `reduce_scatter_many` signed with `part` too, as [`Routed::call_as_part`] signs a call.
    fn reduce_scatter_many_as_part(&self, lanes: &[Io<'_>], part: u32, stream: &Self::Stream) -> Result<(), Error> {
        let (_call, seq) = self.begin_call()?;
        let split = Signature::call_split(seq, part);
        for io in lanes {
            self.check_address_space(Op::ReduceScatterMany, io)?;
        }
        self.settle(self.many_signed(lanes, split, stream))
    }
    /// Counted as a call this handle refused itself (`Routed::begin_call`).
    fn count_refused_call(&self) -> Result<(), Error> {
        self.begin_call().map(drop)
    }
    /// The IPC backend's recorded failure, else the transport's.
    fn check(&self) -> Result<(), Error> {
        self.ipc.as_ref().map_or(Ok(()), |i| i.check())?;
        self.nodes.as_ref().map_or(Ok(()), |n| n.check())?;
        self.transport.as_ref().map_or(Ok(()), |t| t.check())
    }
    /// One stream synchronisation (both backends enqueue on the caller's stream), then both
    /// backends' checks.
    fn synchronize(&self, stream: &Self::Stream) -> Result<(), Error> {
        if let Some(n) = &self.nodes {
            n.synchronize(stream)?;
        }
        match (&self.ipc, &self.transport) {
            (Some(i), t) => {
                i.synchronize(stream)?;
                t.as_ref().map_or(Ok(()), |t| t.check())
            }
            (None, Some(t)) => t.synchronize(stream),
            (None, None) => Ok(()),
        }
    }
    /// Abandons every backend (the IPC one, the hierarchical route's, the transport): a
    /// collective composed of this one failed elsewhere, so later calls are `Poisoned` with
    /// `cause` and peers waiting for this rank fail at once rather than at their bounds.
    fn abandon(&self, cause: &str) {
        if let Some(i) = &self.ipc {
            i.abandon(cause);
        }
        if let Some(n) = &self.nodes {
            n.abandon(cause);
        }
        if let Some(t) = &self.transport {
            t.abandon(cause);
        }
    }
    /// Waits for a call another thread has in flight on this handle (a call of a composite
    /// route is several backend calls, which close must not come between; the calls' waits are
    /// bounded), then closes every backend. A forked child takes no lock (it inherited the
    /// parent's as the parent held it): its backends refuse it on their own.
    fn close(&self) -> Result<(), Error> {
        let _calls = self.owner.is_current().then(|| self.calls.lock().unwrap_or_else(PoisonError::into_inner));
        let a = self.ipc.as_ref().map_or(Ok(()), |i| i.close());
        let n = self.nodes.as_ref().map_or(Ok(()), |n| n.close());
        let b = self.transport.as_ref().map_or(Ok(()), |t| t.close());
        a.and(n).and(b)
    }
}

impl<S: ?Sized> Collective for NoTransport<S> {
    type Stream = S;
    fn rank(&self) -> usize {
        match self.0 {}
    }
    fn world_size(&self) -> usize {
        match self.0 {}
    }
    fn capabilities(&self) -> Capabilities {
        match self.0 {}
    }
    fn route(&self, _: Op, _: usize) -> Route {
        match self.0 {}
    }
    fn all_reduce(&self, _: Io<'_>, _: &S) -> Result<(), Error> {
        match self.0 {}
    }
    fn all_gather(&self, _: Io<'_>, _: &S) -> Result<(), Error> {
        match self.0 {}
    }
    fn reduce_scatter(&self, _: Io<'_>, _: &S) -> Result<(), Error> {
        match self.0 {}
    }
    fn reduce_scatter_many(&self, _: &[Io<'_>], _: &S) -> Result<(), Error> {
        match self.0 {}
    }
    fn check(&self) -> Result<(), Error> {
        match self.0 {}
    }
    fn synchronize(&self, _: &S) -> Result<(), Error> {
        match self.0 {}
    }
    fn close(&self) -> Result<(), Error> {
        match self.0 {}
    }
}
