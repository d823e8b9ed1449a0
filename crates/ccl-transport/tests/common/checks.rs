//! The transport's GPU behaviour beyond the conformance suite, on any [`Gpu`] (the test files
//! instantiate them with `gpu_tests!`):
//!
//! * the transport's local tree (W stacked inputs, the workspace layout an all_gather leaves)
//!   bit-exact vs `fixed-tree` for W = 2/4/8, f32/f16/bf16, aligned, unaligned and
//!   non-co-aligned layouts, finite and special values (needs only the GPU runtime);
//! * world 1 through the library (`ncclCommInitRank` with one rank): every op and every
//!   exchange mode bit-exact vs `fixed-tree`, calls alternating between streams, workspace
//!   reporting, bounded synchronize, close, and the non-strict native reference.
//!
//! Each returns after printing a skip when the GPU (or the library) is missing.
use super::{Gpu, SYNC_BOUND, gpu, gpu_lock, library_devices, upload, world1};
use ccl_transport::{Device, TransportCollective, TransportConfig};
use collective_core::conformance::data::{compare, finite_values, reference_reduce, special_values};
use collective_core::{Collective, DType, Error, Io, Op, RawMut, RawRef};
use std::borrow::Borrow;

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
    let blocking = TransportConfig { blocking: true, ..TransportConfig::default() };
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
