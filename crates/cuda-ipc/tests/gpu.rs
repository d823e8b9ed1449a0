//! GPU behaviour beyond the conformance suite: CUDA graph capture and replay, long randomized
//! back-to-back sequences, fail-closed protocol errors (mismatched calls, a rank that never
//! arrives), and the fused tree kernel (hardware and software arithmetic) against `fixed-tree`.
//! Without a GPU each test prints "skipped: no CUDA device".
mod common;

use collective_core::conformance::data::{Rng, compare, finite_values, reference_reduce, special_values};
use collective_core::{Collective, DType, Error, Io, Op, RawMut, RawRef};
use common::{CudaRank, DevBuf, addr, gpu, gpu_lock, run_ranks};
use cuda_ipc::cudarc::driver::{CudaSlice, CudaStream, sys};
use cuda_ipc::{CudaIpcCollective, CudaIpcConfig, FusedTree};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering as AtomicOrdering};
use std::time::{Duration, Instant};

fn seed(step: usize, rank: usize) -> u64 {
    (step as u64) << 20 ^ (rank as u64) << 4 ^ 0xD37
}

/// A device copy of `data` in the rank's region.
fn put(rank: &mut CudaRank, data: &[u8]) -> DevBuf {
    let b = rank.alloc_dev(data.len());
    rank.upload(b.ptr, data);
    b
}

fn upload(stream: &Arc<CudaStream>, data: &[u8]) -> CudaSlice<u8> {
    let mut b = stream.alloc_zeros::<u8>(data.len().max(1)).expect("alloc");
    if !data.is_empty() {
        stream.memcpy_htod(data, &mut b.slice_mut(..data.len())).expect("htod");
    }
    b
}

fn in_view(b: &DevBuf, off: usize, n: usize, d: DType) -> RawRef<'static> {
    // SAFETY: test buffers outlive every call enqueued on them (each test synchronises first).
    unsafe { RawRef::from_raw(b.ptr + off as u64, n, d) }
}

fn out_view(b: &DevBuf, off: usize, n: usize, d: DType) -> RawMut<'static> {
    // SAFETY: as above; each output region is written by one call only.
    unsafe { RawMut::from_raw(b.ptr + off as u64, n, d) }
}

fn shard_of(full: &[u8], world: usize, rank: usize) -> Vec<u8> {
    let s = full.len() / world;
    full[rank * s..(rank + 1) * s].to_vec()
}

// ---------------------------------------------------------------------------------------------
// CUDA graph capture.
// ---------------------------------------------------------------------------------------------

/// One step of the captured sequence: op, dtype, lane sizes (elements per rank).
struct Step {
    op: Op,
    dtype: DType,
    lanes: Vec<usize>,
}

fn graph_steps(world: usize) -> Vec<Step> {
    vec![
        Step { op: Op::AllReduce, dtype: DType::BF16, lanes: vec![4096] }, // one-shot
        Step { op: Op::AllReduce, dtype: DType::F32, lanes: vec![65536 + 3] }, // RS+AG (> 64 KiB)
        Step { op: Op::AllGather, dtype: DType::F16, lanes: vec![1001] },
        Step { op: Op::ReduceScatter, dtype: DType::F32, lanes: vec![1024 * world] },
        Step { op: Op::ReduceScatterMany, dtype: DType::BF16, lanes: vec![16 * world, 300 * world, world] },
        Step { op: Op::AllReduce, dtype: DType::F16, lanes: vec![7] },
    ]
}

/// Expected output of `rank` for lane `l` of step `i`.
fn graph_expected(steps: &[Step], world: usize, rank: usize, i: usize, l: usize) -> Vec<u8> {
    let s = &steps[i];
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| finite_values(s.dtype, s.lanes[l], seed(i * 16 + l, r))).collect();
    match s.op {
        Op::AllReduce => reference_reduce(&inputs, s.dtype),
        Op::AllGather => inputs.concat(),
        _ => shard_of(&reference_reduce(&inputs, s.dtype), world, rank),
    }
}

