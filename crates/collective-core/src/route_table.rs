//! The route policy as data: `op × per-rank input bytes → route`, the one thing that decides
//! which route a call takes.
//!
//! Why a type of its own, here: the factory's routing tables (JSON, per platform, agreed by every
//! rank) and an IPC backend used on its own must decide by the same rules, in the same way, or a
//! call would take one route in [`Collective::route`](crate::Collective::route) and another on the
//! device. So the backends hold a `RouteTable` (the factory hands them its agreed table) and only
//! look it up; they keep no thresholds of their own. A world of one rank is decided here too, once,
//! when the table is bound to a world ([`RouteTable::for_world`]): every call is then `Local`.
use crate::{Error, IpcRoute, Op, Route, ipc_route_for};

/// One op's rules: sorted `(min_bytes, max_bytes exclusive or None, route)` tiling `0..∞`.
type Ranges = Vec<(u64, Option<u64>, Route)>;

/// A checked route policy: for every op, ranges of per-rank input bytes that tile `0..∞`
/// without gaps or overlaps, each naming a route.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct RouteTable {
    /// Per op, in [`Op::ALL`] order.
    ranges: [Ranges; 4],
    /// The fused all_reduce + residual + RMSNorm's all_reduce, when its rules differ from the
    /// plain all_reduce's ([`RouteTable::with_fused_norm`]); `None`: the all_reduce's.
    fused_norm: Option<Ranges>,
}

/// The name of the fused all_reduce + residual + RMSNorm in a routing table's rules (its own
/// ranges are optional: without them the fused call's all_reduce takes the all_reduce's).
pub const FUSED_NORM_OP: &str = "all_reduce_residual_rmsnorm";

/// `max`, written for a message: a byte count, or `∞`.
fn bound(max: Option<u64>) -> String {
    max.map_or_else(|| "∞".to_string(), |m| m.to_string())
}

/// Sorts `rs` (the rules of `op`, named in errors) and checks that they tile `0..∞`: no gap,
/// no overlap, none empty.
fn tile(op: &str, rs: &mut Ranges) -> Result<(), Error> {
    let bad = |detail: String| Error::InvalidConfig { detail: format!("routing table: {detail}") };
    if let Some(&(min, max, _)) = rs.iter().find(|r| r.1.is_some_and(|m| m <= r.0)) {
        return Err(bad(format!("{op} rule {min}..{} is empty", bound(max))));
    }
    rs.sort_by_key(|r| r.0);
    let mut next = Some(0u64);
    for &(min, max, _) in rs.iter() {
        match next {
            Some(n) if n == min => {}
            Some(n) if n < min => return Err(bad(format!("{op} rules leave a gap: no rule covers {n}..{min} bytes"))),
            Some(n) => return Err(bad(format!("{op} rules overlap at {min}..{n} bytes"))),
            None => return Err(bad(format!("{op} rules overlap: a rule from {min} bytes follows one to ∞"))),
        }
        next = max;
    }
    match next {
        Some(n) => Err(bad(format!("{op} has no rule from {n} bytes upwards"))),
        None => Ok(()),
    }
}

/// The position of `op` in [`Op::ALL`].
const fn index(op: Op) -> usize {
    match op {
        Op::AllReduce => 0,
        Op::AllGather => 1,
        Op::ReduceScatter => 2,
        Op::ReduceScatterMany => 3,
    }
}

impl RouteTable {
    /// The table of `rules` (`(op, min_bytes, max_bytes exclusive or None, route)`, any order).
    /// `InvalidConfig` when a rule is empty, when an op's rules leave a gap or overlap or do not
    /// reach `∞`, or when all_gather takes the hybrid route (it reduces nothing to split).
    pub fn new(rules: impl IntoIterator<Item = (Op, u64, Option<u64>, Route)>) -> Result<RouteTable, Error> {
        let bad = |detail: String| Error::InvalidConfig { detail: format!("routing table: {detail}") };
        let mut ranges: [Ranges; 4] = Default::default();
        for (op, min, max, route) in rules {
            if op == Op::AllGather && route == Route::IpcReduceScatterTransportAllGather {
                return Err(bad(format!("all_gather reduces nothing, so it cannot take `{}`", route.name())));
            }
            ranges[index(op)].push((min, max, route));
        }
        for (op, rs) in Op::ALL.iter().zip(ranges.iter_mut()) {
            tile(op.name(), rs)?;
        }
        Ok(RouteTable { ranges, fused_norm: None })
    }

