//! GPU behaviour beyond the conformance suite: CUDA graph capture and replay, long randomized
//! back-to-back sequences, fail-closed protocol errors (mismatched calls, a rank that never
//! arrives), and the fused tree kernel (hardware and software arithmetic) against `fixed-tree`.
//! Without a GPU each test prints "skipped: no CUDA device".
mod common;

use collective_core::conformance::data::{compare, finite_values, reference_reduce, special_values};
use collective_core::conformance::faults;
use collective_core::conformance::sequence::{self, out_len, seed, shard_of};
use collective_core::{Collective, DType, Error, Io, Op, RawMut, RawRef};
use common::{CudaRank, DevBuf, addr, gpu, gpu_lock, run_ranks};
use cuda_ipc::cudarc::driver::{CudaSlice, CudaStream, sys};
use cuda_ipc::{CudaIpcConfig, FusedTree};
use std::sync::Arc;
use std::time::{Duration, Instant};

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
    let comms = cuda_ipc::group_on_device(&ctx, world, &config).expect("group");
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

/// A failed call, with the device error record's generation and observed flag word.
fn failure(rank: &common::CudaRank, c: &sequence::Call, e: &Error) -> String {
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
    let config = sequence::config(capacity);
    let comms = cuda_ipc::group_on_device(&ctx, world, &config).expect("group");
    let host_inputs = sequence::inputs(world, capacity);
    let batch = 500;
    // Every rank a thread in `ctx`.
    let ordered = sequence::ordered_enqueue(world, true);
    let in_flight = sequence::random_in_flight(ordered);
    let order = sequence::Order::default();
    println!(
        "world {world}: {total} calls, batches of {batch}, at most {in_flight} in flight per rank (0 = all), ordered enqueue {ordered}"
    );
    let (batches, arena_bytes) = sequence::plan(total, batch, world, capacity);
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
        for calls in &batches {
            // Enqueue the batch back to back, with at most `in_flight` calls queued per rank
            // before a stream sync (DETCOLL_RANDOM_INFLIGHT; 0 = the whole batch).
            let sync = |i| s.synchronize().map_err(|e| format!("sync before call {i}: {e}"));
            sequence::enqueue_batch(calls, done, world, me, in_flight, ordered.then_some(&order), sync, |_, c| {
                let copy = |src: u64, dst: u64, n: usize, d: DType| {
                    // SAFETY: copy of `n` elements inside live test buffers, on the rank's stream.
                    unsafe { copier.launch(&[src], dst, n, d, s.cu_stream()) }
                };
                // SAFETY: the rank's input buffers and arena live until after the batch is checked.
                let r =
                    unsafe { sequence::enqueue(&rank.comm, &s, c, dev_inputs[c.dtype as usize].ptr, arena.ptr, copy) };
                r.map_err(|e| failure(rank, c, &e))
            })?;
            let got = rank.download(arena.ptr, arena.len);
            rank.comm.check().map_err(|e| format!("after batch at call {done}: {e}"))?;
            sequence::check_batch(&got, calls, &host_inputs, world, me, done)?;
            done += calls.len();
        }
        member.finished();
        Ok(())
    });
    r.expect("randomized sequence");
    println!("{total} randomized calls at world {world} verified in {:?}", started.elapsed());
}

/// 10,000 randomized calls (DETCOLL_RANDOM_CALLS) back to back, every output bit-exact against
/// `fixed-tree`. The eight ranks are threads sharing one context, so they enqueue in the
/// global call order (see [`sequence::ordered_enqueue`]).
#[test]
fn randomized_back_to_back_world8() {
    randomized(8, sequence::random_calls(), 64 << 10);
}

#[test]
fn randomized_back_to_back_world2() {
    randomized(2, sequence::random_calls() / 5, 64 << 10);
}

// ---------------------------------------------------------------------------------------------
// Generation wrap.
// ---------------------------------------------------------------------------------------------

