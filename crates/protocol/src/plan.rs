//! What one call stages, reduces and gathers: the same for every executor.
//!
//! A plan is a list of [`Segment`]s per [`Phase`], in element offsets of the staging frame and
//! caller addresses. It is built without heap allocation (fixed arrays), so building one on the
//! per-call hot path costs a few dozen instructions.
use collective_core::{Call, Error, LaneCall, MAX_LANES, Op, Route, Signature};

/// Most segments one phase can hold (one per lane, or one per peer).
const MAX_SEGMENTS: usize = if MAX_LANES > 8 { MAX_LANES } else { 8 };

/// Where a segment's values come from.
///
/// On the pull routes `frame_offset` is in every rank's staging frame; on the LL push route
/// ([`Route::IpcPushLl`]) it is the payload offset in the LL slots, and `Send`/`Scatter` take
/// the place of `Stage`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Copy this rank's input into its own frame (`src` → frame).
    Stage,
    /// Evaluate the fixed tree over every rank's frame, in rank order (frames → `dst`). On the
    /// push route: over this rank's slots, with this rank's own values read from `src`.
    Reduce,
    /// Copy a single peer's frame range (frame of `peer` → `dst`). On the push route: from
    /// this rank's slot of `peer`, or from `src` when `peer` is this rank.
    Gather,
    /// Push route: write `count` elements from `src` into this rank's slot of every peer.
    Send,
    /// Push route: write shard `q` (`count` elements at `src + q * count`) into this rank's
    /// slot of peer `q`, for every peer `q` (reduce_scatter: each shard goes to its owner).
    Scatter,
    /// Bulk push route ([`Route::IpcPush`]): write `count` elements from `src` into peer
    /// `peer`'s frame at `frame_offset`.
    SendTo,
}

/// One contiguous piece of work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub phase: Phase,
    /// Caller address read by `Stage`, `Send` and `Scatter`, and by the push route's `Reduce`
    /// and own-rank `Gather` (this rank's own values); unused otherwise.
    pub src: u64,
    /// Caller address written by `Reduce`/`Gather` (for `Stage`: unused).
    pub dst: u64,
    /// Element offset in the staging frame.
    pub frame_offset: usize,
    /// Elements.
    pub count: usize,
    /// Whose frame `Gather` reads.
    pub peer: usize,
    /// `Reduce` only: also write the result back into this rank's own frame at `frame_offset`
    /// (the RS+AG route publishes reduced shards from there).
    pub write_back: bool,
}

/// A fixed-capacity list of segments.
#[derive(Debug, Clone, Copy)]
pub struct Segments {
    items: [Segment; MAX_SEGMENTS],
    len: usize,
}

impl Segments {
    const EMPTY: Segment =
        Segment { phase: Phase::Stage, src: 0, dst: 0, frame_offset: 0, count: 0, peer: 0, write_back: false };
    pub(crate) const fn new() -> Self {
        Segments { items: [Self::EMPTY; MAX_SEGMENTS], len: 0 }
    }
    pub(crate) fn push(&mut self, s: Segment) {
        self.items[self.len] = s;
        self.len += 1;
    }
    /// The segments.
    pub fn as_slice(&self) -> &[Segment] {
        &self.items[..self.len]
    }
}

/// The work of one call on one rank.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    pub sig: Signature,
    pub route: Route,
    /// Copies of local inputs into the own frame, before publishing `ready`.
    pub stage: Segments,
    /// Work after every peer's `ready` is seen.
    pub phase1: Segments,
    /// Work after every peer's `phase2` flag is seen (RS+AG route only; empty otherwise).
    pub phase2: Segments,
    /// Bulk push route: elements between two senders' slots in a frame (a `Reduce` reads
    /// sender `s` at `frame_offset + s * slot_stride`); 0 on other routes.
    pub slot_stride: usize,
    /// Bulk push route: frame offset (elements) of the reduced-shard slots; a `Reduce` with
    /// `write_back` pushes its result into every peer's frame at `ag_base + rank * slot_stride`.
    pub ag_base: usize,
    /// Bulk push route: elements of each frame the plan uses (must fit the capacity).
    pub frame_elems: usize,
}

