//! The hierarchical route: IPC inside each node, the transport across nodes, the same bits as
//! the flat route.
//!
//! Ranks are node-major (`rank = node * L + local rank`) with `L`, the ranks per node, a power
//! of two: then every split of the canonical tree (first `m` ranks, `m` the largest power of
//! two below the size, then the rest) falls on a node boundary, so the tree over `W` ranks is
//! the canonical tree over the `N` node partials, each the canonical tree over its node's `L`
//! ranks. The route evaluates exactly that:
//!
//! * all_reduce: IPC reduce_scatter inside the node (local rank `l` holds shard `l` of the node
//!   partial), the transport's all_reduce of that shard among the `N` ranks of local rank `l`
//!   (a rank-ordered gather and the tree over `N`: the top levels), IPC all_gather inside the
//!   node. Elements past the last whole multiple of `L` (fewer than `L`) take an IPC
//!   all_reduce and a transport all_reduce of their own.
//! * reduce_scatter: IPC reduce_scatter_many inside the node (lane `m` is node block `m`, its
//!   shard `l` lands in slot `m` of a scratch row), then the transport's reduce_scatter of the
//!   scratch row across nodes (node `n` receives the tree of slot `n`: its own shard).
//! * all_gather: IPC all_gather of the node's block, then the transport's all_gather of node
//!   blocks. No add, nothing to order.
//! * a call with no element (0 elements, or a reduce_scatter_many with no lanes or only empty
//!   ones): one empty reduce_scatter_many inside the node and one empty all_reduce across
//!   nodes, each signed with the whole call, so it is a call of the group as on the flat routes
//!   (a peer making another call fails instead of waiting for this rank; `Nodes::empty_step`).
//!
//! The layout comes from the agreement: every rank's host identity, in rank order
//! ([`NodeLayout::of_hosts`]); other layouts take the flat transport route (same bits).
//!
//! Errors name the world's ranks: the collective inside the node and the transport across
//! nodes are smaller collectives with ranks of their own (a node's local rank, a node index),
//! and the route renames the ranks their errors name ([`Error::map_ranks`]), so a peer that
//! died, stalled or disagreed is the rank the user started; the first failure that poisons the
//! route is what its later calls report.
pub use crate::scratch::{CallStream, DeviceScratch, HostScratch, Scratch};
use crate::via::Via;
use collective_core::bootstrap::{Bootstrap, split};
use collective_core::{
    Call, Capabilities, Collective, DType, Error, Io, IpcRoute, MAX_LANES, Op, RawMut, RawRef, Route, RouteSelect,
    RouteTable, Signature, validate, validate_many,
};

/// How the ranks of a world sit on nodes: `nodes` nodes of `local` ranks, node-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLayout {
    /// Number of nodes, `N` (at least 2).
    pub nodes: usize,
    /// Ranks per node, `L` (a power of two, 2 to [`collective_core::MAX_NODE_WORLD_SIZE`]).
    pub local: usize,
}

impl NodeLayout {
    /// The layout of ranks whose hosts are `hosts` (rank order) when the hierarchical route can
    /// serve it: two or more hosts, each host's ranks one contiguous run (node-major), every run
    /// of the same power-of-two length `L` with `2 <= L <= 8`. `None` otherwise (one host, or
    /// a layout the flat transport route serves with the same bits).
    pub fn of_hosts<S: AsRef<str>>(hosts: &[S]) -> Option<NodeLayout> {
        let mut runs: Vec<(&str, usize)> = Vec::new();
        for h in hosts {
            match runs.last_mut() {
                Some((last, n)) if *last == h.as_ref() => *n += 1,
                _ => runs.push((h.as_ref(), 1)),
            }
        }
        let local = runs.first()?.1;
        let node_major = runs.iter().enumerate().all(|(i, (h, _))| runs[..i].iter().all(|(g, _)| g != h));
        let even = runs.iter().all(|&(_, n)| n == local);
        let fits = local.is_power_of_two() && (2..=collective_core::MAX_NODE_WORLD_SIZE).contains(&local);
        (runs.len() >= 2 && node_major && even && fits).then_some(NodeLayout { nodes: runs.len(), local })
    }

