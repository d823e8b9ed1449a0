//! The transport's GPU behaviour beyond the conformance suite, on any [`Gpu`] (the test files
//! instantiate them with `gpu_tests!`):
//!
//! * the transport's local tree (W stacked inputs, the workspace layout an all_gather leaves)
//!   bit-exact vs `fixed-tree` for W = 2/4/8, f32/f16/bf16, aligned, unaligned and
//!   non-co-aligned layouts, finite and special values (needs only the GPU runtime);
//! * world 1 through the library (`ncclCommInitRank` with one rank): every op and every
//!   exchange mode bit-exact vs `fixed-tree`, calls alternating between streams, workspace
//!   reporting, bounded synchronize, close, and the non-strict native reference;
//! * world 2 (two GPUs): the transport watchdog aborts a call the peer never makes, so the
//!   caller's own stream synchronize returns, and poisons the collective; healthy calls before
//!   it are untouched and both ranks close within bounds.
//!
//! Each returns after printing a skip when the GPU (or the library) is missing.
use super::{Gpu, Rank, SYNC_BOUND, gpu, gpu_lock, library_devices, upload, world1};
use ccl_transport::{Device, TransportCollective, TransportConfig, Watchdog};
use collective_core::Timeouts;
use collective_core::bootstrap::LocalBootstrap;
use collective_core::conformance::data::{compare, finite_values, reference_reduce, special_values};
use collective_core::{Collective, DType, Error, Io, Op, RawMut, RawRef};
use std::borrow::Borrow;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

fn seed(a: usize, b: usize) -> u64 {
    (a as u64) << 24 ^ (b as u64) << 8 ^ 0xCC1
}

// ---------------------------------------------------------------------------------------------
// The local tree over stacked inputs.
// ---------------------------------------------------------------------------------------------

