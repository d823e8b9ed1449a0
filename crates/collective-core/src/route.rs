//! How a call moves and reduces data: the routes a routing table names (every route gives the
//! same bits). A leaf of the crate's files: the op, its signature and the call shape use it.

/// How a call moves and reduces data. Every route gives the same bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// World size 1: a copy, or nothing in place.
    Local,
    /// Every rank stages its input; every rank reads every peer and evaluates the tree.
    IpcOneShot,
    /// IPC reduce_scatter of the local shard, then IPC all_gather of the reduced shards.
    IpcReduceScatterAllGather,
    /// Rank-ordered transport all_gather, then the local fixed tree.
    Transport,
    /// IPC reduce_scatter, then transport all_gather of the reduced shards.
    IpcReduceScatterTransportAllGather,
    /// Every rank pushes its input (reduce_scatter: each shard to its owner) into a receive slot
    /// of every peer, as LL words that carry their arrival flag, and evaluates the tree over its
    /// own slots in rank order. One launch, no staging copy, no flag round trip.
    IpcPushLl,
    /// Bulk push for large messages: every rank writes each slice of its input straight into
    /// its owner's frame (plain stores, one released flag per block), the owner reduces its
    /// shard from its own memory in rank order, then (all_reduce) pushes the reduced shard into
    /// every peer's frame. reduce_scatter is the first half, all_gather the second; no staging
    /// copy, no remote poll.
    IpcPush,
    /// Several nodes, ranks node-major with a power-of-two number of ranks per node: IPC
    /// reduce_scatter inside each node (its subtree of the canonical tree), the transport among
    /// the ranks of equal local rank across nodes (the tree's top levels over the node
    /// partials), IPC all_gather inside the node. The canonical tree splits on node boundaries
    /// for such layouts, so the bits are the flat route's. On one host it is IPC RS+AG.
    Hierarchical,
}

impl Route {
    /// Every route.
    pub const ALL: [Route; 8] = [
        Route::Local,
        Route::IpcOneShot,
        Route::IpcReduceScatterAllGather,
        Route::Transport,
        Route::IpcReduceScatterTransportAllGather,
        Route::IpcPushLl,
        Route::IpcPush,
        Route::Hierarchical,
    ];
    /// A small code of the route (its index in [`Route::ALL`]), carried in signatures.
    pub const fn code(self) -> u8 {
        self as u8
    }
    /// Inverse of [`Route::code`].
    pub const fn from_code(code: u8) -> Option<Route> {
        if (code as usize) < Route::ALL.len() { Some(Route::ALL[code as usize]) } else { None }
    }
    /// Parses [`Route::name`].
    pub fn parse(s: &str) -> Option<Route> {
        Route::ALL.into_iter().find(|r| r.name() == s)
    }
    /// Whether the route needs same-host IPC between all ranks.
    pub const fn needs_ipc(self) -> bool {
        matches!(
            self,
            Route::IpcOneShot
                | Route::IpcReduceScatterAllGather
                | Route::IpcReduceScatterTransportAllGather
                | Route::IpcPushLl
                | Route::IpcPush
        )
    }
    /// Whether the route needs the transport.
    pub const fn needs_transport(self) -> bool {
        matches!(self, Route::Transport | Route::IpcReduceScatterTransportAllGather | Route::Hierarchical)
    }

    /// Whether the route runs per node (IPC inside each node, the transport across them).
    pub const fn needs_nodes(self) -> bool {
        matches!(self, Route::Hierarchical)
    }

    /// The route with the same bits that needs no transport: the transport's becomes IPC
    /// one-shot, the hybrid and the hierarchical route IPC RS+AG; IPC routes stay.
    pub const fn without_transport(self) -> Route {
        match self {
            Route::Transport => Route::IpcOneShot,
            Route::IpcReduceScatterTransportAllGather | Route::Hierarchical => Route::IpcReduceScatterAllGather,
            other => other,
        }
    }

    /// The route on one host: the hierarchical route of a single node is IPC RS+AG (its
    /// reduce_scatter and all_gather, nothing across nodes); every other route stays.
    pub const fn on_one_host(self) -> Route {
        match self {
            Route::Hierarchical => Route::IpcReduceScatterAllGather,
            other => other,
        }
    }

    /// The route across several nodes whose layout allows the hierarchical route: every route
    /// that needs same-host IPC between all ranks becomes hierarchical; the transport stays.
    pub const fn across_nodes(self) -> Route {
        match self {
            Route::Local | Route::Transport => self,
            _ => Route::Hierarchical,
        }
    }

    /// snake_case name used in bench output and routing tables.
    pub const fn name(self) -> &'static str {
        match self {
            Route::Local => "local",
            Route::IpcOneShot => "ipc_one_shot",
            Route::IpcReduceScatterAllGather => "ipc_rs_ag",
            Route::Transport => "transport",
            Route::IpcReduceScatterTransportAllGather => "ipc_rs_transport_ag",
            Route::IpcPushLl => "ipc_push_ll",
            Route::IpcPush => "ipc_push",
            Route::Hierarchical => "hierarchical",
        }
    }
}

/// A route an IPC backend takes: what the routing table decided for the IPC backend of a call
/// (after [`crate::ipc_route_for`] applied the op's fallback). It cannot name the transport, so
/// a backend never receives a route it would have to re-decide.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum IpcRoute {
    /// World size 1: a copy, or nothing in place.
    Local,
    /// [`Route::IpcOneShot`].
    OneShot,
    /// [`Route::IpcReduceScatterAllGather`] (all_reduce only).
    ReduceScatterAllGather,
    /// [`Route::IpcPushLl`].
    PushLl,
    /// [`Route::IpcPush`].
    Push,
}

impl IpcRoute {
    /// The route as signatures and reports carry it.
    pub const fn route(self) -> Route {
        match self {
            IpcRoute::Local => Route::Local,
            IpcRoute::OneShot => Route::IpcOneShot,
            IpcRoute::ReduceScatterAllGather => Route::IpcReduceScatterAllGather,
            IpcRoute::PushLl => Route::IpcPushLl,
            IpcRoute::Push => Route::IpcPush,
        }
    }
    /// The IPC route `route` names; `None` for the routes that need the transport.
    pub const fn of(route: Route) -> Option<IpcRoute> {
        match route {
            Route::Local => Some(IpcRoute::Local),
            Route::IpcOneShot => Some(IpcRoute::OneShot),
            Route::IpcReduceScatterAllGather => Some(IpcRoute::ReduceScatterAllGather),
            Route::IpcPushLl => Some(IpcRoute::PushLl),
            Route::IpcPush => Some(IpcRoute::Push),
            Route::Transport | Route::IpcReduceScatterTransportAllGather | Route::Hierarchical => None,
        }
    }
}