    /// The layout of `world` ranks on one host, more than one IPC world holds
    /// ([`collective_core::MAX_NODE_WORLD_SIZE`]): consecutive groups of `L` ranks, `L` the
    /// largest power of two that divides `world`, at most the IPC world limit, each group a
    /// node of the hierarchical route (16 ranks on one host: 2 nodes of 8; 24: 3 of 8; 12:
    /// 3 of 4). `None` for a world one IPC collective holds, or an odd one (the flat
    /// transport route serves it, with the same bits).
    pub fn of_one_host(world: usize) -> Option<NodeLayout> {
        if world <= collective_core::MAX_NODE_WORLD_SIZE {
            return None;
        }
        let local = (1usize << world.trailing_zeros()).min(collective_core::MAX_NODE_WORLD_SIZE);
        (local >= 2).then_some(NodeLayout { nodes: world / local, local })
    }

    /// The node of `rank`.
    pub const fn node(&self, rank: usize) -> usize {
        rank / self.local
    }

    /// `rank`'s index inside its node.
    pub const fn local_rank(&self, rank: usize) -> usize {
        rank % self.local
    }

    /// Ranks in all.
    pub const fn world(&self) -> usize {
        self.nodes * self.local
    }
}

/// A group of ranks made by `split`, shared by the backends built over it.
#[cfg_attr(not(any(feature = "cpu", feature = "cuda", feature = "rocm")), allow(dead_code))]
pub(crate) type Group = std::sync::Arc<dyn Bootstrap>;

/// The two groups of the hierarchical route that `boot`'s rank belongs to, made in the same
/// order on every rank (collective over `boot`): its node's ranks (by local rank) and the ranks
/// of its local rank (by node).
#[cfg_attr(not(any(feature = "cpu", feature = "cuda", feature = "rocm")), allow(dead_code))]
pub(crate) fn node_groups(boot: &dyn Bootstrap, layout: NodeLayout) -> Result<(Group, Group), Error> {
    let rank = boot.rank();
    let (node, local_rank) = (layout.node(rank), layout.local_rank(rank));
    let group = |color: usize, key: usize| -> Result<Group, Error> {
        let sub = split(boot, Some(color as u32), key as u32)?
            .ok_or(Error::InvalidConfig { detail: "split returned no group for a colored rank".into() })?;
        Ok(std::sync::Arc::new(sub))
    };
    let node_boot = group(node, local_rank)?;
    let cross_boot = group(layout.nodes + local_rank, node)?;
    Ok((node_boot, cross_boot))
}

/// One rank's backends of the hierarchical route: the node's IPC collective, the transport
/// among the ranks of its local rank across nodes, and the scratch row.
pub struct Nodes<I: Collective, T> {
    layout: NodeLayout,
    rank: usize,
    /// The IPC backend of this rank's node (`L` ranks).
    local: I,
    /// How the node's IPC calls are routed (the agreed table on one host).
    routes: RouteTable,
    /// The transport of the `N` ranks of this local rank (one per node, node order).
    cross: T,
    scratch: Box<dyn Scratch<I::Stream>>,
    /// The first failure that poisoned the route, its ranks the world's (what later calls
    /// report, rather than the backends' own record in their ranks).
    failed: std::sync::OnceLock<String>,
    /// `close` began: `check` says `Closed` from then on, as the flat routes do.
    closed: std::sync::atomic::AtomicBool,
}

impl<I: Collective + std::fmt::Debug, T: std::fmt::Debug> std::fmt::Debug for Nodes<I, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nodes")
            .field("layout", &self.layout)
            .field("rank", &self.rank)
            .field("local", &self.local)
            .field("cross", &self.cross)
            .field("scratch", &self.scratch)
            .finish_non_exhaustive()
    }
}

/// The address `offset` elements of `size` bytes past `addr`.
fn at(addr: u64, offset: usize, size: usize) -> u64 {
    addr + (offset * size) as u64
}

/// A writable view of `len` elements of `dtype` at `addr`. Only for this module, which passes
/// sub-ranges of the validated views of the call it is making (or of its scratch row).
fn out_view(addr: u64, len: usize, dtype: DType) -> RawMut<'static> {
    // SAFETY: every caller in this module names a range inside the validated output (or
    // in-place buffer) of the call in progress, or inside the scratch row, which the call
    // borrows for its whole duration; the steps that use the views run in order on one stream.
    unsafe { RawMut::from_raw(addr, len, dtype) }
}

/// A readable view, as [`out_view`].
fn in_view(addr: u64, len: usize, dtype: DType) -> RawRef<'static> {
    // SAFETY: as in `out_view`, inside the validated input of the call or the scratch row.
    unsafe { RawRef::from_raw(addr, len, dtype) }
}