/// Element bounds of shard `q` when `n` elements are split over `world` ranks for the RS+AG
/// route: equal chunks rounded up to `align` elements, the last ones possibly short or empty.
pub const fn shard_bounds(n: usize, world: usize, q: usize, align: usize) -> (usize, usize) {
    let chunk = n.div_ceil(world).div_ceil(align) * align;
    let lo = if q * chunk < n { q * chunk } else { n };
    let hi = if (q + 1) * chunk < n { (q + 1) * chunk } else { n };
    (lo, hi)
}

impl Plan {
    /// A plan of `sig` by `route` with no work yet (the constructors below fill it).
    pub(crate) const fn empty(sig: Signature, route: Route) -> Plan {
        Plan {
            sig,
            route,
            stage: Segments::new(),
            phase1: Segments::new(),
            phase2: Segments::new(),
            slot_stride: 0,
            ag_base: 0,
            frame_elems: 0,
        }
    }

    /// Payload bytes this plan sends to one peer on the push route: the end of its furthest
    /// slot range (0 on the pull routes).
    pub fn push_payload_bytes(&self) -> usize {
        let size = self.sig.dtype.size();
        self.stage
            .as_slice()
            .iter()
            .filter(|s| matches!(s.phase, Phase::Send | Phase::Scatter))
            .map(|s| (s.frame_offset + s.count) * size)
            .max()
            .unwrap_or(0)
    }

    /// The plan of a single-lane call by `route` as an IPC backend with this staging `capacity`
    /// and LL capacity runs it: a push route whose payload does not fit its slots (the LL slots,
    /// or the frame for the bulk route) takes the one-shot pull route instead — same bits.
    pub fn single_fitted(
        call: &Call,
        rank: usize,
        world: usize,
        route: Route,
        capacity: usize,
        ll_capacity: usize,
    ) -> Result<Plan, Error> {
        let plan = Plan::single(call, rank, world, route)?;
        let fits = match route {
            Route::IpcPushLl => plan.push_payload_bytes() <= ll_capacity,
            Route::IpcPush => plan.frame_elems.checked_mul(call.dtype.size()).is_some_and(|b| b <= capacity),
            _ => true,
        };
        if fits { Ok(plan) } else { Plan::single(call, rank, world, Route::IpcOneShot) }
    }

    /// The plan of a single-lane call on `rank` of `world`, taking `route`.
    ///
    /// `route` must be an IPC route (or `Local` for world 1); the plan of a `Local` call
    /// is a single stage-free copy, expressed as a `Gather` from this rank's own input.
    pub fn single(call: &Call, rank: usize, world: usize, route: Route) -> Result<Plan, Error> {
        let size = call.dtype.size() as u64;
        let n = call.count_in;
        let mut p = Plan::empty(Signature { route, ..call.signature() }, route);
        let seg = |phase, dst, frame_offset, count, peer| Segment {
            phase,
            src: call.src,
            dst,
            frame_offset,
            count,
            peer,
            write_back: false,
        };
        if route == Route::IpcPushLl {
            return Ok(Self::single_push(call, rank, world, p));
        }
        if route == Route::IpcPush {
            return Ok(Self::single_bulk(call, rank, world, p));
        }
        p.stage.push(seg(Phase::Stage, 0, 0, n, rank));
        match (call.op, route) {
            (Op::AllReduce, Route::IpcOneShot) => p.phase1.push(seg(Phase::Reduce, call.dst, 0, n, rank)),
            (Op::AllReduce, Route::IpcReduceScatterAllGather) => {
                let align = 16 / call.dtype.size();
                let (lo, hi) = shard_bounds(n, world, rank, align);
                p.phase1.push(Segment {
                    write_back: true,
                    ..seg(Phase::Reduce, call.dst + lo as u64 * size, lo, hi - lo, rank)
                });
                for q in 0..world {
                    let (lo, hi) = shard_bounds(n, world, q, align);
                    if q != rank {
                        p.phase2.push(seg(Phase::Gather, call.dst + lo as u64 * size, lo, hi - lo, q));
                    }
                }
            }
            (Op::AllGather, Route::IpcOneShot) => {
                for q in 0..world {
                    p.phase1.push(seg(Phase::Gather, call.dst + (q * n) as u64 * size, 0, n, q));
                }
            }
            (Op::ReduceScatter, Route::IpcOneShot) => {
                let shard = call.count_out;
                p.phase1.push(seg(Phase::Reduce, call.dst, rank * shard, shard, rank));
            }
            (op, route) => {
                return Err(Error::InvalidConfig { detail: format!("{op} cannot take route {}", route.name()) });
            }
        }
        Ok(p)
    }

