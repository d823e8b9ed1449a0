//! The one call shape every backend implements.
use crate::{Capabilities, Error, Io, IpcRoute, Op, Route};

/// A deterministic collective over a fixed group of ranks.
///
/// Every call validates its arguments before any device work (see [`crate::validate`]) and
/// then enqueues the operation on `stream` asynchronously: the output is ready when the stream
/// reaches that point. All ranks must make the same calls in the same order; a rank that sees a
/// peer make a different call gets [`Error::SignatureMismatch`]. After a protocol failure
/// (timeout, dead peer, mismatch) the collective is poisoned and every later call fails.
///
/// Errors are asynchronous, as in NCCL: an `Ok` call is enqueued, not yet done. Read an output
/// only after [`Collective::synchronize`] (or [`Collective::check`] after your own stream
/// synchronisation) returned `Ok`; a failed call leaves its output unspecified.
pub trait Collective: Send + Sync {
    /// The backend's stream type (`()` for host backends).
    type Stream: ?Sized;

    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks: 1 to [`crate::MAX_WORLD_SIZE`] (at most [`crate::MAX_NODE_WORLD_SIZE`] in
    /// one IPC world).
    fn world_size(&self) -> usize;
    /// What this collective supports.
    fn capabilities(&self) -> Capabilities;
    /// The route a call of `op` moving `bytes` per rank takes (same on every rank).
    fn route(&self, op: Op, bytes: usize) -> Route;
    /// Whether this collective's calls read and write host memory (the CPU twin's backends).
    /// Only such a collective takes views built from host slices (`Io::host`, `RawRef::host`);
    /// a composed collective (the factory's front door) refuses them with
    /// `Error::HostMemory` before any work when its backends read device memory. The default,
    /// `false`, is the safe answer for a GPU backend.
    fn host_memory(&self) -> bool {
        false
    }
    /// `Err(Error::HostMemory)` when this collective reads device memory
    /// ([`Collective::host_memory`] is `false`) and a view of `io` was built from a host slice:
    /// what every entry of a GPU collective checks before any work.
    fn check_address_space(&self, op: Op, io: &Io<'_>) -> Result<(), Error> {
        if self.host_memory() { Ok(()) } else { io.refuse_host_views(op) }
    }

    /// Every rank gets the fixed tree over all ranks' inputs.
    fn all_reduce(&self, io: Io<'_>, stream: &Self::Stream) -> Result<(), Error>;
    /// Every rank gets all ranks' inputs concatenated in rank order. Any plain dtype.
    fn all_gather(&self, io: Io<'_>, stream: &Self::Stream) -> Result<(), Error>;
    /// Rank `r` gets shard `r` of the fixed tree over all ranks' inputs.
    fn reduce_scatter(&self, io: Io<'_>, stream: &Self::Stream) -> Result<(), Error>;
    /// Several independent reduce_scatters under one synchronisation, one tree per lane.
    /// All lanes share one dtype.
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], stream: &Self::Stream) -> Result<(), Error>;

    /// `op` on `io` (`reduce_scatter_many` as one lane): the call by its op, for a caller that
    /// holds the op as a value (a composed collective routing a call). Backends whose ops share
    /// one path override it to enter that path directly, so a routed call's op is dispatched
    /// once on its way down instead of turned into a method and back into a value.
    fn call(&self, op: Op, io: Io<'_>, stream: &Self::Stream) -> Result<(), Error> {
        match op {
            Op::AllReduce => self.all_reduce(io, stream),
            Op::AllGather => self.all_gather(io, stream),
            Op::ReduceScatter => self.reduce_scatter(io, stream),
            Op::ReduceScatterMany => self.reduce_scatter_many(&[io], stream),
        }
    }

    /// [`Collective::call`] as a part of a larger call that a composite route (hierarchical;
    /// IPC reduce_scatter then transport all_gather) runs as smaller collectives, or with a
    /// fused call's norm: a backend that signs its calls carries `part` in the signature's
    /// `split` (`Signature::part_split` of the whole call, or `Signature::norm_split`; 0: a
    /// plain call of its own), so peers making other calls whose parts have the same sizes
    /// fail with `SignatureMismatch`. A backend that signs nothing (the NCCL/RCCL transport:
    /// the default) runs it as [`Collective::call`].
    fn call_as_part(&self, op: Op, io: Io<'_>, part: u32, stream: &Self::Stream) -> Result<(), Error> {
        let _ = part;
        self.call(op, io, stream)
    }

    /// [`Collective::reduce_scatter_many`] signed with `part` as [`Collective::call_as_part`]
    /// signs a call (the front door's call number, `Signature::call_split`, or a composite
    /// route's whole call), joined with the lanes' own split. A backend that signs nothing:
    /// [`Collective::reduce_scatter_many`] (the default).
    ///
    /// A backend that signs its calls overrides this and [`Collective::call_as_part`] both:
    /// the defaults drop `part`, so ranks one call apart would pair and return `Ok` with one
    /// another's data. The defaults do not refuse a non-zero `part` because the NCCL/RCCL
    /// transport, which signs nothing, takes one on every composite route.
    fn reduce_scatter_many_as_part(&self, lanes: &[Io<'_>], part: u32, stream: &Self::Stream) -> Result<(), Error> {
        let _ = part;
        self.reduce_scatter_many(lanes, stream)
    }

    /// Counts a collective call this rank refused before making it — a layer's or a
    /// wrapper's own argument check (the Python package's, `detcoll-layers`') — as the calls
    /// a front door refuses itself count: every call a rank makes or refuses is numbered and
    /// signed with its number, so peers that made a call this rank refused fail with
    /// `SignatureMismatch` instead of pairing their next call with this rank's next one (which
    /// returned another call's sums as success). Call it once per collective call refused, in
    /// the rank's order of calls. The composed collectives of `collective-factory` count; a
    /// backend used on its own does not number its calls (the default: nothing to count).
    fn count_refused_call(&self) -> Result<(), Error> {
        Ok(())
    }

    /// The first failure any call of this handle recorded, as the analogue of NCCL's
    /// `ncclCommGetAsyncError`. Calls are asynchronous: a call returns `Ok` once it is enqueued,
    /// and a failure the device detects later (a peer that never arrives, a peer making a
    /// different call, a dead peer) is recorded for `check`. Never blocks.
    ///
    /// `Ok` says that no call has failed *so far*; to learn whether the calls enqueued on a
    /// stream succeeded, use [`Collective::synchronize`]. The first report of a failure is its
    /// typed error (`PeerTimeout`, `SignatureMismatch`, `PeerClosed`, ...); later reports, and
    /// every later call, return [`Error::Poisoned`] carrying it. After close: [`Error::Closed`].
    /// A failed call leaves its output unspecified: nothing is promised about an output read
    /// before a successful check.
    fn check(&self) -> Result<(), Error>;

    /// Waits until `stream` has executed every call enqueued on it so far (every wait of ours
    /// is bounded, so this returns), then [`Collective::check`]. The way to read a result:
    /// enqueue, `synchronize`, then read. Host backends (`Stream = ()`) run calls to completion
    /// before returning, so for them this is `check`.
    fn synchronize(&self, stream: &Self::Stream) -> Result<(), Error>;

    /// Collective close: acknowledges every peer and frees staging once all peers have
    /// acknowledged (bounded). Later calls return [`Error::Closed`]. Drop does the same.
    fn close(&self) -> Result<(), Error>;

    /// Fails this handle for good because a collective composed of it failed in another of
    /// its parts (the hierarchical route's node step, the hybrid route's IPC step), so its
    /// peers would wait for this rank in vain: later calls return [`Error::Poisoned`] with
    /// `cause`, and a backend that can tell its peers at once does, so a peer waiting on this
    /// rank fails now rather than at its own bound (the host transports release their
    /// bootstrap: the peer sees this rank gone). Not a close: nothing is acknowledged, and
    /// `close` still runs later. Default: nothing (the peers' own bounds apply).
    fn abandon(&self, cause: &str) {
        let _ = cause;
    }
}

/// An IPC backend the caller tells which route a call takes: the factory's routing table
/// decides once and passes the decision down, so no threshold inside the backend can disagree
/// with the table (and `route()` of the composed collective reports what runs).
pub trait RouteSelect: Collective {
    /// The route a single-lane call of `op` contributing `bytes` per rank runs when told
    /// `route`, as [`Collective::route`] reports it: a push route whose payload does not fit
    /// its slots runs the one-shot route (the LL capacity). Default: `route` itself.
    fn route_taken(&self, op: Op, bytes: usize, route: IpcRoute) -> crate::Route {
        let _ = (op, bytes);
        route.route()
    }

    /// `op` on `io` by `route` (`Local`, `OneShot`, the push routes or, for all_reduce,
    /// `ReduceScatterAllGather`); a route `op` cannot take is [`Error::InvalidConfig`] before
    /// any work. `op` is a single-lane op (`reduce_scatter_many` goes through
    /// [`RouteSelect::reduce_scatter_many_on_route`]).
    fn call_on_route(&self, op: Op, io: Io<'_>, route: IpcRoute, stream: &Self::Stream) -> Result<(), Error> {
        self.call_on_route_as_part(op, io, route, 0, stream)
    }

    /// [`RouteSelect::call_on_route`] as a part of a larger call that a composite route
    /// (hierarchical, IPC reduce_scatter + transport all_gather) runs as smaller collectives:
    /// `part` (`Signature::part_split` of the whole call; 0 for a call of its own) is the
    /// part's signature `split`, so peers running parts of different calls fail with
    /// `SignatureMismatch` even where the parts' sizes agree.
    fn call_on_route_as_part(
        &self,
        op: Op,
        io: Io<'_>,
        route: IpcRoute,
        part: u32,
        stream: &Self::Stream,
    ) -> Result<(), Error>;

    /// `reduce_scatter_many` by `route`: a backend with an LL push route takes it for
    /// `PushLl`; every other route (and a backend without one) is the backend's
    /// [`Collective::reduce_scatter_many`].
    fn reduce_scatter_many_on_route(
        &self,
        lanes: &[Io<'_>],
        route: IpcRoute,
        stream: &Self::Stream,
    ) -> Result<(), Error> {
        self.reduce_scatter_many_on_route_as_part(lanes, route, 0, stream)
    }

    /// [`RouteSelect::reduce_scatter_many_on_route`] as a part of a larger call (`part` as in
    /// [`RouteSelect::call_on_route_as_part`], mixed with the lanes' own split). A backend
    /// that cannot sign a part refuses one (`InvalidConfig`) rather than run it unsigned.
    fn reduce_scatter_many_on_route_as_part(
        &self,
        lanes: &[Io<'_>],
        route: IpcRoute,
        part: u32,
        stream: &Self::Stream,
    ) -> Result<(), Error> {
        let _ = route;
        if part != 0 {
            return Err(Error::InvalidConfig { detail: "this backend cannot sign a part of a larger call".into() });
        }
        self.reduce_scatter_many(lanes, stream)
    }
}

/// The route an IPC backend takes for `op` when a table names `route`: RS+AG is an all_reduce
/// route only (a reduce_scatter or all_gather has nothing to split) and reduce_scatter_many has
/// no bulk push plan, so those take the one-shot route; the LL push route serves every op;
/// `Local` stays local. The one place an op's fallback is decided: the route tables' lookups
/// ([`crate::RouteTable::ipc_route`]) and the factory's route reporting use it.
pub const fn ipc_route_for(op: Op, route: Route) -> Route {
    match (op, route) {
        (_, Route::Local) => Route::Local,
        (Op::AllReduce, Route::IpcReduceScatterAllGather) => Route::IpcReduceScatterAllGather,
        (_, Route::IpcPushLl) => Route::IpcPushLl,
        (Op::ReduceScatterMany, Route::IpcPush) => Route::IpcOneShot,
        (_, Route::IpcPush) => Route::IpcPush,
        _ => Route::IpcOneShot,
    }
}