impl<I: RouteSelect, T: Collective<Stream = I::Stream>> Nodes<I, T> {
    /// Composes the node's IPC collective `local` (rank `layout.local_rank(rank)` of `L`) and
    /// the cross-node transport `cross` (rank `layout.node(rank)` of `N`).
    pub fn new(
        layout: NodeLayout,
        rank: usize,
        local: I,
        routes: RouteTable,
        cross: T,
        scratch: Box<dyn Scratch<I::Stream>>,
    ) -> Result<Self, Error> {
        let bad = |what: &str, got: usize, want: usize| {
            Err(Error::InvalidConfig { detail: format!("hierarchical route: {what} is {got}, expected {want}") })
        };
        if local.world_size() != layout.local || local.rank() != layout.local_rank(rank) {
            return bad("the node collective's world", local.world_size(), layout.local);
        }
        if cross.world_size() != layout.nodes || cross.rank() != layout.node(rank) {
            return bad("the cross-node transport's world", cross.world_size(), layout.nodes);
        }
        let routes = routes.without_transport().for_world(layout.local);
        Ok(Nodes {
            layout,
            rank,
            local,
            routes,
            cross,
            scratch,
            failed: std::sync::OnceLock::new(),
            closed: Default::default(),
        })
    }

    /// The layout.
    pub fn layout(&self) -> NodeLayout {
        self.layout
    }

    /// The IPC collective of this rank's node.
    pub fn local(&self) -> &I {
        &self.local
    }

    /// The transport among the ranks of this rank's local rank, one per node.
    pub fn cross(&self) -> &T {
        &self.cross
    }

    fn route(&self, op: Op, bytes: usize) -> Result<IpcRoute, Error> {
        self.routes.ipc_route(op, bytes).ok_or_else(|| Error::InvalidConfig {
            detail: format!("hierarchical route: no IPC route for {op} of {bytes} bytes inside the node"),
        })
    }

    /// One single-lane call by the hierarchical route, its signature's `split` being `split`
    /// (a fused call's norm; 0 for a plain call). Every IPC part inside the node is signed
    /// with the whole call (`Signature::part_split`): the parts of two different calls can
    /// have the same sizes (an all_reduce of 100 elements then one of 1 against one of 101 in
    /// nodes of 4), and signed alone they ran each other's parts.
    pub(crate) fn dispatch(&self, op: Op, io: Io<'_>, split: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        // Either backend poisoned fails the call before any work: the step inside the node
        // would otherwise run, and write the output, before the poisoned step across refuses.
        self.check()?;
        self.record(self.run(op, io, split, &self.world_ranks(via)))
    }