/// The tree the transport launches after each gather, bit-exact vs `fixed-tree` and writing
/// nothing outside its output.
pub fn stacked_tree_matches_fixed_tree<G: Gpu>() {
    let Some(gpu) = gpu::<G>() else { return };
    let _l = gpu_lock();
    let dev = gpu.tree_device().expect("tree kernel");
    let s = gpu.stream().expect("stream");
    let raw = dev.raw_stream(s.borrow()).expect("the stream is on the device");
    let mut failures = Vec::new();
    for w in [2usize, 4, 8] {
        for d in DType::REDUCIBLE {
            let size = d.size();
            for n in [4096usize, 16 * 16 * 16 * 8 + 5, 1, 7] {
                for special in [false, true] {
                    let leaves: Vec<Vec<u8>> = (0..w)
                        .map(|r| if special { special_values(d, n, r) } else { finite_values(d, n, seed(w * n, r)) })
                        .collect();
                    let want = reference_reduce(&leaves, d);
                    // (element offset of the stack, padding elements between inputs, output
                    // element offset): vector path, co-aligned scalar head, strides that break
                    // co-alignment, and an output that is not co-aligned at all.
                    for (base_off, pad, out_off) in
                        [(0usize, 0usize, 0usize), (1, 0, 1), (0, 1, 0), (0, 0, 1), (3, 5, 3)]
                    {
                        let stride = (n + pad) * size;
                        let mut stack = vec![0x5Au8; base_off * size + w * stride];
                        for (q, leaf) in leaves.iter().enumerate() {
                            stack[base_off * size + q * stride..][..n * size].copy_from_slice(leaf);
                        }
                        let stack = upload::<G>(&s, &stack);
                        let out = upload::<G>(&s, &vec![0xA5u8; (n + out_off + 8) * size]);
                        let first = G::addr(&s, &stack) + (base_off * size) as u64;
                        let o = G::addr(&s, &out) + (out_off * size) as u64;
                        // SAFETY: the stack holds `w` inputs of `n` elements `stride` bytes apart;
                        // the output holds `n` elements after its offset; both live until read.
                        unsafe { dev.tree_stacked(first, stride, w, o, n, d, raw) }.expect("launch");
                        let got = G::read(&s, &out);
                        let label = format!("W={w} {d} n={n} special={special} layout=({base_off},{pad},{out_off})");
                        if let Err(e) = compare(&got[out_off * size..(out_off + n) * size], &want, d) {
                            failures.push(format!("{label}: {e}"));
                        }
                        let guards_ok =
                            got[..out_off * size].iter().chain(&got[(out_off + n) * size..]).all(|&b| b == 0xA5);
                        if !guards_ok {
                            failures.push(format!("{label}: wrote outside the output"));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// World 1 through the library.
// ---------------------------------------------------------------------------------------------

/// GPU 0 and a stream on it, when the library loads too.
fn setup<G: Gpu>() -> Option<(G, G::Stream)> {
    library_devices::<G>()?;
    let gpu = G::open(0)?;
    let stream = gpu.stream().expect("stream");
    Some((gpu, stream))
}

/// An out-of-place call's views: `n` elements of `d` at device addresses `input` and `output`.
///
/// # Safety
/// Both ranges hold `n` elements of `d` and outlive the call the views are passed to.
unsafe fn out_of_place<'a>(input: u64, output: u64, n: usize, d: DType) -> Io<'a> {
    // SAFETY: forwarded from the caller.
    unsafe { Io::OutOfPlace { input: RawRef::from_raw(input, n, d), output: RawMut::from_raw(output, n, d) } }
}

/// Runs one out-of-place or in-place single-lane call and returns the output bytes.
fn call_once<G: Gpu>(
    t: &TransportCollective<G::Dev>,
    s: &G::Stream,
    op: Op,
    d: DType,
    input: &[u8],
    in_place: bool,
    out_off: usize,
) -> Vec<u8> {
    let size = d.size();
    let n = input.len() / size;
    // World 1: every op's output has the input's length.
    let lo = out_off * size;
    if in_place {
        let buf = upload::<G>(s, &[vec![0xA5u8; lo], input.to_vec()].concat());
        // SAFETY: the buffer lives until the call has been read back below.
        let io = Io::InPlace(unsafe { RawMut::from_raw(G::addr(s, &buf) + lo as u64, n, d) });
        run(t, s.borrow(), op, io);
        t.synchronize(s.borrow(), SYNC_BOUND).expect("synchronize");
        let got = G::read(s, &buf);
        assert!(got[..lo].iter().all(|&b| b == 0xA5), "{op:?} wrote before its buffer");
        got[lo..].to_vec()
    } else {
        let inp = upload::<G>(s, input);
        let out = upload::<G>(s, &vec![0xA5u8; lo + n * size + 64]);
        // SAFETY: both buffers live until the call has been read back below.
        let io = unsafe { out_of_place(G::addr(s, &inp), G::addr(s, &out) + lo as u64, n, d) };
        run(t, s.borrow(), op, io);
        t.synchronize(s.borrow(), SYNC_BOUND).expect("synchronize");
        let got = G::read(s, &out);
        assert!(got[..lo].iter().chain(&got[lo + n * size..]).all(|&b| b == 0xA5), "{op:?} wrote outside its output");
        assert_eq!(G::read(s, &inp), input, "{op:?} modified its input");
        got[lo..lo + n * size].to_vec()
    }
}

fn run<D: Device>(t: &TransportCollective<D>, s: &D::Stream, op: Op, io: Io<'_>) {
    let r = match op {
        Op::AllReduce => t.all_reduce(io, s),
        Op::AllGather => t.all_gather(io, s),
        Op::ReduceScatter => t.reduce_scatter(io, s),
        Op::ReduceScatterMany => t.reduce_scatter_many(&[io], s),
    };
    r.unwrap_or_else(|e| panic!("{op:?}: {e}"));
}

/// Every op, dtype, size, in place and not, at offsets, in every exchange mode and blocking.
pub fn world1_single_lane_ops<G: Gpu>() {
    let Some((gpu, stream)) = setup::<G>() else { return };
    let _l = gpu_lock();
    let blocking = TransportConfig::default().with_blocking(true);
    for config in [TransportConfig::default(), TransportConfig::default().with_all_to_all_threshold(0), blocking] {
        let t = world1(&gpu, &config);
        assert_eq!(t.route(Op::AllReduce, 1 << 20), collective_core::Route::Transport);
        assert!(!t.capabilities().supports_graph_capture && t.capabilities().strict_fixed_order);
        let mut failures = Vec::new();
        for d in DType::REDUCIBLE {
            for n in [1usize, 7, 1000, 4099, (1 << 20) + 3] {
                for special in [false, true] {
                    let input = if special { special_values(d, n, 0) } else { finite_values(d, n, seed(n, 1)) };
                    // World 1: the tree over one rank is the input itself (reference_reduce of
                    // one leaf), gather is the input; still every byte went through the library
                    // and the tree kernel.
                    let want = reference_reduce(std::slice::from_ref(&input), d);
                    for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::ReduceScatterMany] {
                        for (in_place, off) in [(false, 0usize), (true, 0), (false, 3), (true, 1)] {
                            let got = call_once::<G>(&t, &stream, op, d, &input, in_place, off);
                            if let Err(e) = compare(&got, &want, d) {
                                failures.push(format!(
                                    "{op:?} {d} n={n} special={special} in_place={in_place} off={off}: {e}"
                                ));
                            }
                        }
                    }
                }
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
        t.close().expect("close");
    }
}

/// reduce_scatter_many packed into one exchange and lane by lane, in place and not, with an
/// empty lane.
pub fn world1_reduce_scatter_many<G: Gpu>() {
    let Some((gpu, s)) = setup::<G>() else { return };
    let _l = gpu_lock();
    for pack in [0usize, usize::MAX] {
        let t = world1(&gpu, &TransportConfig::default().with_pack_threshold(pack));
        for d in DType::REDUCIBLE {
            let size = d.size();
            let lanes: Vec<Vec<u8>> = [3usize, 1000, 0, 65536 + 1]
                .iter()
                .enumerate()
                .map(|(l, &n)| if l == 1 { special_values(d, n, 0) } else { finite_values(d, n, seed(l, n)) })
                .collect();
            let ins: Vec<G::Mem> = lanes.iter().map(|l| upload::<G>(&s, l)).collect();
            let outs: Vec<G::Mem> = lanes.iter().map(|l| upload::<G>(&s, &vec![0xA5u8; l.len() + 2 * size])).collect();
            // Lane 0 in place, the others out of place with an odd output offset.
            // SAFETY: all buffers live until read back below.
            let ios: Vec<Io<'_>> = lanes
                .iter()
                .enumerate()
                .map(|(l, lane)| unsafe {
                    let n = lane.len() / size;
                    if l == 0 {
                        Io::InPlace(RawMut::from_raw(G::addr(&s, &ins[0]), n, d))
                    } else {
                        out_of_place(G::addr(&s, &ins[l]), G::addr(&s, &outs[l]) + size as u64, n, d)
                    }
                })
                .collect();
            t.reduce_scatter_many(&ios, s.borrow()).expect("reduce_scatter_many");
            t.synchronize(s.borrow(), SYNC_BOUND).expect("synchronize");
            for (l, lane) in lanes.iter().enumerate() {
                let want = reference_reduce(std::slice::from_ref(lane), d);
                let got =
                    if l == 0 { G::read(&s, &ins[0]) } else { G::read(&s, &outs[l])[size..size + lane.len()].to_vec() };
                compare(&got, &want, d).unwrap_or_else(|e| panic!("pack {pack} {d} lane {l}: {e}"));
            }
        }
        t.close().expect("close");
    }
}

/// Calls alternating between two streams share the workspace safely; the workspace is
/// reported and can be reserved.
pub fn world1_alternating_streams<G: Gpu>() {
    let Some((gpu, stream)) = setup::<G>() else { return };
    let _l = gpu_lock();
    let t = world1(&gpu, &TransportConfig::default());
    let other = gpu.stream().expect("stream");
    let d = DType::BF16;
    let n = 4 << 20;
    let inputs: Vec<Vec<u8>> = (0..6).map(|i| finite_values(d, n, seed(i, 9))).collect();
    let bufs: Vec<(G::Mem, G::Mem)> =
        inputs.iter().map(|x| (upload::<G>(&stream, x), upload::<G>(&stream, &vec![0u8; x.len()]))).collect();
    G::synchronize(&stream);
    for (i, (inp, out)) in bufs.iter().enumerate() {
        let s = if i % 2 == 0 { &stream } else { &other };
        // SAFETY: buffers live until read back below.
        let io = unsafe { out_of_place(G::addr(s, inp), G::addr(s, out), n, d) };
        t.all_reduce(io, s.borrow()).expect("all_reduce");
    }
    t.synchronize(stream.borrow(), SYNC_BOUND).expect("sync");
    t.synchronize(other.borrow(), SYNC_BOUND).expect("sync");
    for (i, (_, out)) in bufs.iter().enumerate() {
        compare(&G::read(&stream, out), &inputs[i], d).unwrap_or_else(|e| panic!("call {i}: {e}"));
    }
    assert!(t.workspace_bytes() >= n * d.size(), "workspace {} retained", t.workspace_bytes());
    t.reserve_workspace(64 << 20).expect("reserve");
    assert!(t.workspace_bytes() >= 64 << 20);
    t.close().expect("close");
}

/// Asynchronous-error polling, capacity validation before any device work, and every call
/// after close refused.
pub fn world1_poll_close_and_validation<G: Gpu>() {
    let Some((gpu, s)) = setup::<G>() else { return };
    let _l = gpu_lock();
    let t = world1(&gpu, &TransportConfig::new(1 << 20));
    t.poll_async_error().expect("healthy");
    println!("transport on {} ({}), {} {}", t.library(), t.device().describe(), G::LIBRARY, t.library_version());
    let a = upload::<G>(&s, &vec![0u8; 8 << 20]);
    let at = G::addr(&s, &a);
    // Over capacity: a typed error before any device work; the collective stays usable.
    // SAFETY: the buffer outlives the calls.
    let too_big = unsafe { Io::InPlace(RawMut::from_raw(at, (1 << 20) / 4 + 1, DType::F32)) };
    assert!(matches!(t.all_reduce(too_big, s.borrow()), Err(Error::CapacityExceeded { .. })));
    // all_gather writes into the caller's output and is not bounded by the capacity.
    // SAFETY: as above.
    let gather = unsafe { Io::InPlace(RawMut::from_raw(at, 2 << 20, DType::F32)) };
    t.all_gather(gather, s.borrow()).expect("large all_gather");
    t.synchronize(s.borrow(), SYNC_BOUND).expect("synchronize");
    t.poll_async_error().expect("still healthy");
    t.close().expect("close");
    // SAFETY: as above.
    let io = unsafe { Io::InPlace(RawMut::from_raw(at, 16, DType::F32)) };
    assert!(matches!(t.all_reduce(io, s.borrow()), Err(Error::Closed)));
    assert!(matches!(t.synchronize(s.borrow(), SYNC_BOUND), Err(Error::Closed)));
}

/// The library's own (non-deterministic) reductions run; non-float dtypes are refused.
pub fn world1_nonstrict_native_reference<G: Gpu>() {
    let Some((gpu, s)) = setup::<G>() else { return };
    let _l = gpu_lock();
    let t = world1(&gpu, &TransportConfig::default());
    let d = DType::BF16;
    let n = 4096;
    let x = finite_values(d, n, 5);
    let inp = upload::<G>(&s, &x);
    let out = upload::<G>(&s, &vec![0u8; x.len()]);
    let (i, o) = (G::addr(&s, &inp), G::addr(&s, &out));
    // SAFETY: buffers live until read back.
    t.native_all_reduce(unsafe { out_of_place(i, o, n, d) }, s.borrow()).expect("native all_reduce");
    // SAFETY: as above.
    t.native_reduce_scatter(unsafe { out_of_place(i, o, n, d) }, s.borrow()).expect("native reduce_scatter");
    t.synchronize(s.borrow(), SYNC_BOUND).expect("synchronize");
    // With one rank the native sum is the input; this checks the calls ran, not a contract.
    compare(&G::read(&s, &out), &x, d).expect("world-1 native result");
    // Reductions of non-float dtypes are refused before any work.
    // SAFETY: as above.
    let io = unsafe { Io::InPlace(RawMut::from_raw(i, 16, DType::U8)) };
    assert!(matches!(t.native_all_reduce(io, s.borrow()), Err(Error::UnsupportedDtype { .. })));
    t.close().expect("close");
}

// ---------------------------------------------------------------------------------------------
// World 2: the transport watchdog on a call the peer never makes.
// ---------------------------------------------------------------------------------------------

/// The peer timeout of [`world2_watchdog`]; its watchdog is [`Watchdog::PeerTimeout`], so this
/// is also the watchdog's bound.
const WATCHDOG_PEER_TIMEOUT: Duration = Duration::from_secs(3);
/// What a loaded host may add to a bound before the test calls it a hang.
const HANG_MARGIN: Duration = Duration::from_secs(20);
/// Bound on the calls that must fail at once on a poisoned collective (no device work).
const FAIL_FAST: Duration = Duration::from_secs(1);
/// The all_reduce of [`world2_watchdog`]: bf16, an odd count.
const WD_DTYPE: DType = DType::BF16;
const WD_COUNT: usize = (1 << 16) + 3;

/// The configuration of [`world2_watchdog`]: the watchdog on, bounded by a short peer timeout
/// (set explicitly, so `DETCOLL_TRANSPORT_WATCHDOG` and `DETCOLL_TIMEOUT_MS` do not change the
/// test), non-blocking NCCL (in blocking mode a call blocked inside NCCL keeps the watchdog
/// from aborting; see `ccl_transport::watchdog`).
fn watchdog_config() -> TransportConfig {
    let timeouts = Timeouts { peer: WATCHDOG_PEER_TIMEOUT, close: WATCHDOG_PEER_TIMEOUT };
    TransportConfig::new(1 << 20).with_blocking(false).with_timeouts(timeouts).with_watchdog(Watchdog::PeerTimeout)
}

/// Both ranks' inputs (every rank computes them all, for the reference).
fn watchdog_leaves() -> Vec<Vec<u8>> {
    (0..2).map(|r| finite_values(WD_DTYPE, WD_COUNT, seed(r, 0x3D))).collect()
}

/// One step a rank thread of [`world2_watchdog`] finished (a note) or failed (why), in order.
struct Step {
    name: &'static str,
    outcome: Result<String, String>,
}

/// Sends a step to the test's thread; `Err(())` when it failed (the rank stops there).
fn report(steps: &Sender<Step>, name: &'static str, outcome: Result<String, String>) -> Result<(), ()> {
    let failed = outcome.is_err();
    let _ = steps.send(Step { name, outcome });
    if failed { Err(()) } else { Ok(()) }
}

/// The rank's stream, as the collective takes it.
fn stream_of<G: Gpu>(rank: &Rank<G>) -> &<G::Dev as Device>::Stream {
    rank.stream.borrow()
}

/// Enqueues the out-of-place all_reduce of `inp` into `out` on the rank's stream.
fn all_reduce_bufs<G: Gpu>(rank: &Rank<G>, inp: &G::Mem, out: &G::Mem) -> Result<(), Error> {
    let s = &rank.stream;
    // SAFETY: both buffers hold `WD_COUNT` elements of `WD_DTYPE`; every caller keeps them alive
    // until the rank's stream has executed the call (synchronised) or the call failed.
    let io = unsafe { out_of_place(G::addr(s, inp), G::addr(s, out), WD_COUNT, WD_DTYPE) };
    rank.comm.all_reduce(io, s.borrow())
}

/// A rank of [`world2_watchdog`] with its input and output buffers.
type RankBufs<G> = (Rank<G>, <G as Gpu>::Mem, <G as Gpu>::Mem);

/// Rank `r` on GPU `r`: its collective, its stream and buffers, and a first healthy all_reduce
/// checked bit for bit against `fixed-tree`.
fn watchdog_rank<G: Gpu>(r: usize, boot: &LocalBootstrap, config: &TransportConfig) -> Result<RankBufs<G>, String> {
    let gpu = G::open(r).ok_or_else(|| format!("{} device {r} cannot be opened", G::RUNTIME))?;
    let comm = gpu.transport(boot, config).map_err(|e| format!("world-2 {} transport: {e}", G::LIBRARY))?;
    let stream = gpu.stream()?;
    let leaves = watchdog_leaves();
    let inp = upload::<G>(&stream, &leaves[r]);
    let out = upload::<G>(&stream, &vec![0xA5u8; leaves[r].len()]);
    let rank = Rank { comm, stream };
    all_reduce_bufs(&rank, &inp, &out).map_err(|e| format!("healthy all_reduce: {e}"))?;
    rank.comm.synchronize(stream_of(&rank), SYNC_BOUND).map_err(|e| format!("healthy synchronize: {e}"))?;
    compare(&G::read(&rank.stream, &out), &reference_reduce(&leaves, WD_DTYPE), WD_DTYPE)
        .map_err(|e| format!("healthy all_reduce vs fixed-tree: {e}"))?;
    rank.comm.poll_async_error().map_err(|e| format!("after the healthy all_reduce: {e}"))?;
    Ok((rank, inp, out))
}

/// Rank 0: the healthy call, then (on `go`) an all_reduce rank 1 never makes, its own stream
/// synchronize, the poisoned collective, close.
fn watchdog_rank0<G: Gpu>(
    boot: LocalBootstrap,
    config: TransportConfig,
    steps: Sender<Step>,
    go: Receiver<()>,
    rescue: Arc<OnceLock<Weak<Rank<G>>>>,
) -> Result<(), ()> {
    let bound = config.watchdog_bound().expect("the watchdog is on");
    let (rank, inp, out) = match watchdog_rank::<G>(0, &boot, &config) {
        Ok(x) => x,
        Err(e) => return report(&steps, "healthy all_reduce", Err(e)),
    };
    let rank = Arc::new(rank);
    let _ = rescue.set(Arc::downgrade(&rank));
    report(&steps, "healthy all_reduce", Ok(String::new()))?;
    if go.recv().is_err() {
        return Ok(()); // the test failed elsewhere: close (drop) and end
    }

    // The same op, dtype and size as the healthy call: NCCL reuses its connections, so the
    // call only enqueues (nothing on the host waits for rank 1) and then waits on the device
    // for a peer that never comes.
    let start = Instant::now();
    let call = all_reduce_bufs(&rank, &inp, &out);
    let enqueued = start.elapsed();
    let call_failed = call.is_err();
    let _ = report(
        &steps,
        "enqueue",
        match call {
            Ok(()) => Ok(format!("enqueued in {enqueued:?}")),
            Err(e) => Err(format!(
                "the all_reduce rank 1 never makes returned {e} after {enqueued:?}; expected it to be enqueued (the hang is on the device, for the watchdog)"
            )),
        },
    );
    // The caller's own wait, not the transport's bounded one: this returns only because the
    // watchdog aborts the communicator, which stops its kernels.
    G::synchronize(&rank.stream);
    let synced = start.elapsed();
    if call_failed {
        return Err(());
    }
    report(
        &steps,
        "stream synchronize",
        if synced < bound {
            Err(format!(
                "the stream synchronize returned after {synced:?}, before the watchdog's bound {bound:?}, although rank 1 never made the call"
            ))
        } else if synced >= bound + HANG_MARGIN {
            Err(format!("the stream synchronize returned only after {synced:?}; the watchdog's bound is {bound:?}"))
        } else {
            Ok(format!("the stream synchronize returned {synced:?} after the call (watchdog bound {bound:?})"))
        },
    )?;

    // Poisoned by the watchdog: the cause names the call (the 2nd transport call of this rank).
    let cause = match rank.comm.synchronize(stream_of(&rank), FAIL_FAST) {
        Err(Error::Poisoned { cause }) => cause,
        other => {
            return report(
                &steps,
                "poisoned",
                Err(format!("after the watchdog's abort, synchronize returned {other:?}; expected Error::Poisoned")),
            );
        }
    };
    let named = cause.contains("all_reduce (transport call 2 of this rank)") && cause.contains("transport watchdog");
    if !named {
        return report(
            &steps,
            "poisoned",
            Err(format!("poisoned, but not by the watchdog's timeout of call 2: {cause}")),
        );
    }
    // Every later call fails at once with the same poisoned error.
    let later = Instant::now();
    let again = all_reduce_bufs(&rank, &inp, &out);
    let polled = rank.comm.poll_async_error();
    let took = later.elapsed();
    let same = |r: &Result<(), Error>| matches!(r, Err(Error::Poisoned { cause: c }) if *c == cause);
    report(
        &steps,
        "poisoned",
        if !same(&again) || !same(&polled) {
            Err(format!(
                "later calls on the poisoned collective: all_reduce {again:?}, poll_async_error {polled:?}; expected Error::Poisoned {{ cause: {cause:?} }}"
            ))
        } else if took >= FAIL_FAST {
            Err(format!("later calls took {took:?} to fail; a poisoned collective fails at once"))
        } else {
            Ok(format!("poisoned ({cause}); later calls failed in {took:?}"))
        },
    )?;

    // Close (the communicator is already aborted) and drop, bounded.
    let (closed, took) = close_and_drop(rank, inp, out);
    report(
        &steps,
        "close",
        match closed {
            Err(e) => Err(format!("close after the watchdog's abort: {e}")),
            Ok(()) if took >= config.timeouts().close + HANG_MARGIN => Err(format!("close and drop took {took:?}")),
            Ok(()) => Ok(format!("closed and dropped in {took:?}")),
        },
    )
}

/// Closes a rank's communicator, drops it and its buffers; the close result and the time taken.
fn close_and_drop<G: Gpu>(
    rank: impl std::ops::Deref<Target = Rank<G>>,
    inp: G::Mem,
    out: G::Mem,
) -> (Result<(), Error>, Duration) {
    let start = Instant::now();
    let closed = rank.comm.close();
    drop(rank);
    drop((inp, out));
    (closed, start.elapsed())
}

/// Rank 1: the healthy call, then no call at all, holding its communicator until `end`; then
/// close (whatever the outcome, bounded).
fn watchdog_rank1<G: Gpu>(
    boot: LocalBootstrap,
    config: TransportConfig,
    steps: Sender<Step>,
    end: Receiver<()>,
) -> Result<(), ()> {
    let (rank, inp, out) = match watchdog_rank::<G>(1, &boot, &config) {
        Ok(x) => x,
        Err(e) => return report(&steps, "healthy all_reduce", Err(e)),
    };
    report(&steps, "healthy all_reduce", Ok(String::new()))?;
    // Returns when the test is done with rank 0 (or failed: the sender is dropped).
    let _ = end.recv();
    // Its peer's communicator was aborted: whether NCCL tells rank 1 is not the watchdog's
    // business, so this is only reported.
    let state = rank.comm.poll_async_error();
    let (closed, took) = close_and_drop(Box::new(rank), inp, out);
    report(
        &steps,
        "close",
        if took >= config.timeouts().close + HANG_MARGIN {
            Err(format!("close and drop took {took:?} (close: {closed:?})"))
        } else {
            Ok(format!("state before close {state:?}; close {closed:?}; closed and dropped in {took:?}"))
        },
    )
}

/// Waits for rank `rank`'s step `name` until `deadline` and prints its note; panics saying
/// which step failed or hung (`on_hang` runs first).
fn await_step(steps: &Receiver<Step>, rank: usize, name: &str, deadline: Instant, hang: &str, on_hang: &dyn Fn()) {
    match steps.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        Ok(Step { name: got, outcome: Ok(note) }) if got == name => {
            println!("rank {rank}: {name}: {}", if note.is_empty() { "ok" } else { &note });
        }
        Ok(Step { name: got, outcome: Ok(_) }) => panic!("rank {rank}: step `{got}` while waiting for `{name}`"),
        Ok(Step { name: got, outcome: Err(e) }) => panic!("rank {rank}: {got}: {e}"),
        Err(RecvTimeoutError::Timeout) => {
            on_hang();
            panic!("rank {rank}: `{name}` did not finish in time: {hang}")
        }
        Err(RecvTimeoutError::Disconnected) => {
            panic!("rank {rank}'s thread ended before `{name}` (it panicked: see its message above)")
        }
    }
}

/// World 2 through the library with the watchdog on (bound: a 3 s peer timeout): a healthy
/// all_reduce on both ranks, bit-exact vs `fixed-tree` (the watchdog does not trip healthy
/// calls); then rank 0 makes another all_reduce that rank 1 never makes (rank 1 stays alive,
/// holding its communicator). The call is enqueued; rank 0's own raw stream synchronize
/// returns once the watchdog aborted the communicator (no earlier than the bound, well within
/// bound + margin); the collective is poisoned by the watchdog's timeout naming the call, and
/// later calls fail at once with it. Then both ranks close and drop within bounds.
///
/// Each rank is a thread (one GPU each); this thread waits for their steps with deadlines, so
/// a broken watchdog fails the test with a message instead of hanging the binary. On such a
/// hang it also aborts rank 0's communicator through the transport's own bounded synchronize,
/// to free the GPU for the next tests.
pub fn world2_watchdog<G: Gpu>() {
    let found = G::device_count();
    if found < 2 {
        collective_core::conformance::skip(&format!("needs 2 GPUs (found {found})"));
        return;
    }
    if library_devices::<G>().is_none() {
        return;
    }
    let _l = gpu_lock();
    let config = watchdog_config();
    let bound = config.watchdog_bound().expect("the watchdog is on");
    let mut boots = LocalBootstrap::group(2).into_iter();
    let (boot0, boot1) = (boots.next().expect("rank 0"), boots.next().expect("rank 1"));
    let ((tx0, rx0), (tx1, rx1)) = (mpsc::channel(), mpsc::channel());
    let (go, go_rx) = mpsc::channel();
    let (end, end_rx) = mpsc::channel();
    let rescue: Arc<OnceLock<Weak<Rank<G>>>> = Arc::default();
    // Detached, not scoped: a rank stuck on the GPU must not keep this test from failing.
    let (c0, c1, r0) = (config.clone(), config.clone(), rescue.clone());
    std::thread::Builder::new()
        .name("watchdog-rank-0".into())
        .spawn(move || {
            let _ = watchdog_rank0::<G>(boot0, c0, tx0, go_rx, r0);
        })
        .expect("spawn rank 0");
    std::thread::Builder::new()
        .name("watchdog-rank-1".into())
        .spawn(move || {
            let _ = watchdog_rank1::<G>(boot1, c1, tx1, end_rx);
        })
        .expect("spawn rank 1");

    let nothing = || {};
    let setup = Instant::now() + config.init_timeout + SYNC_BOUND + HANG_MARGIN;
    let setup_hang = "communicator creation or the healthy all_reduce hung";
    await_step(&rx0, 0, "healthy all_reduce", setup, setup_hang, &nothing);
    await_step(&rx1, 1, "healthy all_reduce", setup, setup_hang, &nothing);

    // Past this point a hang on rank 0 means the watchdog did not abort: abort through the
    // transport's bounded synchronize (in a thread: it takes the state lock).
    let abort_rank0 = || {
        if let Some(rank) = rescue.get().and_then(Weak::upgrade) {
            std::thread::spawn(move || drop(rank.comm.synchronize(stream_of(&rank), FAIL_FAST)));
        }
    };
    let _ = go.send(()); // a rank 0 gone by now shows as its thread ending, below
    let started = Instant::now();
    await_step(
        &rx0,
        0,
        "enqueue",
        started + HANG_MARGIN,
        "the all_reduce rank 1 never makes blocked the host instead of being enqueued",
        &abort_rank0,
    );
    let hang = format!(
        "rank 0's own stream synchronize, after an all_reduce rank 1 never made, did not return within {:?}: the transport watchdog (bound {bound:?}) did not abort the communicator",
        bound + HANG_MARGIN
    );
    await_step(&rx0, 0, "stream synchronize", started + bound + HANG_MARGIN, &hang, &abort_rank0);
    await_step(
        &rx0,
        0,
        "poisoned",
        Instant::now() + HANG_MARGIN,
        "checking the poisoned collective hung",
        &abort_rank0,
    );
    let close_bound = config.timeouts().close + HANG_MARGIN;
    await_step(&rx0, 0, "close", Instant::now() + close_bound, "rank 0's close or drop hung", &abort_rank0);

    // Rank 0 is done: rank 1 ends, closing a communicator whose peer was aborted.
    let _ = end.send(());
    await_step(&rx1, 1, "close", Instant::now() + close_bound, "rank 1's close or drop hung", &nothing);
}
