//! GPU behaviour of the transport beyond the conformance suite:
//!
//! * the transport's local tree (W stacked inputs, the workspace layout an all_gather leaves)
//!   bit-exact vs `fixed-tree` for W = 2/4/8, f32/f16/bf16, aligned, unaligned and
//!   non-co-aligned layouts, finite and special values (needs only CUDA);
//! * world 1 through NCCL (`ncclCommInitRank` with one rank): every op and every exchange
//!   mode bit-exact vs `fixed-tree`, calls alternating between streams, workspace reporting,
//!   bounded synchronize, close, and the non-strict native reference.
//!
//! Without a GPU (or NCCL) each test prints "skipped: no CUDA device / no NCCL" and passes.
//! Run with `NCCL_NVLS_ENABLE=0` on shared hosts.
#![cfg(feature = "cuda")]
mod common;

use ccl_transport::cuda_ipc::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use ccl_transport::{CudaDevice, Device, RawStream, TransportCollective, TransportConfig};
use collective_core::conformance::data::{compare, finite_values, reference_reduce, special_values};
use collective_core::{Collective, DType, Error, Io, Op, RawMut, RawRef};
use common::{SYNC_BOUND, addr, gpu, gpu_lock, nccl_devices, upload, world1};
use std::sync::Arc;

fn seed(a: usize, b: usize) -> u64 {
    (a as u64) << 24 ^ (b as u64) << 8 ^ 0xCC1
}

fn raw(s: &CudaStream) -> RawStream {
    RawStream(s.cu_stream().cast())
}

// ---------------------------------------------------------------------------------------------
// The local tree over stacked inputs.
// ---------------------------------------------------------------------------------------------