    /// reduce_scatter_many: every lane validated first, then each by
    /// [`Nodes::reduce_scatter_lane`]; a call with no element (no lanes, or every lane empty)
    /// by [`Nodes::empty_step`], so it is still a call of the group.
    /// `split`: the front door's call number (`Signature::call_split`), signed into every part.
    pub(crate) fn reduce_scatter_many(&self, lanes: &[Io<'_>], split: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        self.check()?;
        self.record(self.run_many(lanes, split, &self.world_ranks(via)))
    }

    /// `via` with the backends' errors in the world's ranks.
    fn world_ranks<'v, V: Via<I, T>>(&self, via: &'v V) -> WorldRanks<'v, V> {
        WorldRanks { via, names: self.names() }
    }

    /// How this rank's backends' ranks are named in the world.
    fn names(&self) -> WorldNames {
        let (l, node) = (self.layout.local, self.layout.node(self.rank));
        WorldNames { node_base: node * l, local: l, local_rank: self.layout.local_rank(self.rank) }
    }

    /// `result`, its failure kept as the route's poison when it is one.
    /// Both backends are abandoned then: this rank takes no further part in the route, so a
    /// partner across nodes waiting for it fails at once (a host transport's bootstrap is
    /// released) instead of at the exchange timeout, and so does a rank of its node waiting
    /// in the node's last step when this rank's step across nodes failed (the IPC backends
    /// set this rank's status word, which their waits poll).
    fn record(&self, result: Result<(), Error>) -> Result<(), Error> {
        if let Err(e) = &result
            && e.poisons()
        {
            self.abandon(&e.to_string());
        }
        result
    }

    /// Fails the route for good with `cause` and both backends with it (see `record`).
    pub(crate) fn abandon(&self, cause: &str) {
        self.cross.abandon(cause);
        self.local.abandon(cause);
        let _ = self.failed.set(cause.to_string());
    }

    /// One call after the poison check, through `via` (in the world's ranks).
    fn run(&self, op: Op, io: Io<'_>, split: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        let world = self.layout.world();
        let call = validate(op, &io, self.rank, world, usize::MAX)?;
        let part = Signature::part_split(&Signature { split, route: Route::Hierarchical, ..call.signature() });
        if call.count_in == 0 {
            // No element on any step (an all_reduce or all_gather of 0, a reduce_scatter of 0
            // per rank; the lanes of `reduce_scatter_many` are counted in `run_many`).
            return self.empty_step(call.dtype, part, via);
        }
        match op {
            Op::AllReduce => self.all_reduce(call, part, via),
            Op::AllGather => self.all_gather(call, part, via),
            Op::ReduceScatter => self.reduce_scatter_lane(call.src, call.dst, call.count_out, call.dtype, part, via),
            Op::ReduceScatterMany => self.run_many(&[io], split, via),
        }
    }

    fn all_reduce(&self, call: Call, part: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        let (l, size, dtype) = (self.layout.local, call.dtype.size(), call.dtype);
        let n = call.count_in;
        let main = n / l * l;
        let shard = main / l;
        let me = self.layout.local_rank(self.rank);
        if main > 0 {
            let mine = at(call.dst, me * shard, size);
            let rs = self.route(Op::ReduceScatter, main * size)?;
            if call.in_place {
                let whole = out_view(call.dst, main, dtype);
                via.ipc(&self.local, Op::ReduceScatter, Io::InPlace(whole), rs, part)?;
            } else {
                let input = in_view(call.src, main, dtype);
                let output = out_view(mine, shard, dtype);
                via.ipc(&self.local, Op::ReduceScatter, Io::OutOfPlace { input, output }, rs, part)?;
            }
            let partial = out_view(mine, shard, dtype);
            via.transport(&self.cross, Op::AllReduce, Io::InPlace(partial), part)?;
            let ag = self.route(Op::AllGather, shard * size)?;
            let whole = out_view(call.dst, main, dtype);
            via.ipc(&self.local, Op::AllGather, Io::InPlace(whole), ag, part)?;
        }
        let tail = n - main;
        if tail > 0 {
            let out = at(call.dst, main, size);
            let ar = self.route(Op::AllReduce, tail * size)?;
            let io = if call.in_place {
                Io::InPlace(out_view(out, tail, dtype))
            } else {
                Io::OutOfPlace {
                    input: in_view(at(call.src, main, size), tail, dtype),
                    output: out_view(out, tail, dtype),
                }
            };
            via.ipc(&self.local, Op::AllReduce, io, ar, part)?;
            via.transport(&self.cross, Op::AllReduce, Io::InPlace(out_view(out, tail, dtype)), part)?;
        }
        Ok(())
    }

    fn all_gather(&self, call: Call, part: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        let (l, size, dtype) = (self.layout.local, call.dtype.size(), call.dtype);
        let k = call.count_in;
        let node = self.layout.node(self.rank);
        let block = at(call.dst, node * l * k, size);
        let ag = self.route(Op::AllGather, k * size)?;
        let io = if call.in_place {
            Io::InPlace(out_view(block, l * k, dtype))
        } else {
            Io::OutOfPlace { input: in_view(call.src, k, dtype), output: out_view(block, l * k, dtype) }
        };
        via.ipc(&self.local, Op::AllGather, io, ag, part)?;
        // The whole output; this node's block is at position `node`.
        let whole = out_view(call.dst, self.layout.world() * k, dtype);
        via.transport(&self.cross, Op::AllGather, Io::InPlace(whole), part)
    }

    /// One reduce_scatter lane: `W * k` elements at `src`, this rank's `k` to `dst`, its IPC
    /// part signed with the whole call (`part`).
    fn reduce_scatter_lane(
        &self,
        src: u64,
        dst: u64,
        k: usize,
        dtype: DType,
        part: u32,
        via: &impl Via<I, T>,
    ) -> Result<(), Error> {
        let (n, size) = (self.layout.nodes, dtype.size());
        if k == 0 {
            // An empty lane beside a non-empty one makes no step of its own: the other lanes'
            // steps are signed with the whole call (`part`, whose lanes count this one), so
            // the call is still one of the group (`run_many` takes a call with no element).
            return Ok(());
        }
        let row_bytes = n.checked_mul(k).and_then(|e| e.checked_mul(size)).ok_or(Error::SizeOverflow {
            op: Op::ReduceScatter,
            argument: "input",
            len: k,
        })?;
        let row = self.scratch.acquire(row_bytes, via.stream())?;
        let staged = self.stage_row(src, row, k, dtype, part, via);
        // The row's last use is enqueued (or the call failed after enqueuing some of it):
        // either way the next call must wait for what is on the stream.
        let released = self.scratch.release(via.stream());
        staged?;
        released?;
        let io = Io::OutOfPlace { input: in_view(row, n * k, dtype), output: out_view(dst, k, dtype) };
        let crossed = via.transport(&self.cross, Op::ReduceScatter, io, part);
        let released = self.scratch.release(via.stream());
        crossed.and(released)
    }

    /// The node's IPC step of a reduce_scatter lane: node block `m` of the input reduced
    /// inside the node into slot `m` of the scratch row at `row`.
    fn stage_row(
        &self,
        src: u64,
        row: u64,
        k: usize,
        dtype: DType,
        part: u32,
        via: &impl Via<I, T>,
    ) -> Result<(), Error> {
        let (l, n, size) = (self.layout.local, self.layout.nodes, dtype.size());
        let nodes: Vec<usize> = (0..n).collect();
        for group in nodes.chunks(MAX_LANES) {
            // Node block `m` of the input into slot `m` of the scratch row.
            let lanes: Vec<Io<'_>> = group
                .iter()
                .map(|&m| Io::OutOfPlace {
                    input: in_view(at(src, m * l * k, size), l * k, dtype),
                    output: out_view(at(row, m * k, size), k, dtype),
                })
                .collect();
            let route = self.route(Op::ReduceScatterMany, group.len() * l * k * size)?;
            via.ipc_many(&self.local, &lanes, route, part)?;
        }
        Ok(())
    }

    /// [`Nodes::reduce_scatter_many`] after the poison check.
    fn run_many(&self, lanes: &[Io<'_>], split: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        let (calls, sig) = validate_many(lanes, self.rank, self.layout.world(), usize::MAX)?;
        let part = Signature::part_split(&Signature { route: Route::Hierarchical, ..sig }.as_part(split));
        if sig.count == 0 {
            // No lanes, or every lane empty: no lane makes a step.
            return self.empty_step(sig.dtype, part, via);
        }
        for c in calls.iter() {
            self.reduce_scatter_lane(c.call.src, c.call.dst, c.call.count_out, c.call.dtype, part, via)?;
        }
        Ok(())
    }

    /// The steps of a call with no element to move (no lanes, every lane empty, or 0
    /// elements), signed with the whole call (`part`): one empty `reduce_scatter_many` on the
    /// node's collective, then one empty all_reduce across nodes. Every call is a call of the
    /// group, an empty one too, as on the flat routes (which sign an empty call like any
    /// other): without these steps the rank returned `Ok` at once while its peers made another
    /// call, and they failed only at its next call or at their bound. With them a peer making
    /// another call fails at the level it shares with this rank — `SignatureMismatch` inside
    /// the node, or across nodes on the host transports (a rank whose node step fails abandons
    /// its transport, so its partners across fail at once) — and ranks that all make the same
    /// empty call stay in step. The NCCL/RCCL transport signs no part and makes no step for an
    /// empty call: with it across nodes only the step inside the node checks the call.
    fn empty_step(&self, dtype: DType, part: u32, via: &impl Via<I, T>) -> Result<(), Error> {
        let route = self.route(Op::ReduceScatterMany, 0)?;
        via.ipc_many(&self.local, &[], route, part)?;
        // SAFETY: no element: the view names no memory, and nothing reads or writes through
        // it (the transports validate it and exchange the call's signature alone).
        let nothing = unsafe { RawMut::from_raw(0, 0, dtype) };
        via.transport(&self.cross, Op::AllReduce, Io::InPlace(nothing), part)
    }

    /// Graph capture when both backends support it; the largest call the cross step allows
    /// (an all_gather sends `L` times its input across).
    pub(crate) fn capabilities(&self) -> Capabilities {
        let (a, b) = (self.local.capabilities(), self.cross.capabilities());
        let graph = a.supports_graph_capture && b.supports_graph_capture;
        Capabilities::strict(b.max_call_bytes, graph).with_max_call_bytes(b.max_call_bytes / self.layout.local)
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        if self.closed.load(std::sync::atomic::Ordering::Acquire) {
            return Err(Error::Closed);
        }
        if let Some(cause) = self.failed.get() {
            return Err(Error::Poisoned { cause: cause.clone() });
        }
        self.local.check()?;
        self.cross.check()
    }

    pub(crate) fn synchronize(&self, stream: &I::Stream) -> Result<(), Error> {
        self.local.synchronize(stream)?;
        self.cross.check()
    }

    /// Closes both backends; their errors name the world's ranks, as calls' do.
    pub(crate) fn close(&self) -> Result<(), Error> {
        self.closed.store(true, std::sync::atomic::Ordering::Release);
        let names = self.names();
        let a = self.local.close().map_err(|e| names.in_node(e));
        let b = self.cross.close().map_err(|e| names.across(e));
        a.and(b)
    }
}

