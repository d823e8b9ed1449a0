//! Calls above the staging capacity: the plans of consecutive chunks, one generation each.
//!
//! A call whose staged bytes fit the frame (`capacity` bytes) is one plan, exactly
//! [`Plan::single`] / [`Plan::many`] (or their push forms). A larger call is cut into chunks
//! that each fit: every element still goes through the same fixed tree over the same ranks, so
//! the bits are those of one call; only the number of generations changes.
//!
//! * all_reduce (one-shot and RS+AG): input and output elements `[lo, hi)`, each chunk an
//!   ordinary all_reduce plan of its route;
//! * all_gather: input elements `[lo, hi)`; rank `q`'s piece lands at element `q * n + lo` of
//!   the output, so the whole output is exactly the concatenation;
//! * reduce_scatter: shard elements `[lo, hi)` of every shard: the rank stages the `world`
//!   pieces `q * m + lo .. q * m + hi` side by side and reduces its own into `dst + lo`;
//! * reduce_scatter_many: consecutive lanes grouped while they fit one frame (one
//!   [`Plan::many`] per group); a lane that alone does not fit runs as reduce_scatter chunks.
//!
//! Chunk boundaries are multiples of 16 bytes (when at least 16 bytes of elements fit), and a
//! function of the call's signature, the world and the agreed capacity only, so equal on every
//! rank. Every chunk's plan carries the **whole call's** signature: two ranks making different
//! calls mismatch at the first chunk, whatever the chunks have in common.
//!
//! A push route is taken, as one plan, when the whole call fits its slots (the LL slots; for
//! the bulk route, the frame). An all_reduce or reduce_scatter by the bulk push route that does
//! not fit runs as bulk push chunks (all_reduce: elements `[lo, hi)`; reduce_scatter: shard
//! elements `[lo, hi)` of every shard, each piece pushed to its owner), each chunk's frame
//! within the capacity: no staging copy at any size. Any other call above a push route's slots
//! takes the one-shot pull route (same bits), chunked as above; all_gather does so because its
//! bulk frame holds a slot per sender, `world` times the one-shot staging, so bulk chunks would
//! take `world` times the generations.
use super::plan::{Phase, Plan, Segment};
use collective_core::{Call, Error, LaneCall, LaneCalls, MAX_LANES, Op, Route, Signature};

/// The smallest staging capacity (bytes per frame) an IPC collective accepts: 128, one 16-byte
/// piece for each of the 8 shards a reduce_scatter chunk stages at world 8.
///
/// At this capacity every call — every op, every dtype (elements of up to 8 bytes), every world
/// (up to 8) — runs, in chunks whose boundaries are multiples of 16 bytes ([`chunk_elements`]).
/// Below it some calls cannot run even one chunk (an f32 reduce_scatter at world 8 needs 32
/// bytes for one element per shard, an f64 all_gather 8), so such a capacity is refused at
/// construction ([`check_capacity`]) rather than failing those calls one by one. Frames are
/// page-rounded, so the floor costs no memory.
pub const MIN_CAPACITY: usize = 128;

/// [`Error::InvalidConfig`] naming [`MIN_CAPACITY`] when `capacity` is below it; every IPC
/// backend checks it at construction (`IpcConfig::check`, the CPU twin's constructors).
pub fn check_capacity(capacity: usize) -> Result<(), Error> {
    if capacity >= MIN_CAPACITY {
        return Ok(());
    }
    Err(Error::InvalidConfig {
        detail: format!(
            "a staging capacity of {capacity} bytes per rank: expected at least {MIN_CAPACITY} bytes, the smallest \
             frame every call can be chunked through (a reduce_scatter at 8 ranks stages 8 pieces of 16 bytes)"
        ),
    })
}

/// Elements per chunk when `pieces` pieces of that many elements of `size` bytes are staged
/// side by side in `capacity` bytes: the most that fit, rounded down to a multiple of 16 bytes
/// when at least 16 bytes fit. 0 when not even one element per piece fits.
pub const fn chunk_elements(capacity: usize, size: usize, pieces: usize) -> usize {
    let fit = capacity / size / pieces;
    let align = if size >= 16 { 1 } else { 16 / size };
    if fit >= align { fit / align * align } else { fit }
}