    /// The LL push plan of a single-lane call: send the input (reduce_scatter: each shard to its
    /// owner) into slot offset 0 of every peer, then reduce or gather from the own slots.
    fn single_push(call: &Call, rank: usize, world: usize, mut p: Plan) -> Plan {
        let size = call.dtype.size() as u64;
        let n = call.count_in;
        let seg =
            |phase, src, dst, count, peer| Segment { phase, src, dst, frame_offset: 0, count, peer, write_back: false };
        match call.op {
            Op::AllGather => {
                p.stage.push(seg(Phase::Send, call.src, 0, n, rank));
                for q in 0..world {
                    p.phase1.push(seg(Phase::Gather, call.src, call.dst + (q * n) as u64 * size, n, q));
                }
            }
            Op::ReduceScatter | Op::ReduceScatterMany => {
                let shard = call.count_out;
                p.stage.push(seg(Phase::Scatter, call.src, 0, shard, rank));
                let own = call.src + (rank * shard) as u64 * size;
                p.phase1.push(seg(Phase::Reduce, own, call.dst, shard, rank));
            }
            Op::AllReduce => {
                p.stage.push(seg(Phase::Send, call.src, 0, n, rank));
                p.phase1.push(seg(Phase::Reduce, call.src, call.dst, n, rank));
            }
        }
        p
    }

    /// The bulk push plan of a single-lane call (reduce_scatter_many has none: it takes the
    /// one-shot route). Frame layout of every receiver: reduce ops first hold one slot per
    /// sender for the receiver's shard (`[s * C, (s + 1) * C)`), all_reduce then one slot per
    /// owner for the reduced shards (`ag_base + q * C`); all_gather holds one slot per sender
    /// for its input. `C` is the largest shard (all_gather: the input) in whole 16 bytes.
    fn single_bulk(call: &Call, rank: usize, world: usize, mut p: Plan) -> Plan {
        let size = call.dtype.size();
        let align = 16 / size;
        let round = |n: usize| n.div_ceil(align) * align;
        let at = |base: u64, el: usize| base + (el * size) as u64;
        let seg = |phase, src, dst, frame_offset, count, peer| Segment {
            phase,
            src,
            dst,
            frame_offset,
            count,
            peer,
            write_back: false,
        };
        // The frame this plan needs, in checked arithmetic: a call too large for any frame gets
        // an empty plan that no frame fits (`Plan::single_fitted` then takes one-shot), and
        // every offset below stays under `frame_elems`.
        let (c, slots) = match call.op {
            Op::AllReduce => (round(call.count_in.div_ceil(world)), 2 * world),
            Op::AllGather => (round(call.count_in), world),
            Op::ReduceScatter | Op::ReduceScatterMany => (round(call.count_out), world),
        };
        let Some(frame) = c.checked_mul(slots) else {
            p.frame_elems = usize::MAX;
            return p;
        };
        p.frame_elems = frame;
        match call.op {
            Op::AllReduce => {
                let n = call.count_in;
                for q in (0..world).filter(|&q| q != rank) {
                    let (lo, hi) = shard_bounds(n, world, q, align);
                    p.stage.push(seg(Phase::SendTo, at(call.src, lo), 0, rank * c, hi - lo, q));
                }
                let (lo, hi) = shard_bounds(n, world, rank, align);
                p.phase1.push(Segment {
                    write_back: true,
                    ..seg(Phase::Reduce, at(call.src, lo), at(call.dst, lo), 0, hi - lo, rank)
                });
                for q in (0..world).filter(|&q| q != rank) {
                    let (lo, hi) = shard_bounds(n, world, q, align);
                    p.phase2.push(seg(Phase::Gather, 0, at(call.dst, lo), world * c + q * c, hi - lo, q));
                }
                (p.slot_stride, p.ag_base) = (c, world * c);
            }
            Op::AllGather => {
                let n = call.count_in;
                for q in (0..world).filter(|&q| q != rank) {
                    p.stage.push(seg(Phase::SendTo, call.src, 0, rank * c, n, q));
                }
                for q in 0..world {
                    p.phase1.push(seg(Phase::Gather, call.src, at(call.dst, q * n), q * c, n, q));
                }
                (p.slot_stride, p.ag_base) = (c, 0);
            }
            Op::ReduceScatter | Op::ReduceScatterMany => {
                let m = call.count_out;
                for q in (0..world).filter(|&q| q != rank) {
                    p.stage.push(seg(Phase::SendTo, at(call.src, q * m), 0, rank * c, m, q));
                }
                p.phase1.push(seg(Phase::Reduce, at(call.src, rank * m), call.dst, 0, m, rank));
                (p.slot_stride, p.ag_base) = (c, 0);
            }
        }
        p
    }