#[test]
fn stacked_tree_matches_fixed_tree_for_w_2_4_8() {
    let Some(ctx) = gpu() else { return };
    let _l = gpu_lock();
    let dev = CudaDevice::new(&ctx).expect("tree kernel");
    let s = ctx.new_stream().expect("stream");
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
                        let stack = upload(&s, &stack);
                        let out = upload(&s, &vec![0xA5u8; (n + out_off + 8) * size]);
                        let first = addr(&stack, &s) + (base_off * size) as u64;
                        let o = addr(&out, &s) + (out_off * size) as u64;
                        // SAFETY: the stack holds `w` inputs of `n` elements `stride` bytes apart;
                        // the output holds `n` elements after its offset; both live until read.
                        unsafe { dev.tree_stacked(first, stride, w, o, n, d, raw(&s)) }.expect("launch");
                        let got = s.clone_dtoh(&out).expect("dtoh");
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
// World 1 through NCCL.
// ---------------------------------------------------------------------------------------------

struct World1 {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

fn setup() -> Option<World1> {
    nccl_devices()?;
    let ctx = common::context(0)?;
    let stream = ctx.new_stream().expect("stream");
    Some(World1 { ctx, stream })
}

/// Runs one out-of-place or in-place single-lane call and returns the output bytes.
fn call_once(
    t: &TransportCollective<CudaDevice>,
    s: &Arc<CudaStream>,
    op: Op,
    d: DType,
    input: &[u8],
    in_place: bool,
    out_off: usize,
) -> Vec<u8> {
    let size = d.size();
    let n = input.len() / size;
    // World 1: every op's output has the input's length.
    let out_n = n;
    let lo = out_off * size;
    if in_place {
        let buf = upload(s, &[vec![0xA5u8; lo], input.to_vec()].concat());
        // SAFETY: the buffer lives until the call has been read back below.
        let io = Io::InPlace(unsafe { RawMut::from_raw(addr(&buf, s) + lo as u64, n, d) });
        run(t, s, op, io);
        t.synchronize(s, SYNC_BOUND).expect("synchronize");
        let got = s.clone_dtoh(&buf).expect("dtoh");
        assert!(got[..lo].iter().all(|&b| b == 0xA5), "{op:?} wrote before its buffer");
        got[lo..].to_vec()
    } else {
        let inp = upload(s, input);
        let out = upload(s, &vec![0xA5u8; lo + out_n * size + 64]);
        // SAFETY: both buffers live until the call has been read back below.
        let io = unsafe {
            Io::OutOfPlace {
                input: RawRef::from_raw(addr(&inp, s), n, d),
                output: RawMut::from_raw(addr(&out, s) + lo as u64, out_n, d),
            }
        };
        run(t, s, op, io);
        t.synchronize(s, SYNC_BOUND).expect("synchronize");
        let got = s.clone_dtoh(&out).expect("dtoh");
        assert!(
            got[..lo].iter().chain(&got[lo + out_n * size..]).all(|&b| b == 0xA5),
            "{op:?} wrote outside its output"
        );
        assert_eq!(s.clone_dtoh(&inp).expect("dtoh"), input, "{op:?} modified its input");
        got[lo..lo + out_n * size].to_vec()
    }
}

fn run(t: &TransportCollective<CudaDevice>, s: &CudaStream, op: Op, io: Io<'_>) {
    let r = match op {
        Op::AllReduce => t.all_reduce(io, s),
        Op::AllGather => t.all_gather(io, s),
        Op::ReduceScatter => t.reduce_scatter(io, s),
        Op::ReduceScatterMany => t.reduce_scatter_many(&[io], s),
    };
    r.unwrap_or_else(|e| panic!("{op:?}: {e}"));
}

#[test]
fn world1_single_lane_ops_through_nccl_are_bit_exact() {
    let Some(w) = setup() else { return };
    let _l = gpu_lock();
    let blocking = TransportConfig { blocking: true, ..TransportConfig::default() };
    for config in [TransportConfig::default(), TransportConfig::default().with_all_to_all_threshold(0), blocking] {
        let t = world1(&w.ctx, &config);
        assert_eq!(t.route(Op::AllReduce, 1 << 20), collective_core::Route::Transport);
        assert!(!t.capabilities().supports_graph_capture && t.capabilities().strict_fixed_order);
        let mut failures = Vec::new();
        for d in DType::REDUCIBLE {
            for n in [1usize, 7, 1000, 4099, (1 << 20) + 3] {
                for special in [false, true] {
                    let input = if special { special_values(d, n, 0) } else { finite_values(d, n, seed(n, 1)) };
                    // World 1: the tree over one rank is the input itself (reference_reduce of
                    // one leaf), gather is the input; still every byte went through NCCL and the
                    // tree kernel.
                    let want = reference_reduce(std::slice::from_ref(&input), d);
                    for op in [Op::AllReduce, Op::AllGather, Op::ReduceScatter, Op::ReduceScatterMany] {
                        for (in_place, off) in [(false, 0usize), (true, 0), (false, 3), (true, 1)] {
                            let got = call_once(&t, &w.stream, op, d, &input, in_place, off);
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

#[test]
fn world1_reduce_scatter_many_packed_and_per_lane_are_bit_exact() {
    let Some(w) = setup() else { return };
    let _l = gpu_lock();
    let s = &w.stream;
    for pack in [0usize, usize::MAX] {
        let t = world1(&w.ctx, &TransportConfig::default().with_pack_threshold(pack));
        for d in DType::REDUCIBLE {
            let size = d.size();
            let lanes: Vec<Vec<u8>> = [3usize, 1000, 0, 65536 + 1]
                .iter()
                .enumerate()
                .map(|(l, &n)| if l == 1 { special_values(d, n, 0) } else { finite_values(d, n, seed(l, n)) })
                .collect();
            let ins: Vec<CudaSlice<u8>> = lanes.iter().map(|l| upload(s, l)).collect();
            let outs: Vec<CudaSlice<u8>> = lanes.iter().map(|l| upload(s, &vec![0xA5u8; l.len() + 2 * size])).collect();
            // Lane 0 in place, the others out of place with an odd output offset.
            // SAFETY: all buffers live until read back below.
            let ios: Vec<Io<'_>> = lanes
                .iter()
                .enumerate()
                .map(|(l, lane)| unsafe {
                    let n = lane.len() / size;
                    if l == 0 {
                        Io::InPlace(RawMut::from_raw(addr(&ins[0], s), n, d))
                    } else {
                        Io::OutOfPlace {
                            input: RawRef::from_raw(addr(&ins[l], s), n, d),
                            output: RawMut::from_raw(addr(&outs[l], s) + size as u64, n, d),
                        }
                    }
                })
                .collect();
            t.reduce_scatter_many(&ios, s).expect("reduce_scatter_many");
            t.synchronize(s, SYNC_BOUND).expect("synchronize");
            for (l, lane) in lanes.iter().enumerate() {
                let want = reference_reduce(std::slice::from_ref(lane), d);
                let got = if l == 0 {
                    s.clone_dtoh(&ins[0]).expect("dtoh")
                } else {
                    s.clone_dtoh(&outs[l]).expect("dtoh")[size..size + lane.len()].to_vec()
                };
                compare(&got, &want, d).unwrap_or_else(|e| panic!("pack {pack} {d} lane {l}: {e}"));
            }
        }
        t.close().expect("close");
    }
}

#[test]
fn world1_calls_alternating_streams_reuse_the_workspace_safely() {
    let Some(w) = setup() else { return };
    let _l = gpu_lock();
    let t = world1(&w.ctx, &TransportConfig::default());
    let other = w.ctx.new_stream().expect("stream");
    let d = DType::BF16;
    let n = 4 << 20;
    let inputs: Vec<Vec<u8>> = (0..6).map(|i| finite_values(d, n, seed(i, 9))).collect();
    let bufs: Vec<(CudaSlice<u8>, CudaSlice<u8>)> =
        inputs.iter().map(|x| (upload(&w.stream, x), upload(&w.stream, &vec![0u8; x.len()]))).collect();
    w.stream.synchronize().expect("uploads");
    for (i, (inp, out)) in bufs.iter().enumerate() {
        let s: &CudaStream = if i % 2 == 0 { &w.stream } else { &other };
        // SAFETY: buffers live until read back below.
        let io = unsafe {
            Io::OutOfPlace { input: RawRef::from_raw(addr(inp, s), n, d), output: RawMut::from_raw(addr(out, s), n, d) }
        };
        t.all_reduce(io, s).expect("all_reduce");
    }
    t.synchronize(&w.stream, SYNC_BOUND).expect("sync");
    t.synchronize(&other, SYNC_BOUND).expect("sync");
    for (i, (_, out)) in bufs.iter().enumerate() {
        compare(&w.stream.clone_dtoh(out).expect("dtoh"), &inputs[i], d).unwrap_or_else(|e| panic!("call {i}: {e}"));
    }
    assert!(t.workspace_bytes() >= n * d.size(), "workspace {} retained", t.workspace_bytes());
    t.reserve_workspace(64 << 20).expect("reserve");
    assert!(t.workspace_bytes() >= 64 << 20);
    t.close().expect("close");
}

#[test]
fn world1_poll_close_and_validation_fail_closed() {
    let Some(w) = setup() else { return };
    let _l = gpu_lock();
    let t = world1(&w.ctx, &TransportConfig::new(1 << 20));
    t.poll_async_error().expect("healthy");
    println!("transport on {} ({}), NCCL {}", t.library(), t.device().describe(), t.library_version());
    let s = &w.stream;
    let a = upload(s, &vec![0u8; 8 << 20]);
    // Over capacity: a typed error before any device work; the collective stays usable.
    // SAFETY: the buffer outlives the calls.
    let too_big = unsafe { Io::InPlace(RawMut::from_raw(addr(&a, s), (1 << 20) / 4 + 1, DType::F32)) };
    assert!(matches!(t.all_reduce(too_big, s), Err(Error::CapacityExceeded { .. })));
    // all_gather writes into the caller's output and is not bounded by the capacity.
    // SAFETY: as above.
    let gather = unsafe { Io::InPlace(RawMut::from_raw(addr(&a, s), 2 << 20, DType::F32)) };
    t.all_gather(gather, s).expect("large all_gather");
    t.synchronize(s, SYNC_BOUND).expect("synchronize");
    t.poll_async_error().expect("still healthy");
    t.close().expect("close");
    // SAFETY: as above.
    let io = unsafe { Io::InPlace(RawMut::from_raw(addr(&a, s), 16, DType::F32)) };
    assert!(matches!(t.all_reduce(io, s), Err(Error::Closed)));
    assert!(matches!(t.synchronize(s, SYNC_BOUND), Err(Error::Closed)));
}

#[test]
fn world1_nonstrict_native_reference_runs() {
    let Some(w) = setup() else { return };
    let _l = gpu_lock();
    let t = world1(&w.ctx, &TransportConfig::default());
    let s = &w.stream;
    let d = DType::BF16;
    let n = 4096;
    let x = finite_values(d, n, 5);
    let inp = upload(s, &x);
    let out = upload(s, &vec![0u8; x.len()]);
    // SAFETY: buffers live until read back.
    let io = unsafe {
        Io::OutOfPlace { input: RawRef::from_raw(addr(&inp, s), n, d), output: RawMut::from_raw(addr(&out, s), n, d) }
    };
    t.native_all_reduce(io, s).expect("native all_reduce");
    // SAFETY: as above.
    let io = unsafe {
        Io::OutOfPlace { input: RawRef::from_raw(addr(&inp, s), n, d), output: RawMut::from_raw(addr(&out, s), n, d) }
    };
    t.native_reduce_scatter(io, s).expect("native reduce_scatter");
    t.synchronize(s, SYNC_BOUND).expect("synchronize");
    // With one rank the native sum is the input; this checks the calls ran, not a contract.
    compare(&s.clone_dtoh(&out).expect("dtoh"), &x, d).expect("world-1 native result");
    // Reductions of non-float dtypes are refused before any work.
    // SAFETY: as above.
    let io = unsafe { Io::InPlace(RawMut::from_raw(addr(&inp, s), 16, DType::U8)) };
    assert!(matches!(t.native_all_reduce(io, s), Err(Error::UnsupportedDtype { .. })));
    t.close().expect("close");
}