/// The device generation counter started just below 2^31 + a few and just below 2^32 (the
/// hook leaves the phase-2 flags at their construction value, as a protocol that never
/// refreshed them would after that many one-shot calls): eight calls alternating the one-shot
/// and RS+AG all_reduce routes with an all_gather in between, every output bit-exact, nothing
/// recorded (a stale phase-2 flag would read as Corrupt after 2^31 calls without the kernels'
/// refresh of the flags a call does not use).
#[test]
fn generations_wrap_without_corrupt_flags() {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let world = 2;
    for start in [(1u32 << 31) + 5, u32::MAX - 3] {
        let config = CudaIpcConfig::new(1 << 20).with_rsag_threshold(16 << 10);
        let comms = cuda_ipc::group_on_device(&ctx, world, &config).expect("group");
        for c in &comms {
            c.start_generation_for_test(start).expect("hook");
        }
        // (op, elements per rank): 4 KiB one-shot, 64 KiB RS+AG, 2 KiB all_gather.
        let calls: Vec<(Op, usize)> = (0..8)
            .map(|i| match i % 3 {
                0 => (Op::AllReduce, 1024),
                1 => (Op::AllReduce, 16 << 10),
                _ => (Op::AllGather, 512),
            })
            .collect();
        let inputs: Vec<Vec<Vec<u8>>> = calls
            .iter()
            .enumerate()
            .map(|(i, &(_, n))| (0..world).map(|r| finite_values(DType::F32, n, (i * 8 + r) as u64)).collect())
            .collect();
        let r = run_ranks(&ctx, comms, |rank| {
            let me = rank.comm.rank();
            let s = rank.stream.clone();
            rank.barrier.wait();
            for (i, &(op, n)) in calls.iter().enumerate() {
                let input = put(rank, &inputs[i][me]);
                let out_n = if op == Op::AllGather { n * world } else { n };
                let output = rank.alloc_dev(out_n * 4);
                let io = Io::OutOfPlace {
                    input: in_view(&input, 0, n, DType::F32),
                    output: out_view(&output, 0, out_n, DType::F32),
                };
                let route = rank.comm.route(op, n * 4);
                let r = if op == Op::AllGather { rank.comm.all_gather(io, &s) } else { rank.comm.all_reduce(io, &s) };
                r.map_err(|e| format!("call {i} ({op}, {route:?}) from generation {start}: {e}"))?;
                let got = rank.download(output.ptr, out_n * 4);
                rank.comm.check().map_err(|e| format!("call {i} ({op}, {route:?}) from generation {start}: {e}"))?;
                let want =
                    if op == Op::AllGather { inputs[i].concat() } else { reference_reduce(&inputs[i], DType::F32) };
                compare(&got, &want, DType::F32).map_err(|e| format!("call {i} ({op}, {route:?}): {e}"))?;
            }
            Ok(())
        });
        r.expect("calls across the generation wrap");
    }
}

// ---------------------------------------------------------------------------------------------
// Fail-closed protocol errors.
// ---------------------------------------------------------------------------------------------