    /// The LL push plan of `reduce_scatter_many`: every lane's shards scattered to their owners
    /// into disjoint slot ranges (each starting on a 16-byte boundary, so no two lanes share an
    /// LL line), one tree per lane over the own slots.
    pub fn many_push(lanes: &[LaneCall], sig: Signature, rank: usize) -> Plan {
        let mut p = Plan::empty(Signature { route: Route::IpcPushLl, ..sig }, Route::IpcPushLl);
        let size = sig.dtype.size();
        let align = 16 / size;
        let mut offset = 0usize;
        for l in lanes {
            let c = &l.call;
            let shard = c.count_out;
            let base = Segment {
                phase: Phase::Scatter,
                src: c.src,
                dst: 0,
                frame_offset: offset,
                count: shard,
                peer: rank,
                write_back: false,
            };
            p.stage.push(base);
            p.phase1.push(Segment {
                phase: Phase::Reduce,
                src: c.src + (rank * shard * size) as u64,
                dst: c.dst,
                ..base
            });
            offset += shard.div_ceil(align) * align;
        }
        p
    }

    /// The plan of `reduce_scatter_many`: every lane staged into its disjoint range of one frame
    /// under one generation, and one tree per lane over its own range.
    pub fn many(lanes: &[LaneCall], sig: Signature, rank: usize) -> Plan {
        let mut p = Plan::empty(sig, Route::IpcOneShot);
        for l in lanes {
            let c = &l.call;
            p.stage.push(Segment {
                phase: Phase::Stage,
                src: c.src,
                dst: 0,
                frame_offset: l.staging_offset,
                count: c.count_in,
                peer: rank,
                write_back: false,
            });
            p.phase1.push(Segment {
                phase: Phase::Reduce,
                src: 0,
                dst: c.dst,
                frame_offset: l.staging_offset + rank * c.count_out,
                count: c.count_out,
                peer: rank,
                write_back: false,
            });
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_cover_exactly_once() {
        for n in [0usize, 1, 7, 8, 9, 100, 1000, 4099] {
            for world in [1usize, 2, 4, 8] {
                for align in [1usize, 4, 8] {
                    let mut next = 0;
                    for q in 0..world {
                        let (lo, hi) = shard_bounds(n, world, q, align);
                        assert_eq!(lo, next.min(n));
                        assert!(hi >= lo);
                        next = hi;
                    }
                    assert_eq!(next, n, "n={n} world={world} align={align}");
                }
            }
        }
    }

    /// A bulk push call whose receive slots cannot even be counted (validation keeps real calls
    /// far from this, so the call is made by hand) gets no plan the frame fits, and takes
    /// one-shot: no overflow, no panic.
    #[test]
    fn bulk_slots_of_huge_calls_are_checked_arithmetic() {
        use collective_core::DType;
        let n = usize::MAX / 8; // 8 slots of n rounded up to 16 bytes: 2^64, one past usize
        let call = Call {
            op: Op::AllGather,
            dtype: DType::U8,
            src: 0,
            dst: 0,
            count_in: n,
            count_out: 8 * n,
            in_place: false,
        };
        let bulk = Plan::single(&call, 0, 8, Route::IpcPush).unwrap();
        assert_eq!(bulk.frame_elems, usize::MAX);
        assert!(bulk.stage.as_slice().is_empty() && bulk.phase1.as_slice().is_empty());
        let plan = Plan::single_fitted(&call, 0, 8, Route::IpcPush, usize::MAX - 1, 0).unwrap();
        assert_eq!(plan.route, Route::IpcOneShot);
    }
}