fn out_len(op: Op, n: usize, world: usize) -> usize {
    match op {
        Op::AllReduce => n,
        Op::AllGather => n * world,
        _ => n / world,
    }
}

struct StepBufs {
    inputs: Vec<DevBuf>,
    outputs: Vec<DevBuf>,
}

fn enqueue_steps(rank: &CudaRank, steps: &[Step], bufs: &[StepBufs]) -> Result<(), Error> {
    let (c, s) = (&rank.comm, &*rank.stream);
    let world = c.world_size();
    for (step, b) in steps.iter().zip(bufs) {
        let ios: Vec<Io<'_>> = step
            .lanes
            .iter()
            .enumerate()
            .map(|(l, &n)| Io::OutOfPlace {
                input: in_view(&b.inputs[l], 0, n, step.dtype),
                output: out_view(&b.outputs[l], 0, out_len(step.op, n, world), step.dtype),
            })
            .collect();
        match step.op {
            Op::ReduceScatterMany => c.reduce_scatter_many(&ios, s)?,
            op => {
                let io = ios.into_iter().next().ok_or(Error::Closed)?;
                match op {
                    Op::AllReduce => c.all_reduce(io, s)?,
                    Op::AllGather => c.all_gather(io, s)?,
                    _ => c.reduce_scatter(io, s)?,
                }
            }
        }
    }
    Ok(())
}

fn check_steps(rank: &CudaRank, steps: &[Step], bufs: &[StepBufs], what: &str) -> Result<(), String> {
    let c = &rank.comm;
    for (i, (step, b)) in steps.iter().zip(bufs).enumerate() {
        for l in 0..step.lanes.len() {
            let want = graph_expected(steps, c.world_size(), c.rank(), i, l);
            let got = rank.download(b.outputs[l].ptr, b.outputs[l].len);
            compare(&got[..want.len()], &want, step.dtype)
                .map_err(|e| format!("{what}: step {i} lane {l} ({:?}): {e}", step.op))?;
        }
    }
    Ok(())
}

#[test]
fn graph_capture_of_mixed_ops_replays_bitwise() {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let world = 8;
    let config = CudaIpcConfig::new(1 << 20).with_rsag_threshold(64 << 10);
    let comms = CudaIpcCollective::group_on_device(&ctx, world, &config).expect("group");
    let steps = graph_steps(world);
    let r = run_ranks(&ctx, comms, |rank| {
        let me = rank.comm.rank();
        let s = rank.stream.clone();
        let mut bufs = Vec::new();
        for (i, st) in steps.iter().enumerate() {
            let inputs = st
                .lanes
                .iter()
                .enumerate()
                .map(|(l, &n)| put(rank, &finite_values(st.dtype, n, seed(i * 16 + l, me))))
                .collect();
            let outputs =
                st.lanes.iter().map(|&n| rank.alloc_dev(out_len(st.op, n, world) * st.dtype.size())).collect();
            bufs.push(StepBufs { inputs, outputs });
        }
        rank.barrier.wait();
        // Eager first, so the device generation counter is not at its initial value.
        enqueue_steps(rank, &steps, &bufs).map_err(|e| e.to_string())?;
        check_steps(rank, &steps, &bufs, "eager")?;
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).map_err(|e| e.to_string())?;
        let enq = enqueue_steps(rank, &steps, &bufs);
        let graph = s.end_capture(sys::CUgraphInstantiate_flags_enum(0)).map_err(|e| e.to_string())?;
        enq.map_err(|e| e.to_string())?;
        let graph = graph.ok_or("empty graph")?;
        graph.upload().map_err(|e| e.to_string())?;
        // Instantiation and upload may synchronise the device: nobody replays before every
        // rank has finished them.
        s.synchronize().map_err(|e| e.to_string())?;
        rank.barrier.wait();
        for replay in 0..100 {
            // Memsets only on a drained stream (see `CudaRank::upload`).
            s.synchronize().map_err(|e| e.to_string())?;
            for b in &bufs {
                for o in &b.outputs {
                    // Outputs are cleared so a replay that did nothing cannot pass.
                    // SAFETY: clearing a whole live test buffer on its stream.
                    let r = unsafe { sys::cuMemsetD8Async(o.ptr, 0, o.len, s.cu_stream()) };
                    r.result().map_err(|e| e.to_string())?;
                }
            }
            graph.launch().map_err(|e| e.to_string())?;
            check_steps(rank, &steps, &bufs, &format!("replay {replay}"))?;
        }
        // Eager again: the generation continued on the device through the replays.
        enqueue_steps(rank, &steps, &bufs).map_err(|e| e.to_string())?;
        check_steps(rank, &steps, &bufs, "eager after replays")?;
        s.synchronize().map_err(|e| e.to_string())?;
        rank.comm.check().map_err(|e| e.to_string())
    });
    r.expect("graph capture");
}

