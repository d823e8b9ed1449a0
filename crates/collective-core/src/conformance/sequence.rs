//! Long randomized back-to-back call sequences, shared by the GPU twins' `tests/gpu.rs`
//! (`cuda-ipc`, `hip-ipc`): the plan (the same on every rank), enqueueing one planned call,
//! checking a batch against `fixed-tree`, the global enqueue order of ranks that are threads
//! sharing one device's queues, and the `DETCOLL_RANDOM_*` knobs (docs/running.md).
//!
//! What stays in each backend: memory, streams, the in-place setup copy and the rank loop.
use super::cases::{call, expected};
use super::data::{Rng, compare, finite_values};
use crate::{Collective, DType, Error, Io, Op, RawMut, RawRef};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The input seed of `rank` for `step` (a step, a dtype, a lane: whatever the test numbers).
pub fn seed(step: usize, rank: usize) -> u64 {
    (step as u64) << 20 ^ (rank as u64) << 4 ^ 0xD37
}

/// Elements of `op`'s output for `n` input elements per rank.
pub fn out_len(op: Op, n: usize, world: usize) -> usize {
    match op {
        Op::AllReduce => n,
        Op::AllGather => n * world,
        _ => n / world,
    }
}

/// Shard `rank` of `full`, cut in `world` equal parts.
pub fn shard_of(full: &[u8], world: usize, rank: usize) -> Vec<u8> {
    let s = full.len() / world;
    full[rank * s..(rank + 1) * s].to_vec()
}

/// One planned call.
#[derive(Debug, Clone)]
pub struct Call {
    pub op: Op,
    pub dtype: DType,
    /// (element offset into the rank's input buffer of `dtype`, elements) per lane.
    pub lanes: Vec<(usize, usize)>,
    pub in_place: bool,
    /// Byte offset of each lane's output region in the arena, and its element offset within.
    pub out_at: Vec<usize>,
    pub out_off: usize,
}

/// `calls` random calls of at most `capacity` bytes per rank, and the arena bytes their outputs
/// need. In-place calls only when `allow_in_place`.
pub fn plan_batch(
    rng: &mut Rng,
    calls: usize,
    world: usize,
    capacity: usize,
    allow_in_place: bool,
) -> (Vec<Call>, usize) {
    let mut v = Vec::with_capacity(calls);
    let mut arena = 0usize;
    for _ in 0..calls {
        let op = [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::ReduceScatterMany][rng.below(4)];
        let dtype = DType::REDUCIBLE[rng.below(3)];
        let max = capacity / dtype.size();
        let pick = |rng: &mut Rng, limit: usize| {
            let e = rng.below(18);
            let n = rng.below(limit.min(1 << e) + 1);
            if matches!(op, Op::ReduceScatter | Op::ReduceScatterMany) { n / world * world } else { n }
        };
        let nlanes = if op == Op::ReduceScatterMany { 1 + rng.below(3) } else { 1 };
        let mut lanes = Vec::new();
        let mut left = max;
        for _ in 0..nlanes {
            let n = pick(rng, left);
            left -= n;
            lanes.push((rng.below(4), n));
        }
        let in_place = op != Op::ReduceScatterMany && rng.below(4) == 0 && allow_in_place;
        let out_off = rng.below(4);
        let mut out_at = Vec::new();
        for &(_, n) in &lanes {
            out_at.push(arena);
            let elems = if in_place { if op == Op::AllGather { n * world } else { n } } else { out_len(op, n, world) };
            arena += ((out_off + elems) * dtype.size()).div_ceil(256) * 256 + 256;
        }
        v.push(Call { op, dtype, lanes, in_place, out_at, out_off });
    }
    (v, arena)
}

/// `total` calls in batches of `batch` (every batch planned up front, the same on every rank,
/// so the arena is allocated once), and the arena bytes of the largest batch.
pub fn plan(total: usize, batch: usize, world: usize, capacity: usize) -> (Vec<Vec<Call>>, usize) {
    let mut rng = Rng::new(0xBA7C4);
    let batches: Vec<(Vec<Call>, usize)> = (0..total.div_ceil(batch))
        .map(|k| plan_batch(&mut rng, batch.min(total - k * batch), world, capacity, !no_in_place()))
        .collect();
    let arena = batches.iter().map(|b| b.1).max().unwrap_or(0).max(1);
    (batches.into_iter().map(|b| b.0).collect(), arena)
}

