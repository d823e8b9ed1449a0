//! GPU behaviour beyond the conformance suite, the HIP twin of `cuda-ipc/tests/gpu.rs`: long
//! randomized back-to-back sequences, fail-closed protocol errors (mismatched calls, a rank that
//! never arrives), the fused tree kernel against `fixed-tree`, and graph capture not being
//! claimed. All ranks are threads on HIP device 0.
//!
//! Not ported: graph capture and replay (`HipIpcCollective` does not claim HIP graphs, see
//! `graph_capture_is_not_claimed`).
//!
//! Without a HIP device (or without libamdhip64) each test prints "skipped: no HIP device" and
//! passes. Never executed on an AMD GPU (none was available): see docs/rocm.md.
mod common;

use collective_core::conformance::data::{compare, finite_values, reference_reduce, special_values};
use collective_core::conformance::faults;
use collective_core::conformance::sequence::{self, seed};
use collective_core::protocol::params::TreeParams;
use collective_core::{Collective, DType, Io, RawMut, RawRef};
use common::{DevBuf, HipRank, gpu, gpu_lock, run_ranks};
use hip_ipc::runtime::DeviceMemory;
use hip_ipc::{Arithmetic, FusedTree, HipIpcConfig, Stream};
use std::time::{Duration, Instant};

/// A device copy of `data` in the rank's region.
fn put(rank: &mut HipRank, data: &[u8]) -> DevBuf {
    let b = rank.alloc_dev(data.len());
    rank.upload(b.ptr, data);
    b
}

/// `n` elements of `dtype` from `input` into `output`, out of place.
fn io(input: &DevBuf, output: &DevBuf, n: usize, dtype: DType) -> Io<'static> {
    assert!(n * dtype.size() <= input.len.min(output.len), "view out of bounds");
    // SAFETY: in bounds of test buffers that outlive every call enqueued on them (each test
    // synchronises its stream before its region is freed).
    let input = unsafe { RawRef::from_raw(input.ptr, n, dtype) };
    // SAFETY: as above; each output is written by one call at a time.
    let output = unsafe { RawMut::from_raw(output.ptr, n, dtype) };
    Io::OutOfPlace { input, output }
}

// ---------------------------------------------------------------------------------------------
// Randomized back-to-back calls.
// ---------------------------------------------------------------------------------------------