// ---------------------------------------------------------------------------------------------
// Randomized back-to-back calls.
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct RCall {
    op: Op,
    dtype: DType,
    /// (element offset into the rank's input buffer of `dtype`, elements) per lane.
    lanes: Vec<(usize, usize)>,
    in_place: bool,
    /// Byte offset of each lane's output region in the arena, and its element offset within.
    out_at: Vec<usize>,
    out_off: usize,
}

fn plan_batch(rng: &mut Rng, calls: usize, world: usize, capacity: usize) -> (Vec<RCall>, usize) {
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
        let in_place = op != Op::ReduceScatterMany && rng.below(4) == 0 && !no_in_place();
        let out_off = rng.below(4);
        let mut out_at = Vec::new();
        for &(_, n) in &lanes {
            out_at.push(arena);
            let elems = if in_place { if op == Op::AllGather { n * world } else { n } } else { out_len(op, n, world) };
            arena += ((out_off + elems) * dtype.size()).div_ceil(256) * 256 + 256;
        }
        v.push(RCall { op, dtype, lanes, in_place, out_at, out_off });
    }
    (v, arena)
}

/// The global enqueue order of ranks that are threads sharing one context: call k of ranks
/// 0, 1, ..., world-1, then call k+1, as one host thread driving every rank would. Such ranks
/// must enqueue this way (see `CudaIpcCollective::group`): one rank enqueuing two or more
/// calls ahead of another can leave a peer's flag unpublished behind the context's shared
/// queues until the timeout.
#[derive(Default)]
struct Order {
    next: AtomicUsize,
    /// A rank left early: nobody waits for its turns any more.
    broken: AtomicBool,
}

/// A turn in an [`Order`]; dropping it passes the turn on.
struct Turn<'a>(&'a Order);

/// A rank's membership in an [`Order`]: dropped before [`Member::finished`] (an error return or
/// a panic), it breaks the order so the other ranks fail instead of waiting for its turns.
struct Member<'a>(&'a Order, bool);

/// Bound on waiting for a turn.
const TURN_WAIT: Duration = Duration::from_secs(60);

impl Order {
    /// Waits for turn `mine`: an error, never a hang, when a rank left early or after
    /// [`TURN_WAIT`].
    fn wait(&self, mine: usize) -> Result<Turn<'_>, String> {
        let t = Instant::now();
        while self.next.load(AtomicOrdering::Acquire) < mine {
            if self.broken.load(AtomicOrdering::Acquire) {
                return Err(format!("enqueue turn {mine}: another rank failed"));
            }
            if t.elapsed() > TURN_WAIT {
                self.broken.store(true, AtomicOrdering::Release);
                let at = self.next.load(AtomicOrdering::Acquire);
                return Err(format!("waited {TURN_WAIT:?} for enqueue turn {mine} (the order is at {at})"));
            }
            std::hint::spin_loop();
        }
        Ok(Turn(self))
    }

    fn member(&self) -> Member<'_> {
        Member(self, false)
    }
}

impl Member<'_> {
    fn finished(mut self) {
        self.1 = true;
    }
}

impl Drop for Member<'_> {
    fn drop(&mut self) {
        if !self.1 {
            self.0.broken.store(true, AtomicOrdering::Release);
        }
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.0.next.fetch_add(1, AtomicOrdering::AcqRel);
    }
}

