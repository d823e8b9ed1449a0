//! The GPU behaviour beyond the conformance suite, once for every vendor: long randomized
//! back-to-back sequences, generations wrapping, fail-closed protocol errors (mismatched calls,
//! mismatched lane splits, a rank that never arrives, a call after the peer closed) and the
//! fused tree kernel (hardware and software arithmetic) against `fixed-tree`.
//!
//! [`gpu_suite!`](crate::gpu_suite) expands to one `#[test]` per case for a vendor; each case
//! prints "skipped: no `<runtime>` device (...)" and returns without a GPU. All ranks are threads
//! on device 0.
use crate::{DevBuf, GpuRank, TestGpu, TreeLaunch, gpu, gpu_lock, raw_stream, run_ranks};
use collective_core::conformance::data::{compare, finite_values, reference_reduce, special_values};
use collective_core::conformance::faults;
use collective_core::conformance::sequence::{self, seed};
use collective_core::{Collective, DType, Error, Io, Op, RawMut, RawRef, RouteTable, SizeRoutes};
use detcoll_protocol::IpcConfig;
use ipc_engine::{Device, IpcCollective};
use std::time::{Duration, Instant};

/// Expands to one `#[test]` per case of [`crate::cases`] for the vendor type `$gpu` (a
/// [`TestGpu`]), under the names the vendors' `tests/gpu.rs` have always used.
///
/// ```ignore
/// gpu_conformance::gpu_suite!(common::Cuda);
/// ```
#[macro_export]
macro_rules! gpu_suite {
    ($gpu:ty) => {
        /// 10,000 randomized calls (DETCOLL_RANDOM_CALLS) back to back, every output bit-exact
        /// against `fixed-tree`; the eight ranks are threads sharing one device, each
        /// enqueuing on its own (the engine's lockstep orders the launches).
        #[test]
        fn randomized_back_to_back_world8() {
            $crate::cases::randomized::<$gpu>(8, $crate::cases::random_calls(), 64 << 10);
        }
        /// A fifth of the world-8 run's calls at world 2.
        #[test]
        fn randomized_back_to_back_world2() {
            $crate::cases::randomized::<$gpu>(2, $crate::cases::random_calls() / 5, 64 << 10);
        }
        #[test]
        fn generations_wrap_without_corrupt_flags() {
            $crate::cases::generations_wrap::<$gpu>();
        }
        #[test]
        fn mismatched_counts_fail_with_signature_mismatch() {
            $crate::cases::mismatch::<$gpu>(100, 101);
        }
        /// 400 B vs 256 KiB: the ranks launch different block counts.
        #[test]
        fn mismatched_grids_fail_with_signature_mismatch_not_timeout() {
            $crate::cases::mismatch::<$gpu>(100, 1 << 16);
        }
        #[test]
        fn mismatched_lane_splits_fail_with_signature_mismatch() {
            $crate::cases::lane_split_mismatch::<$gpu>();
        }
        #[test]
        fn a_call_after_the_peer_closed_fails_at_once() {
            $crate::cases::peer_closed::<$gpu>();
        }
        #[test]
        fn absent_rank_times_out_and_poisons() {
            $crate::cases::absent_rank::<$gpu>();
        }
        #[test]
        fn an_abandoned_rank_fails_its_peer_at_once() {
            $crate::cases::abandoned_rank::<$gpu>();
        }
        #[test]
        fn fused_tree_matches_fixed_tree_hard_and_soft() {
            $crate::cases::fused_tree::<$gpu>();
        }
    };
}

/// DETCOLL_RANDOM_CALLS (default 10,000): the world-8 run's calls.
pub fn random_calls() -> usize {
    sequence::random_calls()
}

/// `n` elements of `dtype` of `b` from element `off`, as an input view.
pub fn in_view(b: &DevBuf, off: usize, n: usize, d: DType) -> RawRef<'static> {
    assert!((off + n) * d.size() <= b.len, "view out of bounds");
    // SAFETY: in bounds of a test buffer that outlives every call enqueued on it (each test
    // synchronises its stream before the region is freed).
    unsafe { RawRef::from_raw(b.ptr + (off * d.size()) as u64, n, d) }
}