    /// This table with rules of their own for the fused all_reduce + residual + RMSNorm's
    /// all_reduce (`(min_bytes, max_bytes exclusive or None, route)`, any order, tiling `0..∞`
    /// as every op's must; any all_reduce route): where the norm makes another route the faster
    /// (on one GPU the LL push route's fused form normalises a row per block, the one-shot
    /// route's a tile per block). Without them the fused call takes the all_reduce's route.
    pub fn with_fused_norm(
        mut self,
        rules: impl IntoIterator<Item = (u64, Option<u64>, Route)>,
    ) -> Result<RouteTable, Error> {
        let mut rs: Ranges = rules.into_iter().collect();
        tile(FUSED_NORM_OP, &mut rs)?;
        self.fused_norm = Some(rs);
        Ok(self)
    }

    /// Every op, every size: `route`.
    pub fn uniform(route: Route) -> RouteTable {
        RouteTable { ranges: std::array::from_fn(|_| vec![(0, None, route)]), fused_norm: None }
    }

    /// The table an IPC backend follows when nobody gives it one: all_reduce takes RS+AG from
    /// `rsag_from` bytes per rank (one-shot reads `world` inputs per rank, RS+AG reads 2), every
    /// other call one-shot. What `detcoll_protocol::IpcConfig::new` starts from.
    pub fn ipc_default(rsag_from: usize) -> RouteTable {
        RouteTable::by_size(SizeRoutes { rsag_from: Some(rsag_from), ..SizeRoutes::default() })
    }

    /// The table that size thresholds describe (see [`SizeRoutes`]): a compact way to write an
    /// IPC policy in code (tests, examples, benchmarks). Adjacent ranges of one route merge.
    pub fn by_size(s: SizeRoutes) -> RouteTable {
        let cuts = |op: Op| -> Vec<u64> {
            let mut c = vec![0u64, 1];
            c.extend(s.ll_up_to.and_then(|t| t.checked_add(1)).map(|t| t as u64));
            if op != Op::ReduceScatterMany {
                c.extend(s.bulk_from.map(|t| t as u64));
            }
            if op == Op::AllReduce {
                c.extend(s.rsag_from.map(|t| t as u64));
            }
            c.sort_unstable();
            c.dedup();
            c
        };
        let ranges = Op::ALL.map(|op| {
            let cuts = cuts(op);
            let mut rs: Ranges = Vec::new();
            for &min in &cuts {
                let route = s.route_at(op, min);
                if rs.last().is_some_and(|last| last.2 == route) {
                    continue;
                }
                if let Some(last) = rs.last_mut() {
                    last.1 = Some(min);
                }
                rs.push((min, None, route));
            }
            rs
        });
        RouteTable { ranges, fused_norm: None }
    }

    /// This table bound to a world of `world` ranks: a single rank has nothing to exchange, so
    /// every call is `Local` (the one place a world of one is decided); other worlds keep the
    /// table.
    pub fn for_world(self, world: usize) -> RouteTable {
        if world == 1 { RouteTable::uniform(Route::Local) } else { self }
    }

    /// This table for ranks without the transport: transport ranges become IPC — one-shot, and
    /// the hybrid IPC RS+AG. Same bits, possibly slower.
    pub fn without_transport(&self) -> RouteTable {
        self.mapped(|_, r| r.without_transport())
    }

    /// The route of a call of `op` with `bytes` of per-rank input.
    pub fn route(&self, op: Op, bytes: usize) -> Route {
        find(&self.ranges[index(op)], bytes)
    }

    /// The route of a fused all_reduce + residual + RMSNorm's all_reduce with `bytes` of
    /// per-rank input: its own rules ([`RouteTable::with_fused_norm`]) or the all_reduce's.
    pub fn fused_norm_route(&self, bytes: usize) -> Route {
        match &self.fused_norm {
            Some(rs) => find(rs, bytes),
            None => self.route(Op::AllReduce, bytes),
        }
    }

    /// The IPC route an IPC backend takes for a fused call's all_reduce
    /// ([`RouteTable::fused_norm_route`]); `None` when the table sends it to the transport.
    pub fn fused_norm_ipc_route(&self, bytes: usize) -> Option<IpcRoute> {
        let r = self.fused_norm_route(bytes);
        if r.needs_transport() { None } else { IpcRoute::of(ipc_route_for(Op::AllReduce, r)) }
    }

    /// The fused call's own rules, if the table has them (sorted, as [`RouteTable::rules`]).
    pub fn fused_norm_rules(&self) -> Option<&[(u64, Option<u64>, Route)]> {
        self.fused_norm.as_deref()
    }

    /// The IPC route an IPC backend takes for such a call ([`ipc_route_for`]: RS+AG is an
    /// all_reduce route; other ops take one-shot there); `None` when the table sends the call
    /// to the transport.
    pub fn ipc_route(&self, op: Op, bytes: usize) -> Option<IpcRoute> {
        let r = self.route(op, bytes);
        if r.needs_transport() { None } else { IpcRoute::of(ipc_route_for(op, r)) }
    }