/// One rank's backends' ranks in the world: rank `p` of the node's collective is
/// `node * L + p`, rank `n` of the transport across nodes `n * L + local_rank`.
#[derive(Clone, Copy)]
struct WorldNames {
    /// `node * L`.
    node_base: usize,
    /// `L`.
    local: usize,
    local_rank: usize,
}

impl WorldNames {
    /// An error of the node's collective, in the world's ranks.
    fn in_node(self, e: Error) -> Error {
        e.map_ranks(|p| self.node_base + p)
    }

    /// An error of the transport across nodes, in the world's ranks.
    fn across(self, e: Error) -> Error {
        e.map_ranks(|n| n * self.local + self.local_rank)
    }
}

/// A call's way to the backends whose errors name the world's ranks ([`WorldNames`]).
struct WorldRanks<'v, V> {
    via: &'v V,
    names: WorldNames,
}

impl<I: Collective, T, V: Via<I, T>> Via<I, T> for WorldRanks<'_, V> {
    fn ipc(&self, ipc: &I, op: Op, io: Io<'_>, route: IpcRoute, part: u32) -> Result<(), Error> {
        self.via.ipc(ipc, op, io, route, part).map_err(|e| self.names.in_node(e))
    }
    fn transport(&self, transport: &T, op: Op, io: Io<'_>, part: u32) -> Result<(), Error> {
        self.via.transport(transport, op, io, part).map_err(|e| self.names.across(e))
    }
    fn ipc_many(&self, ipc: &I, lanes: &[Io<'_>], route: IpcRoute, part: u32) -> Result<(), Error> {
        self.via.ipc_many(ipc, lanes, route, part).map_err(|e| self.names.in_node(e))
    }
    fn stream(&self) -> CallStream<'_, I::Stream> {
        self.via.stream()
    }
}