/// Elements per chunk of a bulk push all_reduce in frames of `capacity` bytes: the most whose
/// frame fits (`world` reduced-shard slots and `world` slice slots, each a multiple of 16
/// bytes: `2 * world * shard` elements), so every rank's shard of every chunk starts 16-byte
/// aligned. 0 when not even one 16-byte shard fits.
pub const fn bulk_all_reduce_elements(capacity: usize, size: usize, world: usize) -> usize {
    let align = if size >= 16 { 1 } else { 16 / size };
    let shard = capacity / size / (2 * world) / align * align;
    shard * world
}

/// Shard elements per chunk of a bulk push reduce_scatter in frames of `capacity` bytes:
/// `world` slots of that many elements, a multiple of 16 bytes each, so every slot starts
/// 16-byte aligned. 0 when not even one 16-byte slot per sender fits.
pub const fn bulk_scatter_elements(capacity: usize, size: usize, world: usize) -> usize {
    let align = if size >= 16 { 1 } else { 16 / size };
    capacity / size / world / align * align
}

/// The chunk step that splits `total` elements into as many chunks as `step` would, but of
/// nearly equal sizes (a multiple of `unit`, at most `step`): a bulk call just above its frame
/// runs as two halves rather than a full chunk and a sliver (a sliver leaves most ranks an
/// empty shard, which stalled ranks sharing a GPU: issue 24's GPU run). A function of the
/// call's signature, the world and the capacity only, so equal on every rank.
pub const fn balanced(step: usize, total: usize, unit: usize) -> usize {
    if step == 0 || unit == 0 || total <= step {
        return step;
    }
    let chunks = total.div_ceil(step);
    let even = total.div_ceil(chunks).div_ceil(unit) * unit;
    if even < step { even } else { step }
}

/// The plans of one call, chunk by chunk (see the module docs); no heap allocation.
///
/// Yields at least one plan (a zero-length call: one empty plan, one generation). Executors
/// run the plans in order, one generation each.
#[derive(Debug, Clone)]
pub struct Chunks {
    work: Work,
    sig: Signature,
    /// Route of the chunk plans (the pull route a push call above the LL slots falls back to).
    route: Route,
    rank: usize,
    world: usize,
    capacity: usize,
}

// The plan is kept inline on purpose: no heap allocation on the per-call path.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone)]
enum Work {
    /// The call fits: one plan (`None` once yielded).
    Whole(Option<Plan>),
    /// A single-lane call in chunks of `step` elements (reduce_scatter: shard elements).
    Single { call: Call, step: usize, lo: usize, total: usize },
    /// reduce_scatter_many: lane `next` on, from shard element `lo` of it.
    Many { lanes: LaneCalls, next: usize, lo: usize },
    /// Finished (or failed).
    Done,
}

const fn scatters(op: Op) -> bool {
    matches!(op, Op::ReduceScatter | Op::ReduceScatterMany)
}

impl Chunks {
    /// The plans of the single-lane `call` by `route` with frames of `capacity` bytes and LL
    /// slots of `ll_capacity` payload bytes: a push route only when the whole call fits its
    /// slots, the one-shot route otherwise.
    pub fn single(
        call: &Call,
        rank: usize,
        world: usize,
        route: Route,
        capacity: usize,
        ll_capacity: usize,
    ) -> Result<Chunks, Error> {
        // A push route when the whole call fits its slots (LL slots, or the frame for the bulk
        // route), else the one-shot pull route, chunked below when the call exceeds the frame.
        let whole = Plan::single_fitted(call, rank, world, route, capacity, ll_capacity)?;
        let size = call.dtype.size();
        if route == Route::IpcPush && whole.route != Route::IpcPush {
            // all_gather keeps one-shot chunks: its frame holds a slot per sender, `world` times
            // the one-shot staging, so bulk chunks would take `world` times the generations.
            let align = if size >= 16 { 1 } else { 16 / size };
            let (step, total) = match call.op {
                Op::AllReduce => {
                    let step = bulk_all_reduce_elements(capacity, size, world);
                    (balanced(step, call.count_in, world * align), call.count_in)
                }
                Op::ReduceScatter | Op::ReduceScatterMany => {
                    let step = bulk_scatter_elements(capacity, size, world);
                    (balanced(step, call.count_out, align), call.count_out)
                }
                Op::AllGather => (0, 0),
            };
            if step > 0 {
                return Ok(Chunks {
                    work: Work::Single { call: *call, step, lo: 0, total },
                    sig: Signature { route, ..call.signature() },
                    route,
                    rank,
                    world,
                    capacity,
                });
            }
        }
        let route = whole.route;
        if matches!(route, Route::IpcPushLl | Route::IpcPush) || call.bytes_in() <= capacity {
            return Ok(Self::whole(whole, rank, world, capacity));
        }
        let pieces = if scatters(call.op) { world } else { 1 };
        let step = chunk_elements(capacity, size, pieces);
        if step == 0 {
            return Err(Error::CapacityExceeded { op: call.op, needed: pieces * size, capacity });
        }
        let total = if scatters(call.op) { call.count_out } else { call.count_in };
        Ok(Chunks {
            work: Work::Single { call: *call, step, lo: 0, total },
            sig: whole.sig,
            route,
            rank,
            world,
            capacity,
        })
    }