    /// The rules of `op`: sorted `(min_bytes, max_bytes exclusive or None, route)`.
    pub fn rules(&self, op: Op) -> &[(u64, Option<u64>, Route)] {
        &self.ranges[index(op)]
    }

    /// Every route some rule takes.
    pub fn routes(&self) -> impl Iterator<Item = Route> + '_ {
        self.ranges.iter().chain(&self.fused_norm).flatten().map(|r| r.2)
    }

    /// The smallest size of `op` routed to `route`, if any.
    pub fn first_bytes(&self, op: Op, route: Route) -> Option<usize> {
        self.rules(op).iter().filter(|r| r.2 == route).map(|r| usize::try_from(r.0).unwrap_or(usize::MAX)).min()
    }

    /// The same table with every route replaced by `f(op, route)` (adjacent equal routes stay
    /// separate rules; lookups are unaffected).
    pub fn mapped(&self, f: impl Fn(Op, Route) -> Route) -> RouteTable {
        let mut t = self.clone();
        for (op, rs) in Op::ALL.iter().zip(t.ranges.iter_mut()) {
            for r in rs.iter_mut() {
                r.2 = f(*op, r.2);
            }
        }
        // The fused call's rules route an all_reduce.
        for r in t.fused_norm.iter_mut().flatten() {
            r.2 = f(Op::AllReduce, r.2);
        }
        t
    }
}

/// The route of the rule of `rs` (tiling `0..∞`) that holds `bytes`.
fn find(rs: &Ranges, bytes: usize) -> Route {
    let b = bytes as u64;
    rs.iter().find(|(min, max, _)| b >= *min && max.is_none_or(|m| b < m)).map_or(Route::IpcOneShot, |r| r.2)
}

/// An IPC route policy written as size thresholds (bytes of per-rank input), checked in this
/// order: the LL push route up to `ll_up_to` (inclusive), the bulk push route from `bulk_from`
/// (not reduce_scatter_many, which has no bulk plan), IPC RS+AG for non-empty all_reduce from
/// `rsag_from`, one-shot otherwise. `None`: never.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SizeRoutes {
    pub ll_up_to: Option<usize>,
    pub bulk_from: Option<usize>,
    pub rsag_from: Option<usize>,
}