/// Rank 0 reduces `n0` f32, rank 1 `n1`: both must report SignatureMismatch long before the
/// timeout, then be poisoned.
fn mismatch(n0: usize, n1: usize) {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let bound = Duration::from_secs(8);
    let comms = cuda_ipc::group_on_device(&ctx, 2, &faults::config(bound)).expect("group");
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
        let again = || {
            let io = Io::OutOfPlace {
                input: in_view(&input, 0, n, DType::F32),
                output: out_view(&output, 0, n, DType::F32),
            };
            rank.comm.all_reduce(io, &s)
        };
        faults::expect_mismatch(me, [n0, n1], waited, bound, rank.comm.check(), again)?;
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

/// `reduce_scatter_many` with lanes `[4w, 8w]` on rank 0 and `[8w, 4w]` on rank 1 (same total):
/// the kernels compare the published signature, which carries the lane split, so both ranks
/// report SignatureMismatch, write nothing and are poisoned.
#[test]
fn mismatched_lane_splits_fail_with_signature_mismatch() {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let bound = Duration::from_secs(8);
    let comms = cuda_ipc::group_on_device(&ctx, 2, &faults::config(bound)).expect("group");
    let r = run_ranks(&ctx, comms, |rank| {
        let me = rank.comm.rank();
        let s = rank.stream.clone();
        let counts = faults::split_lanes(me, 2);
        let sentinel = vec![0xA5u8; counts.iter().sum::<usize>() / 2 * 4];
        let inputs: Vec<DevBuf> = counts.iter().map(|&n| put(rank, &finite_values(DType::F32, n, 7))).collect();
        let outputs: Vec<DevBuf> = counts.iter().map(|&n| put(rank, &sentinel[..n / 2 * 4])).collect();
        let lanes = |k: usize| Io::OutOfPlace {
            input: in_view(&inputs[k], 0, counts[k], DType::F32),
            output: out_view(&outputs[k], 0, counts[k] / 2, DType::F32),
        };
        rank.barrier.wait();
        let t = Instant::now();
        let called = rank.comm.reduce_scatter_many(&[lanes(0), lanes(1)], &s);
        s.synchronize().map_err(|e| e.to_string())?;
        let waited = t.elapsed();
        let outcome = called.and_then(|()| rank.comm.check());
        let untouched =
            (0..2).all(|k| rank.download(outputs[k].ptr, counts[k] / 2 * 4) == sentinel[..counts[k] / 2 * 4]);
        let again = || rank.comm.reduce_scatter_many(&[lanes(0)], &s);
        faults::expect_split_mismatch(me, waited, bound, outcome, untouched, again)?;
        println!("rank {me}: lane-split mismatch reported after {waited:?}");
        Ok(())
    });
    r.expect("lane-split mismatch");
}

/// Rank 1 closes its handle; rank 0's next call fails with PeerClosed naming it at once (the
/// kernel sees rank 1's close acknowledgement in its own control block), not after the
/// timeout, and is poisoned.
#[test]
fn a_call_after_the_peer_closed_fails_at_once() {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let bound = Duration::from_secs(20);
    let comms = cuda_ipc::group_on_device(&ctx, 2, &faults::config(bound)).expect("group");
    let r = run_ranks(&ctx, comms, |rank| {
        let me = rank.comm.rank();
        let s = rank.stream.clone();
        let n = 1024;
        let input = put(rank, &finite_values(DType::F32, n, 3));
        let output = rank.alloc_dev(n * 4);
        rank.barrier.wait();
        if me == 1 {
            rank.comm.close().map_err(|e| format!("close: {e}"))?;
            rank.barrier.wait();
            return Ok(());
        }
        rank.barrier.wait();
        let io =
            || Io::OutOfPlace { input: in_view(&input, 0, n, DType::F32), output: out_view(&output, 0, n, DType::F32) };
        let t = Instant::now();
        let called = rank.comm.all_reduce(io(), &s);
        s.synchronize().map_err(|e| e.to_string())?;
        let waited = t.elapsed();
        match called.and_then(|()| rank.comm.check()) {
            Err(Error::PeerClosed { peer: 1, .. }) => {}
            other => return Err(format!("expected PeerClosed from rank 1, got {other:?}")),
        }
        if waited > bound / 4 {
            return Err(format!("PeerClosed took {waited:?} (bound {bound:?})"));
        }
        match rank.comm.all_reduce(io(), &s) {
            Err(Error::Poisoned { .. }) => Ok(()),
            other => Err(format!("expected Poisoned after PeerClosed, got {other:?}")),
        }
    });
    r.expect("peer closed");
}

#[test]
fn absent_rank_times_out_and_poisons() {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let bound = Duration::from_millis(300);
    let comms = cuda_ipc::group_on_device(&ctx, 2, &faults::config(bound)).expect("group");
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
        let again = || {
            let io = Io::OutOfPlace {
                input: in_view(&input, 0, n, DType::BF16),
                output: out_view(&output, 0, n, DType::BF16),
            };
            rank.comm.all_reduce(io, &s)
        };
        let cause = faults::expect_timeout(waited, bound, rank.comm.check(), again)?;
        println!("rank 0: timed out after {waited:?}; later call: poisoned ({cause})");
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