/// As [`in_view`], writable; each output region is written by one call at a time.
pub fn out_view(b: &DevBuf, off: usize, n: usize, d: DType) -> RawMut<'static> {
    assert!((off + n) * d.size() <= b.len, "view out of bounds");
    // SAFETY: as above.
    unsafe { RawMut::from_raw(b.ptr + (off * d.size()) as u64, n, d) }
}

/// `n` elements of `dtype` from `input` into `output`, out of place.
pub fn io(input: &DevBuf, output: &DevBuf, n: usize, d: DType) -> Io<'static> {
    Io::OutOfPlace { input: in_view(input, 0, n, d), output: out_view(output, 0, n, d) }
}

/// `world` ranks as threads sharing `device`.
fn group<G: TestGpu>(device: &G::Device, world: usize, config: &IpcConfig) -> Vec<IpcCollective<G::Device>> {
    IpcCollective::group_on(device, world, config).expect("group")
}

// ---------------------------------------------------------------------------------------------
// Randomized back-to-back calls.
// ---------------------------------------------------------------------------------------------

/// A failed call, with the device error record's generation and observed flag word.
fn failure<G: TestGpu>(rank: &GpuRank<G>, i: usize, c: &sequence::Call, e: &Error) -> String {
    let rec = rank.comm.error_record().unwrap_or_default();
    format!(
        "call {i} {c:?}: {e} [record: code {} peer {} at generation {}, observed flag generation {} digest {:#x}]",
        rec[0],
        rec[1],
        rec[2],
        rec[3] >> 32,
        rec[3] & 0xffff_ffff
    )
}