impl SizeRoutes {
    /// The route these thresholds give a call of `op` with `bytes` per rank.
    fn route_at(&self, op: Op, bytes: u64) -> Route {
        let at_least = |t: Option<usize>| t.is_some_and(|t| bytes >= t as u64);
        if self.ll_up_to.is_some_and(|t| bytes <= t as u64) {
            Route::IpcPushLl
        } else if at_least(self.bulk_from) && op != Op::ReduceScatterMany {
            Route::IpcPush
        } else if op == Op::AllReduce && bytes > 0 && at_least(self.rsag_from) {
            Route::IpcReduceScatterAllGather
        } else {
            Route::IpcOneShot
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_routes_give_the_route_their_thresholds_describe_at_every_boundary() {
        let s = SizeRoutes { ll_up_to: Some(2048), bulk_from: Some(128 << 10), rsag_from: Some(16 << 10) };
        let t = RouteTable::by_size(s);
        for op in Op::ALL {
            for b in [0u64, 1, 2047, 2048, 2049, (16 << 10) - 1, 16 << 10, (128 << 10) - 1, 128 << 10, u64::MAX / 2] {
                assert_eq!(t.route(op, b as usize), s.route_at(op, b), "{op} at {b}");
            }
        }
        assert_eq!(t.route(Op::AllReduce, 2049), Route::IpcOneShot);
        assert_eq!(t.route(Op::AllReduce, 16 << 10), Route::IpcReduceScatterAllGather);
        assert_eq!(t.route(Op::ReduceScatter, 16 << 10), Route::IpcOneShot);
        assert_eq!(t.route(Op::ReduceScatterMany, 1 << 30), Route::IpcOneShot);
        assert_eq!(t.route(Op::AllGather, 1 << 30), Route::IpcPush);
        // The rules tile 0..∞ (the checked constructor accepts them back).
        let rules = Op::ALL.iter().flat_map(|&op| t.rules(op).iter().map(move |r| (op, r.0, r.1, r.2)));
        assert_eq!(RouteTable::new(rules.collect::<Vec<_>>()).unwrap(), t);
    }

    #[test]
    fn the_default_ipc_table_is_one_shot_with_rsag_for_large_all_reduce() {
        let t = RouteTable::ipc_default(512 << 10);
        assert_eq!(t.route(Op::AllReduce, 0), Route::IpcOneShot);
        assert_eq!(t.route(Op::AllReduce, (512 << 10) - 1), Route::IpcOneShot);
        assert_eq!(t.route(Op::AllReduce, 512 << 10), Route::IpcReduceScatterAllGather);
        assert_eq!(t.ipc_route(Op::ReduceScatter, 1 << 30), Some(IpcRoute::OneShot));
        assert_eq!(t.first_bytes(Op::AllReduce, Route::IpcReduceScatterAllGather), Some(512 << 10));
    }

    #[test]
    fn a_world_of_one_is_local_whatever_the_table() {
        let t = RouteTable::uniform(Route::Transport).for_world(1);
        for op in Op::ALL {
            assert_eq!(t.ipc_route(op, 12345), Some(IpcRoute::Local));
        }
        assert_eq!(RouteTable::uniform(Route::Transport).for_world(2).ipc_route(Op::AllReduce, 1), None);
    }

    #[test]
    fn gaps_overlaps_empty_rules_and_a_gathering_hybrid_are_refused() {
        let ok = |op| [(op, 0, None, Route::IpcOneShot)];
        let rest = |skip: Op| Op::ALL.into_iter().filter(move |o| *o != skip).flat_map(ok);
        let with = |extra: Vec<(Op, u64, Option<u64>, Route)>| {
            RouteTable::new(rest(Op::AllReduce).chain(extra)).map_err(|e| e.to_string())
        };
        assert!(with(vec![(Op::AllReduce, 0, Some(10), Route::IpcOneShot)]).unwrap_err().contains("no rule from"));
        assert!(
            with(vec![(Op::AllReduce, 0, Some(10), Route::IpcOneShot), (Op::AllReduce, 11, None, Route::IpcPush)])
                .unwrap_err()
                .contains("leave a gap: no rule covers 10..11 bytes")
        );
        assert!(with(vec![(Op::AllReduce, 5, Some(5), Route::IpcOneShot)]).unwrap_err().contains("empty"));
        let hybrid = RouteTable::new(rest(Op::AllGather).chain([(
            Op::AllGather,
            0,
            None,
            Route::IpcReduceScatterTransportAllGather,
        )]));
        assert!(matches!(hybrid, Err(Error::InvalidConfig { .. })));
    }

    #[test]
    fn a_fused_norm_rule_set_routes_the_fused_call_and_nothing_else() {
        let base = RouteTable::by_size(SizeRoutes { ll_up_to: Some(512 << 10), ..SizeRoutes::default() });
        // Without rules of its own the fused call takes the all_reduce's route.
        assert_eq!(base.fused_norm_route(1024), Route::IpcPushLl);
        assert_eq!(base.fused_norm_rules(), None);
        let t = base
            .clone()
            .with_fused_norm([(1 << 20, None, Route::IpcPush), (0, Some(1 << 20), Route::IpcOneShot)])
            .unwrap();
        assert_eq!(t.fused_norm_route(0), Route::IpcOneShot);
        assert_eq!(t.fused_norm_route((1 << 20) - 1), Route::IpcOneShot);
        assert_eq!(t.fused_norm_route(1 << 20), Route::IpcPush);
        assert_eq!(t.fused_norm_ipc_route(1024), Some(IpcRoute::OneShot));
        for op in Op::ALL {
            assert_eq!(t.route(op, 1024), base.route(op, 1024), "{op}");
        }
        assert!(t.routes().any(|r| r == Route::IpcPush));
        // Mapped with the all_reduce's op; a world of one is local for it too.
        let mapped = t.mapped(|op, r| if op == Op::AllReduce && r == Route::IpcOneShot { Route::Transport } else { r });
        assert_eq!(mapped.fused_norm_route(1024), Route::Transport);
        assert_eq!(mapped.fused_norm_ipc_route(1024), None);
        assert_eq!(t.clone().for_world(1).fused_norm_route(1024), Route::Local);
        // Its rules are checked as every op's.
        let err = |rules: Vec<(u64, Option<u64>, Route)>| base.clone().with_fused_norm(rules).unwrap_err().to_string();
        assert!(
            err(vec![(0, Some(10), Route::IpcOneShot)]).contains("all_reduce_residual_rmsnorm has no rule from 10")
        );
        let overlap = err(vec![(0, None, Route::IpcOneShot), (0, None, Route::IpcPush)]);
        assert!(overlap.contains("overlap: a rule from 0 bytes follows one to ∞"), "{overlap}");
        assert!(err(vec![(0, Some(10), Route::IpcOneShot), (5, None, Route::IpcPush)]).contains("overlap at 5..10"));
        assert!(err(vec![(0, Some(0), Route::IpcOneShot)]).contains("rule 0..0 is empty"));
        assert!(err(vec![]).contains("no rule from 0 bytes upwards"));
    }
}