    /// The plans of a `reduce_scatter_many` (lanes and signature from `validate_many`) by
    /// `route`: the push route only when every lane fits the LL slots; otherwise groups of
    /// lanes that fit one frame, and any lane that does not fit alone in reduce_scatter chunks.
    pub fn many(
        lanes: &LaneCalls,
        sig: Signature,
        rank: usize,
        world: usize,
        route: Route,
        capacity: usize,
        ll_capacity: usize,
    ) -> Chunks {
        if route == Route::IpcPushLl {
            let push = Plan::many_push(lanes, sig, rank);
            if push.push_payload_bytes() <= ll_capacity {
                return Self::whole(push, rank, world, capacity);
            }
        }
        let whole = Plan::many(lanes, sig, rank);
        let fits = (sig.count as usize).checked_mul(sig.dtype.size()).is_some_and(|b| b <= capacity);
        if fits {
            return Self::whole(whole, rank, world, capacity);
        }
        Chunks { work: Work::Many { lanes: *lanes, next: 0, lo: 0 }, sig, route: whole.route, rank, world, capacity }
    }

    fn whole(plan: Plan, rank: usize, world: usize, capacity: usize) -> Chunks {
        Chunks { sig: plan.sig, route: plan.route, work: Work::Whole(Some(plan)), rank, world, capacity }
    }

    /// The plan of elements `[lo, hi)` of `call` (reduce_scatter: of every shard).
    fn chunk(&self, call: &Call, lo: usize, hi: usize) -> Result<Plan, Error> {
        let size = call.dtype.size();
        let at = |addr: u64, element: usize| addr + (element * size) as u64;
        let c = hi - lo;
        let (rank, world) = (self.rank, self.world);
        let seg = |phase, src, dst, frame_offset, peer| piece(phase, src, dst, frame_offset, c, peer);
        if self.route == Route::IpcPush && call.op != Op::AllReduce {
            return Ok(self.bulk_scatter_chunk(call, lo, hi));
        }
        let mut p = Plan::empty(self.sig, self.route);
        match call.op {
            Op::AllReduce => {
                let sub = Call { src: at(call.src, lo), dst: at(call.dst, lo), count_in: c, count_out: c, ..*call };
                p = Plan { sig: self.sig, ..Plan::single(&sub, rank, world, self.route)? };
            }
            Op::AllGather => {
                let n = call.count_in;
                p.stage.push(seg(Phase::Stage, at(call.src, lo), 0, 0, rank));
                for q in 0..world {
                    p.phase1.push(seg(Phase::Gather, call.src, at(call.dst, q * n + lo), 0, q));
                }
            }
            Op::ReduceScatter | Op::ReduceScatterMany => {
                let m = call.count_out;
                for q in 0..world {
                    p.stage.push(seg(Phase::Stage, at(call.src, q * m + lo), 0, q * c, rank));
                }
                p.phase1.push(seg(Phase::Reduce, 0, at(call.dst, lo), rank * c, rank));
            }
        }
        Ok(p)
    }