/// A failed call, with the device error record's generation and observed flag word.
fn failure(rank: &common::CudaRank, c: &RCall, e: &Error) -> String {
    let rec = rank.comm.error_record().unwrap_or_default();
    format!(
        "{c:?}: {e} [record: code {} peer {} at generation {}, observed flag generation {} digest {:#x}]",
        rec[0],
        rec[1],
        rec[2],
        rec[3] >> 32,
        rec[3] & 0xffff_ffff
    )
}

fn randomized(world: usize, total: usize, capacity: usize) {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let mut config = CudaIpcConfig::new(capacity).with_rsag_threshold(16 << 10);
    // DETCOLL_RANDOM_BLOCKS: blocks per rank (default: SMs / ranks sharing the GPU).
    if let Some(b) = std::env::var("DETCOLL_RANDOM_BLOCKS").ok().and_then(|v| v.parse().ok()) {
        config = config.with_max_blocks(b);
    }
    let comms = CudaIpcCollective::group_on_device(&ctx, world, &config).expect("group");
    // Every rank's input per dtype, known to every rank for the reference.
    let slack = 8;
    let host_inputs: Vec<Vec<Vec<u8>>> = DType::REDUCIBLE
        .iter()
        .map(|&d| (0..world).map(|r| finite_values(d, capacity / d.size() + slack, seed(d as usize, r))).collect())
        .collect();
    let batch = 500;
    // Every rank a thread in `ctx`.
    let ordered = ordered_enqueue(world, true);
    let in_flight = random_in_flight(ordered);
    let order = Order::default();
    println!(
        "world {world}: {total} calls, batches of {batch}, at most {in_flight} in flight per rank (0 = all), ordered enqueue {ordered}"
    );
    // Every batch planned up front (the same on every rank), so the arena is allocated once.
    let mut rng = Rng::new(0xBA7C4);
    let batches: Vec<(Vec<RCall>, usize)> = (0..total.div_ceil(batch))
        .map(|k| plan_batch(&mut rng, batch.min(total - k * batch), world, capacity))
        .collect();
    let arena_bytes = batches.iter().map(|b| b.1).max().unwrap_or(0).max(1);
    // In-place setup copies in the middle of a batch go through a kernel (the 1-leaf tree),
    // never a copy engine: a driver copy queued behind a pending collective can block a
    // peer's copies (see `CudaRank::upload`). Loaded before any rank starts.
    let copier = FusedTree::new(&ctx).expect("kernels");
    let started = Instant::now();
    let r = run_ranks(&ctx, comms, |rank| {
        let me = rank.comm.rank();
        let s = rank.stream.clone();
        let dev_inputs: Vec<DevBuf> = host_inputs.iter().map(|per_rank| put(rank, &per_rank[me])).collect();
        let arena = rank.alloc_dev(arena_bytes);
        let member = order.member();
        rank.barrier.wait();
        let mut done = 0;
        for (calls, _) in &batches {
            let n_calls = calls.len();
            let base = arena.ptr;
            // Enqueue the batch back to back, with at most `in_flight` calls queued per rank
            // before a stream sync (DETCOLL_RANDOM_INFLIGHT; 0 = the whole batch).
            for (k, c) in calls.iter().enumerate() {
                if in_flight > 0 && k > 0 && k % in_flight == 0 {
                    s.synchronize().map_err(|e| format!("sync before call {}: {e}", done + k))?;
                }
                let _turn = if ordered { Some(order.wait((done + k) * world + me)?) } else { None };
                let d = c.dtype as usize;
                let size = c.dtype.size();
                let src_of = |off: usize| dev_inputs[d].ptr + (off * size) as u64;
                if c.in_place {
                    let (off, n) = c.lanes[0];
                    let buf = base + c.out_at[0] as u64 + (c.out_off * size) as u64;
                    let (len, at) = if c.op == Op::AllGather { (n * world, me * n) } else { (n, 0) };
                    if n > 0 {
                        // SAFETY: copy of `n` elements inside live test buffers, on the rank's stream.
                        unsafe { copier.launch(&[src_of(off)], buf + (at * size) as u64, n, c.dtype, s.cu_stream()) }
                            .map_err(|e| e.to_string())?;
                    }
                    // SAFETY: inside the arena, which lives until after the batch is checked.
                    let io = Io::InPlace(unsafe { RawMut::from_raw(buf, len, c.dtype) });
                    let r = match c.op {
                        Op::AllReduce => rank.comm.all_reduce(io, &s),
                        Op::AllGather => rank.comm.all_gather(io, &s),
                        _ => rank.comm.reduce_scatter(io, &s),
                    };
                    r.map_err(|e| failure(rank, c, &e))?;
                    continue;
                }
                let ios: Vec<Io<'_>> = c
                    .lanes
                    .iter()
                    .zip(&c.out_at)
                    .map(|(&(off, n), &at)| {
                        // SAFETY: input inside the rank's input buffer, output inside the arena.
                        let input = unsafe { RawRef::from_raw(src_of(off), n, c.dtype) };
                        // SAFETY: as above.
                        let output = unsafe {
                            RawMut::from_raw(base + (at + c.out_off * size) as u64, out_len(c.op, n, world), c.dtype)
                        };
                        Io::OutOfPlace { input, output }
                    })
                    .collect();
                let r = match c.op {
                    Op::ReduceScatterMany => rank.comm.reduce_scatter_many(&ios, &s),
                    op => {
                        let io = ios.into_iter().next().ok_or("no lane")?;
                        match op {
                            Op::AllReduce => rank.comm.all_reduce(io, &s),
                            Op::AllGather => rank.comm.all_gather(io, &s),
                            _ => rank.comm.reduce_scatter(io, &s),
                        }
                    }
                };
                r.map_err(|e| failure(rank, c, &e))?;
            }
            let got = rank.download(arena.ptr, arena.len);
            rank.comm.check().map_err(|e| format!("after batch at call {done}: {e}"))?;
            for (k, c) in calls.iter().enumerate() {
                let d = c.dtype as usize;
                let size = c.dtype.size();
                for (l, &(off, n)) in c.lanes.iter().enumerate() {
                    let inputs: Vec<Vec<u8>> =
                        (0..world).map(|r| host_inputs[d][r][off * size..(off + n) * size].to_vec()).collect();
                    let at = c.out_at[l] + c.out_off * size;
                    let (want, res_at) = match c.op {
                        Op::AllReduce => (reference_reduce(&inputs, c.dtype), 0),
                        Op::AllGather => (inputs.concat(), 0),
                        _ => {
                            let w = shard_of(&reference_reduce(&inputs, c.dtype), world, me);
                            let res_at = if c.in_place { me * (n / world) * size } else { 0 };
                            (w, res_at)
                        }
                    };
                    let g = &got[at + res_at..at + res_at + want.len()];
                    compare(g, &want, c.dtype)
                        .map_err(|e| format!("rank {me} call {} {c:?} lane {l}: {e}", done + k))?;
                }
            }
            done += n_calls;
        }
        member.finished();
        Ok(())
    });
    r.expect("randomized sequence");
    println!("{total} randomized calls at world {world} verified in {:?}", started.elapsed());
}