/// Every rank's input per dtype, indexed `[dtype as usize][rank]` (`DType::REDUCIBLE` order),
/// known to every rank for the reference: `capacity` bytes and a slack for the lane offsets.
pub fn inputs(world: usize, capacity: usize) -> Vec<Vec<Vec<u8>>> {
    let slack = 8;
    DType::REDUCIBLE
        .iter()
        .map(|&d| (0..world).map(|r| finite_values(d, capacity / d.size() + slack, seed(d as usize, r))).collect())
        .collect()
}

/// Enqueues call `c` on `comm`: its inputs read from `input` (this rank's device copy of
/// [`inputs`] for `c.dtype`), its outputs in the arena at `arena`. An in-place call first
/// copies its input into place with `copy(src, dst, elements, dtype)` (the backend's
/// kernel-based copy: a driver copy queued behind a pending collective can block a peer's).
///
/// # Safety
/// `input` must hold this rank's input of `c.dtype` (as [`inputs`] sizes it) and `arena` the
/// arena [`plan`] sized, both device memory `comm` can address that stays valid and otherwise
/// untouched until the stream has executed the call.
pub unsafe fn enqueue<C: Collective>(
    comm: &C,
    stream: &C::Stream,
    c: &Call,
    input: u64,
    arena: u64,
    copy: impl FnOnce(u64, u64, usize, DType) -> Result<(), Error>,
) -> Result<(), Error> {
    let (world, me) = (comm.world_size(), comm.rank());
    let size = c.dtype.size();
    let src_of = |off: usize| input + (off * size) as u64;
    if c.in_place {
        let (off, n) = c.lanes[0];
        let buf = arena + c.out_at[0] as u64 + (c.out_off * size) as u64;
        let (len, at) = if c.op == Op::AllGather { (n * world, me * n) } else { (n, 0) };
        if n > 0 {
            copy(src_of(off), buf + (at * size) as u64, n, c.dtype)?;
        }
        // SAFETY: inside the arena (the caller's contract).
        let io = Io::InPlace(unsafe { RawMut::from_raw(buf, len, c.dtype) });
        return call(comm, c.op, io, stream);
    }
    let view = |&(off, n): &(usize, usize), &at: &usize| {
        // SAFETY: input inside the rank's input buffer, output inside the arena (the caller's
        // contract).
        let input = unsafe { RawRef::from_raw(src_of(off), n, c.dtype) };
        // SAFETY: as above.
        let output =
            unsafe { RawMut::from_raw(arena + (at + c.out_off * size) as u64, out_len(c.op, n, world), c.dtype) };
        Io::OutOfPlace { input, output }
    };
    match c.op {
        Op::ReduceScatterMany => {
            let ios: Vec<Io<'_>> = c.lanes.iter().zip(&c.out_at).map(|(l, at)| view(l, at)).collect();
            comm.reduce_scatter_many(&ios, stream)
        }
        op => call(comm, op, view(&c.lanes[0], &c.out_at[0]), stream),
    }
}

/// Checks rank `me`'s outputs of `calls` in `arena` (the arena's bytes after the batch ran)
/// against `fixed-tree` over `inputs` ([`inputs`]), bit for bit; `first` numbers the calls.
pub fn check_batch(
    arena: &[u8],
    calls: &[Call],
    inputs: &[Vec<Vec<u8>>],
    world: usize,
    me: usize,
    first: usize,
) -> Result<(), String> {
    for (k, c) in calls.iter().enumerate() {
        let d = c.dtype as usize;
        let size = c.dtype.size();
        for (l, &(off, n)) in c.lanes.iter().enumerate() {
            let lane: Vec<Vec<u8>> = (0..world).map(|r| inputs[d][r][off * size..(off + n) * size].to_vec()).collect();
            let at = c.out_at[l] + c.out_off * size;
            let want = expected(c.op, &lane, c.dtype, me);
            // In place, a rank's reduce_scatter shard lands at its own offset of the buffer.
            let res_at = if c.in_place && c.op == Op::ReduceScatter { me * (n / world) * size } else { 0 };
            let got = &arena[at + res_at..at + res_at + want.len()];
            compare(got, &want, c.dtype).map_err(|e| format!("rank {me} call {} {c:?} lane {l}: {e}", first + k))?;
        }
    }
    Ok(())
}

/// A global enqueue order of ranks: call k of ranks 0, 1, ..., world-1, then call k+1, as one
/// host thread driving every rank would. For backends whose ranks do not order themselves
/// (the GPU engine's ranks sharing a device do: its lockstep, which turns like these would
/// wait for).
#[derive(Debug, Default)]
pub struct Order {
    next: AtomicUsize,
    /// A rank left early: nobody waits for its turns any more.
    broken: AtomicBool,
}