    /// The bulk push plan of shard elements `[lo, hi)` of a reduce_scatter, laid out as
    /// [`Plan::single`] lays out a whole call: sender `s`'s slot at `s * slot` of every
    /// receiver's frame, `slot` the chunk in whole 16 bytes. Piece `q * m + lo .. q * m + hi`
    /// goes to its owner `q`, which reduces its slots (its own values from its input) into
    /// `dst + lo`.
    fn bulk_scatter_chunk(&self, call: &Call, lo: usize, hi: usize) -> Plan {
        let size = call.dtype.size();
        let align = if size >= 16 { 1 } else { 16 / size };
        let (c, m, rank) = (hi - lo, call.count_out, self.rank);
        let slot = c.div_ceil(align) * align;
        let at = |addr: u64, element: usize| addr + (element * size) as u64;
        let seg = |phase, src, dst, frame_offset, peer| piece(phase, src, dst, frame_offset, c, peer);
        let mut p = Plan::empty(self.sig, Route::IpcPush);
        for q in (0..self.world).filter(|&q| q != rank) {
            p.stage.push(seg(Phase::SendTo, at(call.src, q * m + lo), 0, rank * slot, q));
        }
        p.phase1.push(seg(Phase::Reduce, at(call.src, rank * m + lo), at(call.dst, lo), 0, rank));
        (p.slot_stride, p.ag_base, p.frame_elems) = (slot, 0, slot * self.world);
        p
    }

    /// The next group of `lanes` from `next` (each fitting alone, all together one frame).
    fn group(&self, lanes: &LaneCalls, next: usize) -> (Plan, usize) {
        let size = self.sig.dtype.size();
        let base = lanes[next].staging_offset;
        let mut group = [lanes[next]; MAX_LANES];
        let mut end = next;
        while end < lanes.len() {
            let l = lanes[end];
            if (l.staging_offset - base + l.call.count_in) * size > self.capacity {
                break;
            }
            group[end - next] = LaneCall { staging_offset: l.staging_offset - base, ..l };
            end += 1;
        }
        (Plan::many(&group[..end - next], self.sig, self.rank), end)
    }
}

/// One segment of a chunk's plan: `count` elements, no write-back (chunks never write back).
fn piece(phase: Phase, src: u64, dst: u64, frame_offset: usize, count: usize, peer: usize) -> Segment {
    Segment { phase, src, dst, frame_offset, count, peer, write_back: false }
}

impl Iterator for Chunks {
    type Item = Result<Plan, Error>;

    fn next(&mut self) -> Option<Result<Plan, Error>> {
        let (plan, work) = match core::mem::replace(&mut self.work, Work::Done) {
            Work::Done => return None,
            Work::Whole(plan) => (plan.map(Ok), Work::Done),
            Work::Single { call, step, lo, total } => {
                let hi = total.min(lo + step);
                let work = if hi < total { Work::Single { call, step, lo: hi, total } } else { Work::Done };
                (Some(self.chunk(&call, lo, hi)), work)
            }
            Work::Many { lanes, next, lo } => {
                if next >= lanes.len() {
                    (None, Work::Done)
                } else if lanes[next].call.bytes_in() > self.capacity {
                    let call = lanes[next].call;
                    let step = chunk_elements(self.capacity, self.sig.dtype.size(), self.world);
                    if step == 0 {
                        let needed = self.world * self.sig.dtype.size();
                        (
                            Some(Err(Error::CapacityExceeded { op: call.op, needed, capacity: self.capacity })),
                            Work::Done,
                        )
                    } else {
                        let hi = call.count_out.min(lo + step);
                        let work = if hi < call.count_out {
                            Work::Many { lanes, next, lo: hi }
                        } else {
                            Work::Many { lanes, next: next + 1, lo: 0 }
                        };
                        (Some(self.chunk(&call, lo, hi)), work)
                    }
                } else {
                    let (plan, end) = self.group(&lanes, next);
                    (Some(Ok(plan)), Work::Many { lanes, next: end, lo: 0 })
                }
            }
        };
        self.work = if matches!(plan, Some(Err(_))) { Work::Done } else { work };
        plan
    }
}

#[cfg(test)]
mod balanced_tests {
    use super::balanced;