fn randomized(world: usize, total: usize, capacity: usize) {
    let Some(ordinal) = gpu() else { return };
    let _l = gpu_lock();
    let config = sequence::config(capacity);
    let comms = hip_ipc::group_on_ordinal(ordinal, world, &config).expect("group");
    let host_inputs = sequence::inputs(world, capacity);
    let batch = 500;
    // Every rank a thread on device `ordinal`, sharing its queues.
    let ordered = sequence::ordered_enqueue(world, true);
    let in_flight = sequence::random_in_flight(ordered);
    let order = sequence::Order::default();
    println!(
        "world {world}: {total} calls, batches of {batch}, at most {in_flight} in flight per rank (0 = all), ordered enqueue {ordered}"
    );
    let (batches, arena_bytes) = sequence::plan(total, batch, world, capacity);
    // In-place setup copies in the middle of a batch go through a kernel (the 1-leaf tree),
    // never `hipMemcpy`: a runtime copy queued behind a pending collective could wait for a
    // peer that waits for it. Loaded before any rank starts.
    let copier = FusedTree::load(ordinal).expect("kernels");
    let started = Instant::now();
    let r = run_ranks(comms, |rank| {
        let me = rank.comm.rank();
        let dev_inputs: Vec<DevBuf> = host_inputs.iter().map(|per_rank| put(rank, &per_rank[me])).collect();
        let arena = rank.alloc_dev(arena_bytes);
        let member = order.member();
        rank.barrier()?;
        let s = &rank.stream;
        let mut done = 0;
        for calls in &batches {
            // Enqueue the batch back to back, with at most `in_flight` calls queued per rank
            // before a stream sync (DETCOLL_RANDOM_INFLIGHT; 0 = the whole batch).
            let sync = |i| s.synchronize().map_err(|e| format!("sync before call {i}: {e}"));
            sequence::enqueue_batch(calls, done, world, me, in_flight, ordered.then_some(&order), sync, |i, c| {
                let copy = |src: u64, dst: u64, n: usize, d: DType| {
                    // SAFETY: copy of `n` elements inside live test buffers, on the rank's stream.
                    unsafe { copier.launch(&[src], dst, n, d, s.raw()) }
                };
                // SAFETY: the rank's input buffers and arena live until after the batch is checked.
                let r =
                    unsafe { sequence::enqueue(&rank.comm, s, c, dev_inputs[c.dtype as usize].ptr, arena.ptr, copy) };
                r.map_err(|e| format!("call {i} {c:?}: {e}"))
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
/// `fixed-tree`. The eight ranks are threads sharing one device, so they enqueue in the global
/// call order (see [`sequence::ordered_enqueue`]).
#[test]
fn randomized_back_to_back_world8() {
    randomized(8, sequence::random_calls(), 64 << 10);
}

#[test]
fn randomized_back_to_back_world2() {
    randomized(2, sequence::random_calls() / 5, 64 << 10);
}

// ---------------------------------------------------------------------------------------------
// Fail-closed protocol errors.
// ---------------------------------------------------------------------------------------------

/// Rank 0 reduces `n0` f32, rank 1 `n1`: both must report SignatureMismatch long before the
/// timeout, then be poisoned.
fn mismatch(n0: usize, n1: usize) {
    let Some(ordinal) = gpu() else { return };
    let _l = gpu_lock();
    let bound = Duration::from_secs(8);
    let comms = hip_ipc::group_on_ordinal(ordinal, 2, &faults::config(bound)).expect("group");
    let r = run_ranks(comms, |rank| {
        let me = rank.comm.rank();
        let n = if me == 0 { n0 } else { n1 };
        let input = put(rank, &finite_values(DType::F32, n, 1));
        let output = rank.alloc_dev(n * 4);
        rank.barrier()?;
        let s = &rank.stream;
        let t = Instant::now();
        rank.comm.all_reduce(io(&input, &output, n, DType::F32), s).map_err(|e| e.to_string())?;
        s.synchronize().map_err(|e| e.to_string())?;
        let waited = t.elapsed();
        let again = || rank.comm.all_reduce(io(&input, &output, n, DType::F32), s);
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

#[test]
fn absent_rank_times_out_and_poisons() {
    let Some(ordinal) = gpu() else { return };
    let _l = gpu_lock();
    let bound = Duration::from_millis(300);
    let comms = hip_ipc::group_on_ordinal(ordinal, 2, &faults::config(bound)).expect("group");
    let r = run_ranks(comms, |rank| {
        if rank.comm.rank() == 1 {
            // Never arrives; its own state stays healthy.
            std::thread::sleep(Duration::from_millis(50));
            return rank.comm.check().map_err(|e| format!("the absent rank is not poisoned itself: {e}"));
        }
        let n = 4096;
        let input = put(rank, &finite_values(DType::BF16, n, 2));
        let output = rank.alloc_dev(n * 2);
        let s = &rank.stream;
        let t = Instant::now();
        rank.comm.all_reduce(io(&input, &output, n, DType::BF16), s).map_err(|e| e.to_string())?;
        s.synchronize().map_err(|e| e.to_string())?;
        let waited = t.elapsed();
        let again = || rank.comm.all_reduce(io(&input, &output, n, DType::BF16), s);
        let cause = faults::expect_timeout(waited, bound, rank.comm.check(), again)?;
        println!("rank 0: timed out after {waited:?}; later call: poisoned ({cause})");
        Ok(())
    });
    r.expect("timeout");
}

// ---------------------------------------------------------------------------------------------
// The fused tree kernel: the packed hardware arithmetic and the software path.
// ---------------------------------------------------------------------------------------------

/// How the W leaves lie in their one (stacked) allocation.
#[derive(Debug, Clone, Copy)]
struct Layout {
    /// Element offset of every leaf from its slot, and of the output from its allocation.
    in_off: usize,
    out_off: usize,
    /// Leaves back to back (`n` elements apart, as a gathered buffer holds them: leaf starts of
    /// mixed alignment) rather than in 256-byte aligned slots.
    packed: bool,
}

const LAYOUTS: [Layout; 4] = [
    // Aligned: the 16-byte vector path.
    Layout { in_off: 0, out_off: 0, packed: false },
    // Co-aligned but not 16-byte aligned: a scalar head, then vectors.
    Layout { in_off: 1, out_off: 1, packed: false },
    // Not co-aligned: all scalar.
    Layout { in_off: 0, out_off: 1, packed: false },
    // Stacked back to back.
    Layout { in_off: 0, out_off: 0, packed: true },
];

/// One launch of `tree` over `leaves` laid out as `at` says; the output's bytes.
fn tree_once(tree: &FusedTree, s: &Stream, leaves: &[Vec<u8>], n: usize, d: DType, at: Layout, soft: bool) -> Vec<u8> {
    let size = d.size();
    let slot = if at.packed { n * size } else { ((at.in_off + n) * size).div_ceil(256) * 256 };
    let mut stacked = vec![0u8; slot * leaves.len() + at.in_off * size];
    for (i, l) in leaves.iter().enumerate() {
        let o = i * slot + at.in_off * size;
        stacked[o..o + l.len()].copy_from_slice(l);
    }
    let ordinal = tree.device();
    let inputs_mem = DeviceMemory::new(ordinal, stacked.len()).expect("hipMalloc (leaves)");
    s.write_sync(&inputs_mem, &stacked).expect("upload");
    let inputs: Vec<u64> = (0..leaves.len()).map(|i| inputs_mem.ptr() + (i * slot + at.in_off * size) as u64).collect();
    let out = DeviceMemory::new(ordinal, (n + at.out_off) * size).expect("hipMalloc (output)");
    let p = TreeParams::pack(&inputs, out.ptr() + (at.out_off * size) as u64, n, d).expect("parameters");
    let arithmetic = if soft { Arithmetic::Software } else { Arithmetic::Hardware };
    // SAFETY: every leaf and the output hold the `n` elements the kernel touches; the stream is
    // the tree's device's and is synchronised (by `read_sync`) before the buffers are freed.
    unsafe { tree.launch_packed(&p, arithmetic, s.raw()) }.expect("launch");
    let mut got = vec![0u8; out.len()];
    s.read_sync(&out, &mut got).expect("download");
    got.drain(..at.out_off * size);
    got
}

/// W = 1/2/4/8 leaves, f32/f16/bf16, finite and special values, aligned, unaligned and stacked
/// layouts, the packed hardware arithmetic and the software path: bit-exact against
/// `fixed-tree`.
#[test]
fn fused_tree_matches_fixed_tree() {
    let Some(ordinal) = gpu() else { return };
    let _l = gpu_lock();
    let tree = FusedTree::load(ordinal).expect("kernels");
    let s = Stream::new(ordinal).expect("stream");
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
                        if let Err(e) = compare(&tree_once(&tree, &s, &leaves, n, d, at, soft), &want, d) {
                            failures.push(format!("W={w} {d} special={special} soft={soft} {at:?}: {e}"));
                        }
                    }
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Graph capture.
// ---------------------------------------------------------------------------------------------

/// HIP graph capture was never exercised, so `HipIpcCollective` must not claim it (the CUDA
/// twin claims it and replays captured calls in its `tests/gpu.rs`); every rank of every world
/// reports the same capabilities.
#[test]
fn graph_capture_is_not_claimed() {
    let Some(ordinal) = gpu() else { return };
    let _l = gpu_lock();
    let config = HipIpcConfig::new(1 << 20);
    for world in [1, 2] {
        let comms = hip_ipc::group_on_ordinal(ordinal, world, &config).expect("group");
        for c in &comms {
            let caps = c.capabilities();
            assert!(!caps.supports_graph_capture, "world {world} rank {}: graph capture claimed", c.rank());
            assert!(caps.strict_fixed_order);
            assert_eq!(caps.capacity_bytes, 1 << 20);
        }
        for c in &comms {
            c.close().expect("close");
        }
    }
}