/// A turn in an [`Order`]; dropping it passes the turn on.
#[derive(Debug)]
pub struct Turn<'a>(&'a Order);

/// A rank's membership in an [`Order`]: dropped before [`Member::finished`] (an error return or
/// a panic), it breaks the order so the other ranks fail instead of waiting for its turns.
#[derive(Debug)]
pub struct Member<'a>(&'a Order, bool);

/// Bound on waiting for a turn.
pub const TURN_WAIT: Duration = Duration::from_secs(60);

impl Order {
    /// Waits for turn `mine`: an error, never a hang, when a rank left early or after
    /// [`TURN_WAIT`].
    pub fn wait(&self, mine: usize) -> Result<Turn<'_>, String> {
        let t = Instant::now();
        while self.next.load(Ordering::Acquire) < mine {
            if self.broken.load(Ordering::Acquire) {
                return Err(format!("enqueue turn {mine}: another rank failed"));
            }
            if t.elapsed() > TURN_WAIT {
                self.broken.store(true, Ordering::Release);
                let at = self.next.load(Ordering::Acquire);
                return Err(format!("waited {TURN_WAIT:?} for enqueue turn {mine} (the order is at {at})"));
            }
            std::hint::spin_loop();
        }
        Ok(Turn(self))
    }

    /// A rank joining the order.
    pub fn member(&self) -> Member<'_> {
        Member(self, false)
    }
}

impl Member<'_> {
    /// The rank took all its turns.
    pub fn finished(mut self) {
        self.1 = true;
    }
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.broken.store(true, Ordering::Release);
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.next.fetch_add(1, Ordering::AcqRel);
    }
}

/// Enqueues one planned batch — this rank's calls `done..done + calls.len()` — back to back, as
/// the GPU twins' randomized tests do: `sync(i)` before call `i` every `in_flight` calls (0:
/// never), and with `order`, each call inside its global turn (`i * world + rank`).
/// `enqueue(i, call)` enqueues call `i`; both closures return their error text as it should be
/// reported.
#[allow(clippy::too_many_arguments)]
pub fn enqueue_batch(
    calls: &[Call],
    done: usize,
    world: usize,
    rank: usize,
    in_flight: usize,
    order: Option<&Order>,
    mut sync: impl FnMut(usize) -> Result<(), String>,
    mut enqueue: impl FnMut(usize, &Call) -> Result<(), String>,
) -> Result<(), String> {
    for (k, c) in calls.iter().enumerate() {
        let i = done + k;
        if in_flight > 0 && k > 0 && k % in_flight == 0 {
            sync(i)?;
        }
        let _turn = order.map(|o| o.wait(i * world + rank)).transpose()?;
        enqueue(i, c)?;
    }
    Ok(())
}

/// DETCOLL_RANDOM_CALLS: calls of the world-8 run (default 10,000; world 2 runs a fifth).
pub fn random_calls() -> usize {
    knob("DETCOLL_RANDOM_CALLS", 1, 100_000_000).unwrap_or(10_000)
}

/// A test knob: unset is `None`; a value outside `min..=max` stops the test with a message
/// naming the variable (a typo must not silently run the default).
fn knob(name: &str, min: u64, max: u64) -> Option<usize> {
    let parsed = crate::env::read(name, |n, v| crate::env::parse_u64_in(n, v, min, max, "a test knob"));
    parsed.unwrap_or_else(|e| panic!("{e}")).map(|v| v as usize)
}

/// DETCOLL_RANDOM_BLOCKS: blocks per rank of a randomized run on a GPU (`None`: the backend's
/// default, compute units / ranks sharing the GPU).
pub fn random_blocks() -> Option<usize> {
    knob("DETCOLL_RANDOM_BLOCKS", 1, 1024)
}

/// DETCOLL_RANDOM_NO_INPLACE=1: only out-of-place calls (no setup copies inside a batch).
pub fn no_in_place() -> bool {
    crate::env::read("DETCOLL_RANDOM_NO_INPLACE", crate::env::parse_bool)
        .unwrap_or_else(|e| panic!("{e}"))
        .unwrap_or(false)
}