    #[test]
    fn a_call_just_above_the_frame_runs_as_near_equal_chunks() {
        // 65537 f32 at world 4 in 256 KiB frames: 32768-element chunks would leave a 1-element
        // third chunk; balanced: three chunks of 21856 (a multiple of 4 x 4), 21856 and 21825.
        let s = balanced(32768, 65537, 16);
        assert_eq!(s, 21856);
        assert_eq!(s % 16, 0);
        assert!(65537 - 2 * s >= 16 * 1000, "the last chunk is no sliver");
        assert_eq!(65537usize.div_ceil(s), 65537usize.div_ceil(32768));
        // Unchanged: calls that fit, exact multiples, no step.
        assert_eq!(balanced(32768, 1000, 16), 32768);
        assert_eq!(balanced(32768, 65536, 16), 32768);
        assert_eq!(balanced(0, 10, 16), 0);
        for total in 1..2000usize {
            for unit in [1usize, 4, 8, 16, 32] {
                let step = 64 * unit;
                let b = balanced(step, total, unit);
                assert!(b <= step && b > 0 && (b.is_multiple_of(unit) || b == step));
                assert_eq!(total.div_ceil(b), total.div_ceil(step), "total {total} unit {unit}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use collective_core::{DType, Io, RawMut, validate, validate_many};

    fn call(op: Op, n: usize, world: usize, dtype: DType) -> Call {
        let len = if op == Op::AllGather { n * world } else { n };
        // SAFETY: never dereferenced; planning reads addresses only.
        let buf = unsafe { RawMut::from_raw(0x10_0000, len, dtype) };
        validate(op, &Io::InPlace(buf), 1, world, usize::MAX).unwrap()
    }

    #[test]
    fn chunks_cover_every_element_once_within_capacity_and_aligned() {
        for cap in [MIN_CAPACITY, 4096] {
            cover_every_element_once(cap);
        }
    }

    fn cover_every_element_once(cap: usize) {
        for world in [2usize, 4, 8] {
            for dtype in [DType::F32, DType::BF16, DType::U8, DType::F64] {
                for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter] {
                    if op.reduces() && !dtype.is_reducible() {
                        continue;
                    }
                    let size = dtype.size();
                    for n in [0usize, 1, cap / size, cap / size + 1, 7 * cap / 2 / size + 3, 10 * cap / size] {
                        let n = if op == Op::ReduceScatter { n.div_ceil(world) * world } else { n };
                        let c = call(op, n, world, dtype);
                        let plans: Vec<Plan> = Chunks::single(&c, 1, world, Route::IpcOneShot, cap, 0)
                            .unwrap()
                            .map(Result::unwrap)
                            .collect();
                        // A call that fits (an empty one too) is one plan: one generation.
                        assert_eq!(plans.len() == 1, c.bytes_in() <= cap, "{op} n {n}");
                        let mut next = 0;
                        for p in &plans {
                            assert_eq!(p.sig, Signature { route: Route::IpcOneShot, ..c.signature() });
                            let staged: usize =
                                p.stage.as_slice().iter().map(|s| s.frame_offset + s.count).max().unwrap();
                            assert!(staged * size <= cap, "{op} n {n}: stages {staged} elements");
                            let out = p.phase1.as_slice().iter().find(|s| s.peer == 1).unwrap();
                            let first = ((out.dst - c.dst) as usize / size) - if op == Op::AllGather { n } else { 0 };
                            assert_eq!(first, next, "{op} n {n} world {world}");
                            assert_eq!(first * size % 16, 0);
                            next += out.count;
                        }
                        assert_eq!(next, if op == Op::AllGather { n } else { c.count_out }, "{op} n {n}");
                    }
                }
            }
        }
    }

    #[test]
    fn the_capacity_floor_is_where_every_call_can_be_chunked() {
        for capacity in 0..MIN_CAPACITY {
            match check_capacity(capacity) {
                Err(Error::InvalidConfig { detail }) => {
                    assert!(
                        detail.contains(&format!("{capacity} bytes")) && detail.contains("at least 128"),
                        "{detail}"
                    )
                }
                other => panic!("capacity {capacity}: {other:?}"),
            }
        }
        assert!(check_capacity(MIN_CAPACITY).is_ok() && check_capacity(usize::MAX).is_ok());
        // Below the floor some call cannot run a single chunk: the f32 reduce_scatter at
        // world 8 with 16 or 31 bytes, and any f32 call with 0 to 3.
        let rs = call(Op::ReduceScatter, 64, 8, DType::F32);
        for cap in [16, 31] {
            assert!(matches!(
                Chunks::single(&rs, 1, 8, Route::IpcOneShot, cap, 0),
                Err(Error::CapacityExceeded { .. })
            ));
        }
        let ar = call(Op::AllReduce, 64, 2, DType::F32);
        for cap in 0..4 {
            assert!(matches!(
                Chunks::single(&ar, 1, 2, Route::IpcOneShot, cap, 0),
                Err(Error::CapacityExceeded { .. })
            ));
        }
        // At the floor, every op, dtype and world on every route chunks, within the frame.
        for world in [2usize, 4, 8] {
            for dtype in DType::ALL {
                for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter] {
                    if op.reduces() && !dtype.is_reducible() {
                        continue;
                    }
                    let c = call(op, 200 * world, world, dtype);
                    for route in [Route::IpcOneShot, Route::IpcReduceScatterAllGather, Route::IpcPushLl, Route::IpcPush]
                    {
                        if route == Route::IpcReduceScatterAllGather && op != Op::AllReduce {
                            continue;
                        }
                        let plans: Vec<Plan> = Chunks::single(&c, 1, world, route, MIN_CAPACITY, 64)
                            .unwrap_or_else(|e| panic!("{op} {dtype} world {world} {route:?}: {e}"))
                            .map(|p| p.unwrap_or_else(|e| panic!("{op} {dtype} world {world} {route:?}: {e}")))
                            .collect();
                        assert!(plans.len() > 1 || route == Route::IpcPushLl, "{op} {dtype} world {world} {route:?}");
                        for p in &plans {
                            let staged = p.stage.as_slice().iter().map(|s| s.frame_offset + s.count).max().unwrap_or(0);
                            let used = if p.route == Route::IpcPush { p.frame_elems } else { staged };
                            assert!(
                                p.route == Route::IpcPushLl || used * dtype.size() <= MIN_CAPACITY,
                                "{op} {dtype} world {world} {route:?}: {used} elements"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn bulk_push_reduce_scatter_above_its_frame_runs_as_bulk_chunks() {
        let cap = 4096;
        for world in [2usize, 4, 8] {
            for dtype in [DType::F32, DType::BF16] {
                let size = dtype.size();
                let step = bulk_scatter_elements(cap, size, world);
                assert!(step > 0 && world * step * size <= cap && (step * size).is_multiple_of(16), "{world} {dtype}");
                for n in [cap / size + world, 7 * cap / 2 / size + 3, 10 * cap / size - 5] {
                    let n = n.div_ceil(world) * world;
                    let m = n / world;
                    let c = call(Op::ReduceScatter, n, world, dtype);
                    for rank in [0, world - 1] {
                        let plans: Vec<Plan> = Chunks::single(&c, rank, world, Route::IpcPush, cap, 0)
                            .unwrap()
                            .map(Result::unwrap)
                            .collect();
                        assert_eq!(plans.len(), m.div_ceil(step), "world {world} {dtype} n {n}");
                        let at = |e: usize| c.src + (e * size) as u64;
                        let mut next = 0;
                        for p in &plans {
                            assert_eq!(
                                (p.route, p.sig),
                                (Route::IpcPush, Signature { route: Route::IpcPush, ..c.signature() })
                            );
                            assert!(p.frame_elems * size <= cap, "frame of {} elements", p.frame_elems);
                            assert_eq!((p.slot_stride * size % 16, p.ag_base), (0, 0));
                            // The rank reduces shard elements [next, next + count) of its own shard.
                            let [own] = p.phase1.as_slice() else { panic!("one reduce: {:?}", p.phase1) };
                            assert_eq!((own.phase, own.peer, own.frame_offset), (Phase::Reduce, rank, 0));
                            assert_eq!((own.src, own.dst), (at(rank * m + next), c.dst + (next * size) as u64));
                            // Every peer q gets piece q of the chunk, in this rank's slot.
                            let sends = p.stage.as_slice();
                            assert_eq!(sends.len(), world - 1);
                            for s in sends {
                                assert_eq!(
                                    (s.phase, s.count, s.frame_offset),
                                    (Phase::SendTo, own.count, rank * p.slot_stride)
                                );
                                assert_eq!(s.src, at(s.peer * m + next), "piece of peer {}", s.peer);
                                assert_ne!(s.peer, rank);
                            }
                            assert!(p.phase2.as_slice().is_empty());
                            next += own.count;
                        }
                        assert_eq!(next, m, "world {world} {dtype} n {n}: every shard element once");
                    }
                }
            }
        }
        // all_gather above its bulk frame keeps one-shot chunks (module doc).
        let c = call(Op::AllGather, 10 * cap / 4, 4, DType::F32);
        let routes: Vec<Route> =
            Chunks::single(&c, 1, 4, Route::IpcPush, cap, 0).unwrap().map(|p| p.unwrap().route).collect();
        assert!(routes.len() > 1 && routes.iter().all(|&r| r == Route::IpcOneShot), "{routes:?}");
    }

    #[test]
    fn bulk_push_all_reduce_above_its_frame_runs_as_bulk_chunks() {
        let cap = 4096;
        for world in [2usize, 4, 8] {
            for dtype in [DType::F32, DType::BF16] {
                let size = dtype.size();
                let step = bulk_all_reduce_elements(cap, size, world);
                assert!(
                    step > 0 && 2 * step * size <= cap && (step / world * size).is_multiple_of(16),
                    "{world} {dtype}"
                );
                // Above the frame a bulk route fits (half the capacity), up to 10x the capacity.
                for n in [cap / size / 2 + 1, cap / size, 7 * cap / 2 / size + 3, 10 * cap / size] {
                    let c = call(Op::AllReduce, n, world, dtype);
                    let plans: Vec<Plan> =
                        Chunks::single(&c, 1, world, Route::IpcPush, cap, 0).unwrap().map(Result::unwrap).collect();
                    assert_eq!(plans.len(), n.div_ceil(step), "world {world} {dtype} n {n}");
                    let mut next = 0;
                    for p in &plans {
                        assert_eq!(p.route, Route::IpcPush);
                        assert_eq!(p.sig, Signature { route: Route::IpcPush, ..c.signature() });
                        assert!(p.frame_elems * size <= cap, "frame of {} elements", p.frame_elems);
                        // Rank 1 reduces its shard of the chunk straight into the output.
                        let own = p.phase1.as_slice().iter().find(|s| s.peer == 1).unwrap();
                        if own.count > 0 {
                            assert_eq!((own.dst - c.dst) % 16, 0, "shards start 16-byte aligned");
                        }
                        let gathered: usize = p.phase2.as_slice().iter().map(|s| s.count).sum::<usize>() + own.count;
                        next += gathered;
                    }
                    assert_eq!(next, n, "world {world} {dtype} n {n}: every element once");
                }
            }
        }
        // A frame too small for one 16-byte shard per slot: one-shot chunks, as before.
        let c = call(Op::AllReduce, 64, 8, DType::F32);
        assert_eq!(bulk_all_reduce_elements(128, 4, 8), 0);
        let routes: Vec<Route> =
            Chunks::single(&c, 1, 8, Route::IpcPush, 128, 0).unwrap().map(|p| p.unwrap().route).collect();
        assert!(routes.iter().all(|&r| r == Route::IpcOneShot), "{routes:?}");
    }

    #[test]
    fn lanes_are_grouped_and_big_lanes_chunked() {
        // SAFETY: as above.
        let lane = |addr: u64, n: usize| unsafe { Io::InPlace(RawMut::from_raw(addr, n, DType::F32)) };
        let (calls, sig) = validate_many(
            &[lane(0x10000, 200), lane(0x20000, 600), lane(0x30000, 4000), lane(0x40000, 8)],
            0,
            2,
            usize::MAX,
        )
        .unwrap();
        let plans: Vec<Plan> =
            Chunks::many(&calls, sig, 0, 2, Route::IpcOneShot, 4096, 0).map(Result::unwrap).collect();
        // [200, 600] in one frame, 4000 in 16000 / 4096 = 4 chunks of 1024 elements, [8].
        assert_eq!(plans.len(), 1 + 4 + 1);
        assert!(plans.iter().all(|p| p.sig == sig));
        assert_eq!(plans[0].phase1.as_slice().len(), 2);
        assert_eq!(plans[5].stage.as_slice()[0].frame_offset, 0);
    }
}