/// DETCOLL_RANDOM_CALLS: calls of the world-8 run (default 10,000; world 2 runs a fifth).
fn random_calls() -> usize {
    std::env::var("DETCOLL_RANDOM_CALLS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000)
}

/// Whether ranks enqueue in the global call order ([`Order`]): by default when they are
/// threads sharing one context and more than two (measured on an H200: eight such ranks
/// enqueuing independently time out, in order 3,000 calls 500 deep pass);
/// DETCOLL_RANDOM_ORDERED=0 or 1 decides instead.
fn ordered_enqueue(world: usize, one_context: bool) -> bool {
    match std::env::var("DETCOLL_RANDOM_ORDERED").as_deref() {
        Ok("0") => false,
        Ok("1") => true,
        _ => one_context && world > 2,
    }
}

/// DETCOLL_RANDOM_NO_INPLACE=1: only out-of-place calls (no setup copies inside a batch).
fn no_in_place() -> bool {
    std::env::var("DETCOLL_RANDOM_NO_INPLACE").as_deref() == Ok("1")
}

/// DETCOLL_RANDOM_INFLIGHT: calls a rank may have queued before it synchronises its stream
/// (0 = a whole batch of 500). Default: the whole batch when enqueue is ordered, else 64.
fn random_in_flight(ordered: bool) -> usize {
    let default = if ordered { 0 } else { 64 };
    std::env::var("DETCOLL_RANDOM_INFLIGHT").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// 10,000 randomized calls (DETCOLL_RANDOM_CALLS) back to back, every output bit-exact against
/// `fixed-tree`. The eight ranks are threads sharing one context, so they enqueue in the
/// global call order (see [`ordered_enqueue`]).
#[test]
fn randomized_back_to_back_world8() {
    randomized(8, random_calls(), 64 << 10);
}

#[test]
fn randomized_back_to_back_world2() {
    randomized(2, random_calls() / 5, 64 << 10);
}

// ---------------------------------------------------------------------------------------------
// Fail-closed protocol errors.
// ---------------------------------------------------------------------------------------------

fn short_config(peer: Duration) -> CudaIpcConfig {
    let mut c = CudaIpcConfig::new(1 << 20);
    c.timeouts.peer = peer;
    c.timeouts.close = Duration::from_secs(5);
    c
}

/// Rank 0 reduces `n0` f32, rank 1 `n1`: both must report SignatureMismatch long before the
/// timeout, then be poisoned.
fn mismatch(n0: usize, n1: usize) {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let bound = Duration::from_secs(8);
    let comms = CudaIpcCollective::group_on_device(&ctx, 2, &short_config(bound)).expect("group");
    let r = run_ranks(&ctx, comms, |rank| {
        let me = rank.comm.rank();
        let s = rank.stream.clone();
        let n = if me == 0 { n0 } else { n1 };
        let input = put(rank, &finite_values(DType::F32, n, 1));
        let output = rank.alloc_dev(n * 4);
        rank.barrier.wait();
        let t = Instant::now();
        let io =
            Io::OutOfPlace { input: in_view(&input, 0, n, DType::F32), output: out_view(&output, 0, n, DType::F32) };
        rank.comm.all_reduce(io, &s).map_err(|e| e.to_string())?;
        s.synchronize().map_err(|e| e.to_string())?;
        let waited = t.elapsed();
        if waited >= bound {
            return Err(format!("the mismatch took {waited:?}, as long as the timeout"));
        }
        match rank.comm.check() {
            Err(Error::SignatureMismatch { peer, ours, theirs }) => {
                if peer != 1 - me || ours.count != n as u64 || theirs.count != (if me == 0 { n1 } else { n0 }) as u64 {
                    return Err(format!("wrong mismatch report: peer {peer}, ours {ours}, theirs {theirs}"));
                }
            }
            other => return Err(format!("expected SignatureMismatch, got {other:?}")),
        }
        let io =
            Io::OutOfPlace { input: in_view(&input, 0, n, DType::F32), output: out_view(&output, 0, n, DType::F32) };
        match rank.comm.all_reduce(io, &s) {
            Err(Error::Poisoned { .. }) => {}
            other => return Err(format!("expected Poisoned after the mismatch, got {other:?}")),
        }
        println!("rank {me}: mismatch reported after {waited:?}");
        Ok(())
    });
    r.expect("mismatch");
}

#[test]
fn mismatched_counts_fail_with_signature_mismatch() {
    mismatch(100, 101);
}

#[test]
fn mismatched_grids_fail_with_signature_mismatch_not_timeout() {
    // 400 B vs 256 KiB: the ranks launch different block counts.
    mismatch(100, 1 << 16);
}

#[test]
fn absent_rank_times_out_and_poisons() {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let bound = Duration::from_millis(300);
    let comms = CudaIpcCollective::group_on_device(&ctx, 2, &short_config(bound)).expect("group");
    let r = run_ranks(&ctx, comms, |rank| {
        let me = rank.comm.rank();
        let s = rank.stream.clone();
        if me == 1 {
            // Never arrives; its own state stays healthy.
            std::thread::sleep(Duration::from_millis(50));
            return rank.comm.check().map_err(|e| format!("the absent rank is not poisoned itself: {e}"));
        }
        let n = 4096;
        let input = put(rank, &finite_values(DType::BF16, n, 2));
        let output = rank.alloc_dev(n * 2);
        let t = Instant::now();
        let io =
            Io::OutOfPlace { input: in_view(&input, 0, n, DType::BF16), output: out_view(&output, 0, n, DType::BF16) };
        rank.comm.all_reduce(io, &s).map_err(|e| e.to_string())?;
        s.synchronize().map_err(|e| e.to_string())?;
        let waited = t.elapsed();
        if waited < bound || waited > bound * 10 {
            return Err(format!("the call ended after {waited:?}, bound {bound:?}"));
        }
        match rank.comm.check() {
            Err(Error::PeerTimeout { peer: 1, .. }) => {}
            other => return Err(format!("expected PeerTimeout from rank 1, got {other:?}")),
        }
        let io =
            Io::OutOfPlace { input: in_view(&input, 0, n, DType::BF16), output: out_view(&output, 0, n, DType::BF16) };
        match rank.comm.all_reduce(io, &s) {
            Err(Error::Poisoned { cause }) => {
                println!("rank 0: timed out after {waited:?}; later call: poisoned ({cause})")
            }
            other => return Err(format!("expected Poisoned, got {other:?}")),
        }
        Ok(())
    });
    r.expect("timeout");
}

// ---------------------------------------------------------------------------------------------
// The fused tree kernel, hardware and software arithmetic.
// ---------------------------------------------------------------------------------------------

#[test]
fn fused_tree_matches_fixed_tree_hard_and_soft() {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let tree = FusedTree::new(&ctx).expect("kernels");
    let s = ctx.new_stream().expect("stream");
    let mut failures = Vec::new();
    for w in [1usize, 2, 4, 8] {
        for d in DType::REDUCIBLE {
            for special in [true, false] {
                let n = 16 * 16 * 16 * 8 + 5;
                let leaves: Vec<Vec<u8>> = (0..w)
                    .map(|r| if special { special_values(d, n, r) } else { finite_values(d, n, seed(w, r)) })
                    .collect();
                let want = reference_reduce(&leaves, d);
                // (input element offset, output element offset): aligned, co-aligned but not
                // 16-byte aligned (scalar head), and not co-aligned (all scalar).
                for (in_off, out_off) in [(0usize, 0usize), (1, 1), (0, 1)] {
                    let size = d.size();
                    let bufs: Vec<CudaSlice<u8>> = leaves
                        .iter()
                        .map(|l| {
                            let mut v = vec![0u8; in_off * size];
                            v.extend_from_slice(l);
                            upload(&s, &v)
                        })
                        .collect();
                    let inputs: Vec<u64> = bufs.iter().map(|b| addr(b, &s) + (in_off * size) as u64).collect();
                    for soft in [false, true] {
                        let out = s.alloc_zeros::<u8>((n + out_off) * size).expect("alloc");
                        let o = addr(&out, &s) + (out_off * size) as u64;
                        // SAFETY: every buffer holds the `n` elements the kernel touches.
                        let r = unsafe {
                            if soft {
                                tree.launch_soft(&inputs, o, n, d, s.cu_stream())
                            } else {
                                tree.launch(&inputs, o, n, d, s.cu_stream())
                            }
                        };
                        r.expect("launch");
                        let got = s.clone_dtoh(&out).expect("dtoh");
                        if let Err(e) = compare(&got[out_off * size..], &want, d) {
                            failures.push(format!(
                                "W={w} {d} special={special} offsets=({in_off},{out_off}) soft={soft}: {e}"
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