/// DETCOLL_RANDOM_INFLIGHT: calls a rank may have queued before it synchronises its stream
/// (0 = a whole batch of 500). Default: the whole batch when enqueue is ordered, else 64.
pub fn random_in_flight(ordered: bool) -> usize {
    let default = if ordered { 0 } else { 64 };
    knob("DETCOLL_RANDOM_INFLIGHT", 0, 1_000_000).unwrap_or(default)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conformance::data::reference_reduce;

    #[test]
    fn plans_fit_capacity_and_are_the_same_on_every_rank() {
        let (a, arena) = plan(1200, 500, 8, 64 << 10);
        let (b, _) = plan(1200, 500, 8, 64 << 10);
        assert_eq!(a.iter().map(Vec::len).collect::<Vec<_>>(), [500, 500, 200]);
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            assert_eq!(format!("{x:?}"), format!("{y:?}"));
        }
        for c in a.iter().flatten() {
            let bytes: usize = c.lanes.iter().map(|l| l.1 * c.dtype.size()).sum();
            assert!(bytes <= 64 << 10, "{c:?}");
            if matches!(c.op, Op::ReduceScatter | Op::ReduceScatterMany) {
                assert!(c.lanes.iter().all(|l| l.1 % 8 == 0), "{c:?}");
            }
            assert!(c.out_at.iter().all(|&at| at < arena));
        }
    }

    /// A batch "run" on the host (outputs written where a backend would) passes the check;
    /// one flipped bit fails it.
    #[test]
    fn check_batch_reads_where_the_outputs_land() {
        let (world, me, capacity) = (4, 2, 4 << 10);
        let mut rng = Rng::new(7);
        let (calls, arena_bytes) = plan_batch(&mut rng, 200, world, capacity, true);
        let inputs = inputs(world, capacity);
        let mut arena = vec![0u8; arena_bytes];
        for c in &calls {
            let size = c.dtype.size();
            for (l, &(off, n)) in c.lanes.iter().enumerate() {
                let lane: Vec<Vec<u8>> =
                    (0..world).map(|r| inputs[c.dtype as usize][r][off * size..(off + n) * size].to_vec()).collect();
                let out = match c.op {
                    Op::AllReduce => reference_reduce(&lane, c.dtype),
                    Op::AllGather => lane.concat(),
                    _ => shard_of(&reference_reduce(&lane, c.dtype), world, me),
                };
                let res_at = if c.in_place && c.op == Op::ReduceScatter { me * (n / world) * size } else { 0 };
                let at = c.out_at[l] + c.out_off * size + res_at;
                arena[at..at + out.len()].copy_from_slice(&out);
            }
        }
        check_batch(&arena, &calls, &inputs, world, me, 0).expect("host run");
        let c = calls.iter().find(|c| c.lanes[0].1 > 0).expect("a non-empty call");
        arena[c.out_at[0] + c.out_off * c.dtype.size()] ^= 1;
        assert!(check_batch(&arena, &calls, &inputs, world, me, 0).is_err());
    }

    #[test]
    fn order_fails_instead_of_waiting_for_a_rank_that_left() {
        let order = Order::default();
        drop(order.member());
        assert!(order.wait(1).is_err());
        let order = Order::default();
        let m = order.member();
        drop(order.wait(0).expect("turn 0"));
        drop(order.wait(1).expect("turn 1"));
        m.finished();
    }

    #[test]
    fn batches_sync_every_in_flight_calls_and_take_their_turns() {
        let (batches, _) = plan(10, 10, 2, 4096);
        let calls = &batches[0];
        let (mut synced, mut enqueued) = (Vec::new(), Vec::new());
        let sync = |i| {
            synced.push(i);
            Ok(())
        };
        let enqueue = |i, _: &Call| {
            enqueued.push(i);
            Ok(())
        };
        enqueue_batch(calls, 20, 2, 0, 4, None, sync, enqueue).unwrap();
        assert_eq!((synced, enqueued), (vec![24, 28], (20..30).collect::<Vec<_>>()));
        // Rank 1 of world 2 at calls 20.. takes turns 41, 43, ...: without rank 0 taking 40 the
        // first wait fails (rank 0 left), and nothing is enqueued.
        let order = Order::default();
        drop(order.member());
        let r = enqueue_batch(calls, 20, 2, 1, 0, Some(&order), |_| Ok(()), |_, _| panic!("enqueued out of turn"));
        assert!(r.unwrap_err().contains("turn 41"));
        // Errors come back as the closures word them, and stop the batch.
        let mut n = 0;
        let r = enqueue_batch(
            calls,
            0,
            2,
            0,
            0,
            None,
            |_| Ok(()),
            |i, _| {
                n += 1;
                if i == 3 { Err(format!("call {i} failed")) } else { Ok(()) }
            },
        );
        assert_eq!((r.unwrap_err(), n), ("call 3 failed".to_string(), 4));
    }
}