/// `total` randomized calls ([`sequence::plan`]) at world `world` with `capacity` bytes of
/// staging, in batches of 500 enqueued back to back, every output bit-exact against
/// `fixed-tree`. Every rank is a thread on device 0 enqueuing on its own (the engine's lockstep
/// orders the launches); the knobs are `sequence`'s `DETCOLL_RANDOM_*`.
pub fn randomized<G: TestGpu>(world: usize, total: usize, capacity: usize) {
    let Some(device) = gpu::<G>() else { return };
    let _l = gpu_lock();
    let config = detcoll_protocol::suite::random_config(capacity);
    let comms = group::<G>(&device, world, &config);
    let host_inputs = sequence::inputs(world, capacity);
    let batch = 500;
    // Every rank a thread on `device`, sharing its queues: the engine's lockstep launches each
    // call of all ranks together, so the ranks enqueue independently (no turns of our own,
    // which would wait for the lockstep's peers) and the whole batch may be in flight.
    let in_flight = sequence::random_in_flight(true);
    println!(
        "world {world}: {total} calls, batches of {batch}, at most {in_flight} in flight per rank (0 = all), engine lockstep"
    );
    let (batches, arena_bytes) = sequence::plan(total, batch, world, capacity);
    // In-place setup copies in the middle of a batch go through a kernel (the 1-leaf tree),
    // never a runtime copy: a copy queued behind a pending collective can block a peer's copies
    // (see `GpuRank::upload`). Loaded before any rank starts (loading can synchronise).
    device.load_tree(1).expect("kernels");
    let started = Instant::now();
    let r = run_ranks::<G, _>(comms, G::REGION_BYTES, |rank| {
        let me = rank.comm.rank();
        let dev_inputs: Vec<DevBuf> = host_inputs.iter().map(|per_rank| rank.put(&per_rank[me])).collect();
        let arena = rank.alloc_dev(arena_bytes);
        rank.barrier()?;
        let raw = raw_stream::<G>(rank.comm.device(), &rank.stream).map_err(|e| e.to_string())?;
        let mut done = 0;
        for calls in &batches {
            // Enqueue the batch back to back, with at most `in_flight` calls queued per rank
            // before a stream sync (DETCOLL_RANDOM_INFLIGHT; 0 = the whole batch).
            let sync = |i| G::synchronize(&rank.stream).map_err(|e| format!("sync before call {i}: {e}"));
            sequence::enqueue_batch(calls, done, world, me, in_flight, None, sync, |i, c| {
                let copy = |src: u64, dst: u64, n: usize, d: DType| {
                    // SAFETY: copy of `n` elements inside live test buffers, on the rank's stream.
                    unsafe { rank.comm.device().tree(&[src], dst, n, d, raw) }
                };
                // SAFETY: the rank's input buffers and arena live until after the batch is checked.
                let r = unsafe {
                    sequence::enqueue(&rank.comm, rank.stream(), c, dev_inputs[c.dtype as usize].ptr, arena.ptr, copy)
                };
                r.map_err(|e| failure(rank, i, c, &e))
            })?;
            let got = rank.download(arena.ptr, arena.len);
            rank.comm.check().map_err(|e| format!("after batch at call {done}: {e}"))?;
            sequence::check_batch(&got, calls, &host_inputs, world, me, done)?;
            done += calls.len();
        }
        Ok(())
    });
    r.expect("randomized sequence");
    println!("{total} randomized calls at world {world} verified in {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// Generation wrap.
// ---------------------------------------------------------------------------------------------

/// The device generation counter started just below 2^31 + a few and just below 2^32 (the
/// hook leaves the phase-2 flags at their construction value, as a protocol that never
/// refreshed them would after that many one-shot calls): ten calls cycling through the
/// one-shot, RS+AG, LL push (an all_gather) and bulk push routes, every output bit-exact, nothing
/// recorded (a stale phase-2 flag would read as Corrupt after 2^31 calls without the kernels'
/// refresh of the flags a call does not use).
pub fn generations_wrap<G: TestGpu>() {
    let Some(device) = gpu::<G>() else { return };
    let _l = gpu_lock();
    let world = 2;
    for start in [(1u32 << 31) + 5, u32::MAX - 3] {
        let routes = SizeRoutes { ll_up_to: Some(2 << 10), bulk_from: Some(128 << 10), rsag_from: Some(16 << 10) };
        let config = IpcConfig::new(1 << 20).with_routes(RouteTable::by_size(routes));
        let comms = group::<G>(&device, world, &config);
        for c in &comms {
            c.start_generation_for_test(start).expect("hook");
        }
        // (op, elements per rank): 4 KiB one-shot, 64 KiB RS+AG, 2 KiB all_gather (LL push),
        // 256 KiB bulk push.
        let calls: Vec<(Op, usize)> = (0..10)
            .map(|i| match i % 4 {
                0 => (Op::AllReduce, 1024),
                1 => (Op::AllReduce, 16 << 10),
                2 => (Op::AllGather, 512),
                _ => (Op::AllReduce, 64 << 10),
            })
            .collect();
        let inputs: Vec<Vec<Vec<u8>>> = calls
            .iter()
            .enumerate()
            .map(|(i, &(_, n))| (0..world).map(|r| finite_values(DType::F32, n, (i * 8 + r) as u64)).collect())
            .collect();
        let r = run_ranks::<G, _>(comms, G::REGION_BYTES, |rank| {
            let me = rank.comm.rank();
            rank.barrier()?;
            for (i, &(op, n)) in calls.iter().enumerate() {
                let input = rank.put(&inputs[i][me]);
                let out_n = if op == Op::AllGather { n * world } else { n };
                let output = rank.alloc_dev(out_n * 4);
                let io = Io::OutOfPlace {
                    input: in_view(&input, 0, n, DType::F32),
                    output: out_view(&output, 0, out_n, DType::F32),
                };
                let route = rank.comm.route(op, n * 4);
                let s = rank.stream();
                let r = if op == Op::AllGather { rank.comm.all_gather(io, s) } else { rank.comm.all_reduce(io, s) };
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

/// Runs `f` on both ranks of a world of two threads on device 0 with the fault tests'
/// configuration ([`detcoll_protocol::suite::fault_config`], `bound` on every wait for a peer); `Ok` after printing
/// the skip without a device.
fn two_ranks<G, F>(bound: Duration, f: F) -> Result<(), String>
where
    G: TestGpu,
    F: Fn(&mut GpuRank<G>) -> Result<(), String> + Sync,
{
    let Some(device) = gpu::<G>() else { return Ok(()) };
    let _l = gpu_lock();
    let comms = group::<G>(&device, 2, &detcoll_protocol::suite::fault_config(bound));
    run_ranks::<G, _>(comms, G::REGION_BYTES, f)
}

/// Rank 0 reduces `n0` f32, rank 1 `n1`: both must report SignatureMismatch long before the
/// timeout, then be poisoned.
pub fn mismatch<G: TestGpu>(n0: usize, n1: usize) {
    let bound = Duration::from_secs(8);
    let r = two_ranks::<G, _>(bound, |rank| {
        let me = rank.comm.rank();
        let n = if me == 0 { n0 } else { n1 };
        let input = rank.put(&finite_values(DType::F32, n, 1));
        let output = rank.alloc_dev(n * 4);
        rank.barrier()?;
        let s = rank.stream();
        let t = Instant::now();
        rank.comm.all_reduce(io(&input, &output, n, DType::F32), s).map_err(|e| e.to_string())?;
        G::synchronize(&rank.stream)?;
        let waited = t.elapsed();
        let again = || rank.comm.all_reduce(io(&input, &output, n, DType::F32), s);
        faults::expect_mismatch(me, [n0, n1], waited, bound, rank.comm.check(), again)?;
        println!("rank {me}: mismatch reported after {waited:?}");
        Ok(())
    });
    r.expect("mismatch");
}

/// `reduce_scatter_many` with lanes `[4w, 8w]` on rank 0 and `[8w, 4w]` on rank 1 (same total):
/// the kernels compare the published signature, which carries the lane split, so both ranks
/// report SignatureMismatch, write nothing and are poisoned.
pub fn lane_split_mismatch<G: TestGpu>() {
    let bound = Duration::from_secs(8);
    let r = two_ranks::<G, _>(bound, |rank| {
        let me = rank.comm.rank();
        let counts = faults::split_lanes(me, 2);
        let sentinel = vec![0xA5u8; counts.iter().sum::<usize>() / 2 * 4];
        let inputs: Vec<DevBuf> = counts.iter().map(|&n| rank.put(&finite_values(DType::F32, n, 7))).collect();
        let outputs: Vec<DevBuf> = counts.iter().map(|&n| rank.put(&sentinel[..n / 2 * 4])).collect();
        let lanes = |k: usize| Io::OutOfPlace {
            input: in_view(&inputs[k], 0, counts[k], DType::F32),
            output: out_view(&outputs[k], 0, counts[k] / 2, DType::F32),
        };
        rank.barrier()?;
        let s = rank.stream();
        let t = Instant::now();
        let called = rank.comm.reduce_scatter_many(&[lanes(0), lanes(1)], s);
        G::synchronize(&rank.stream)?;
        let waited = t.elapsed();
        let outcome = called.and_then(|()| rank.comm.check());
        let untouched =
            (0..2).all(|k| rank.download(outputs[k].ptr, counts[k] / 2 * 4) == sentinel[..counts[k] / 2 * 4]);
        let again = || rank.comm.reduce_scatter_many(&[lanes(0)], s);
        faults::expect_split_mismatch(me, waited, bound, outcome, untouched, again)?;
        println!("rank {me}: lane-split mismatch reported after {waited:?}");
        Ok(())
    });
    r.expect("lane-split mismatch");
}

/// One all_reduce of `io` on the rank's stream, then the stream synchronised: the call's
/// outcome (its own error, else the one its kernel recorded) and how long it took.
fn synchronized_all_reduce<G: TestGpu>(rank: &GpuRank<G>, io: Io<'_>) -> Result<(Result<(), Error>, Duration), String> {
    let t = Instant::now();
    let called = rank.comm.all_reduce(io, rank.stream());
    G::synchronize(&rank.stream)?;
    Ok((called.and_then(|()| rank.comm.check()), t.elapsed()))
}

/// Rank 1 closes its handle; rank 0's next call fails with PeerClosed naming it at once (the
/// kernel sees rank 1's close acknowledgement in its own control block), not after the
/// timeout, and is poisoned.
pub fn peer_closed<G: TestGpu>() {
    let bound = Duration::from_secs(20);
    let r = two_ranks::<G, _>(bound, |rank| {
        let me = rank.comm.rank();
        let n = 1024;
        let input = rank.put(&finite_values(DType::F32, n, 3));
        let output = rank.alloc_dev(n * 4);
        rank.barrier()?;
        if me == 1 {
            rank.comm.close().map_err(|e| format!("close: {e}"))?;
            rank.barrier()?;
            return Ok(());
        }
        rank.barrier()?;
        let s = rank.stream();
        let (outcome, waited) = synchronized_all_reduce(rank, io(&input, &output, n, DType::F32))?;
        match outcome {
            Err(Error::PeerClosed { peer: 1, .. }) => {}
            other => return Err(format!("expected PeerClosed from rank 1, got {other:?}")),
        }
        if waited > bound / 4 {
            return Err(format!("PeerClosed took {waited:?} (bound {bound:?})"));
        }
        match rank.comm.all_reduce(io(&input, &output, n, DType::F32), s) {
            Err(Error::Poisoned { .. }) => Ok(()),
            other => Err(format!("expected Poisoned after PeerClosed, got {other:?}")),
        }
    });
    r.expect("peer closed");
}

/// Rank 1 never calls: rank 0's call ends after the peer timeout (and within ten times it) as
/// PeerTimeout naming rank 1 — returned by the call itself (the lockstep of ranks sharing the
/// GPU waits for rank 1 before launching) or by `check` after the stream (a kernel's wait) —
/// later calls are refused as poisoned, and rank 1 itself stays healthy.
pub fn absent_rank<G: TestGpu>() {
    let bound = Duration::from_millis(300);
    let r = two_ranks::<G, _>(bound, |rank| {
        if rank.comm.rank() == 1 {
            // Never arrives; its own state stays healthy. It keeps its handle open until rank
            // 0 has timed out: a closed handle would fail rank 0 at once with PeerClosed.
            std::thread::sleep(Duration::from_millis(50));
            let healthy = rank.comm.check().map_err(|e| format!("the absent rank is not poisoned itself: {e}"));
            std::thread::sleep(bound * 4);
            return healthy;
        }
        let n = 4096;
        let input = rank.put(&finite_values(DType::BF16, n, 2));
        let output = rank.alloc_dev(n * 2);
        let s = rank.stream();
        let t = Instant::now();
        let called = rank.comm.all_reduce(io(&input, &output, n, DType::BF16), s);
        G::synchronize(&rank.stream)?;
        let waited = t.elapsed();
        let again = || rank.comm.all_reduce(io(&input, &output, n, DType::BF16), s);
        let cause = faults::expect_timeout(waited, bound, called.and_then(|()| rank.comm.check()), again)?;
        println!("rank 0: timed out after {waited:?}; later call: poisoned ({cause})");
        Ok(())
    });
    r.expect("timeout");
}

/// Rank 1 abandons its handle (`Collective::abandon`: a collective composed of it failed
/// elsewhere) while rank 0 calls: rank 0's call fails long before the bound — `Poisoned`
/// naming rank 1 from the lockstep of ranks sharing the GPU (these ranks), `PeerFailed` from
/// a kernel's wait where ranks have GPUs or processes of their own — never `Ok`; both ranks'
/// later calls are refused as poisoned, rank 1's with its cause.
pub fn abandoned_rank<G: TestGpu>() {
    let bound = Duration::from_secs(8);
    let r = two_ranks::<G, _>(bound, |rank| {
        let n = 4096;
        let input = rank.put(&finite_values(DType::BF16, n, 2));
        let output = rank.alloc_dev(n * 2);
        let s = rank.stream();
        let again = || rank.comm.all_reduce(io(&input, &output, n, DType::BF16), s);
        if rank.comm.rank() == 1 {
            std::thread::sleep(Duration::from_millis(100));
            rank.comm.abandon("the test's other group failed");
            return match again() {
                Err(Error::Poisoned { cause }) if cause.contains("other group failed") => Ok(()),
                other => Err(format!("rank 1 after abandon: expected Poisoned with its cause, got {other:?}")),
            };
        }
        let (outcome, waited) = synchronized_all_reduce(rank, io(&input, &output, n, DType::BF16))?;
        match outcome {
            Err(Error::PeerFailed { peer: 1, .. }) => {}
            Err(Error::Poisoned { cause }) if cause.contains("rank 1") => {}
            other => return Err(format!("rank 0: expected PeerFailed or Poisoned naming rank 1, got {other:?}")),
        }
        if waited > bound / 2 {
            return Err(format!("rank 0 waited {waited:?} for the abandoned rank (bound {bound:?})"));
        }
        match again() {
            Err(Error::Poisoned { .. }) => {}
            other => return Err(format!("rank 0's next call: expected Poisoned, got {other:?}")),
        }
        println!("rank 0: failed after {waited:?} when rank 1 abandoned");
        Ok(())
    });
    r.expect("abandoned rank");
}

// ---------------------------------------------------------------------------------------------
// The fused tree kernel, hardware and software arithmetic.
// ---------------------------------------------------------------------------------------------

/// How the W leaves lie in their one (stacked) allocation.
#[derive(Debug, Clone, Copy)]
pub struct Layout {
    /// Element offset of every leaf from its slot, and of the output from its allocation.
    pub in_off: usize,
    pub out_off: usize,
    /// Leaves back to back (`n` elements apart, as a gathered buffer holds them: leaf starts of
    /// mixed alignment) rather than in 256-byte aligned slots.
    pub packed: bool,
}

/// The layouts every (W, dtype, values, arithmetic) runs in.
pub const LAYOUTS: [Layout; 4] = [
    // Aligned: the 16-byte vector path.
    Layout { in_off: 0, out_off: 0, packed: false },
    // Co-aligned but not 16-byte aligned: a scalar head, then vectors.
    Layout { in_off: 1, out_off: 1, packed: false },
    // Not co-aligned: all scalar.
    Layout { in_off: 0, out_off: 1, packed: false },
    // Stacked back to back.
    Layout { in_off: 0, out_off: 0, packed: true },
];

/// One launch of `tree` over `leaves` laid out as `at` says, in the hardware or (`soft`) the
/// software arithmetic; the output's bytes (its allocation zeroed first, so a launch that
/// writes nothing cannot pass).
#[allow(clippy::too_many_arguments)] // the case's coordinates, one for one
fn tree_once<G: TestGpu>(
    device: &G::Device,
    tree: &G::Tree,
    s: &G::Stream,
    leaves: &[Vec<u8>],
    n: usize,
    d: DType,
    at: Layout,
    soft: bool,
) -> Result<Vec<u8>, String> {
    let size = d.size();
    let slot = if at.packed { n * size } else { ((at.in_off + n) * size).div_ceil(256) * 256 };
    let mut stacked = vec![0u8; slot * leaves.len() + at.in_off * size];
    for (i, l) in leaves.iter().enumerate() {
        let o = i * slot + at.in_off * size;
        stacked[o..o + l.len()].copy_from_slice(l);
    }
    let e = |e: Error| e.to_string();
    let leaves_mem = device.alloc(stacked.len()).map_err(e)?;
    let base = device.address(&leaves_mem);
    G::upload(s, base, &stacked)?;
    let inputs: Vec<u64> = (0..leaves.len()).map(|i| base + (i * slot + at.in_off * size) as u64).collect();
    let out_bytes = (n + at.out_off) * size;
    let out_mem = device.alloc(out_bytes).map_err(e)?;
    let out = device.address(&out_mem);
    G::upload(s, out, &vec![0u8; out_bytes])?;
    let launch = TreeLaunch { inputs: &inputs, out: out + (at.out_off * size) as u64, count: n, dtype: d, soft };
    // SAFETY: every leaf and the output hold the `n` elements the kernel touches; the stream is
    // the tree's device's and is drained (below) before the allocations are freed.
    unsafe { G::launch_tree(tree, &launch, s) }.map_err(e)?;
    G::synchronize(s)?;
    let mut got = vec![0u8; out_bytes];
    G::download(s, out, &mut got)?;
    got.drain(..at.out_off * size);
    Ok(got)
}

/// W = 1/2/4/8 leaves, f32/f16/bf16, finite and special values, aligned, unaligned and stacked
/// layouts ([`LAYOUTS`]), the hardware arithmetic and the software path: bit-exact against
/// `fixed-tree`.
pub fn fused_tree<G: TestGpu>() {
    let Some(device) = gpu::<G>() else { return };
    let _l = gpu_lock();
    let tree = G::tree(&device).expect("kernels");
    let s = G::new_stream(&device).expect("stream");
    // Several vector tiles per block and a scalar tail.
    let n = 16 * 16 * 16 * 8 + 5;
    let mut failures = Vec::new();
    for w in [1usize, 2, 4, 8] {
        for d in DType::REDUCIBLE {
            for special in [true, false] {
                let leaves: Vec<Vec<u8>> = (0..w)
                    .map(|r| if special { special_values(d, n, r) } else { finite_values(d, n, seed(w, r)) })
                    .collect();
                let want = reference_reduce(&leaves, d);
                for at in LAYOUTS {
                    for soft in [false, true] {
                        let got = tree_once::<G>(&device, &tree, &s, &leaves, n, d, at, soft).expect("launch");
                        if let Err(e) = compare(&got, &want, d) {
                            failures.push(format!("W={w} {d} special={special} soft={soft} {at:?}: {e}"));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