#[cfg(test)]
mod tests {
    use super::NodeLayout;

    #[test]
    fn layouts_the_hierarchical_route_serves() {
        let l = |hosts: &[&str]| NodeLayout::of_hosts(hosts);
        assert_eq!(l(&["a", "a", "b", "b"]), Some(NodeLayout { nodes: 2, local: 2 }));
        assert_eq!(
            l(&["a", "a", "a", "a", "b", "b", "b", "b", "c", "c", "c", "c"]),
            Some(NodeLayout { nodes: 3, local: 4 })
        );
        // One host, one rank per node, uneven, not node-major, not a power of two, too many.
        assert_eq!(l(&["a", "a"]), None);
        assert_eq!(l(&["a", "b"]), None);
        assert_eq!(l(&["a", "a", "b"]), None);
        assert_eq!(l(&["a", "a", "b", "b", "a", "a"]), None);
        assert_eq!(l(&["a", "a", "a", "b", "b", "b"]), None);
        assert_eq!(l(&[["a"; 16], ["b"; 16]].concat()), None);
        assert_eq!(l(&[]), None);
    }

    #[test]
    fn one_host_above_the_ipc_world_splits_into_power_of_two_nodes() {
        let one = NodeLayout::of_one_host;
        assert_eq!(one(16), Some(NodeLayout { nodes: 2, local: 8 }));
        assert_eq!(one(24), Some(NodeLayout { nodes: 3, local: 8 }));
        assert_eq!(one(12), Some(NodeLayout { nodes: 3, local: 4 }));
        assert_eq!(one(18), Some(NodeLayout { nodes: 9, local: 2 }));
        assert_eq!(one(1024), Some(NodeLayout { nodes: 128, local: 8 }));
        // What one IPC world holds, and odd worlds (flat transport).
        assert_eq!(one(8), None);
        assert_eq!(one(2), None);
        assert_eq!(one(9), None);
        assert_eq!(one(15), None);
    }
}
