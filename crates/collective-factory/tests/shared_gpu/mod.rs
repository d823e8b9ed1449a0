//! The README's GPU pattern as a user writes it, on ranks sharing one GPU: per call, each rank
//! uploads its input from a pageable `Vec` (`clone_htod`), allocates its output
//! (`alloc_zeros`), enqueues the collective through the typed entry point, `synchronize`s,
//! downloads the result (`clone_dtoh`) and drops both buffers (stream-ordered frees). No
//! barrier, turn or lockstep of the test's own: whatever ranks sharing a GPU need is the
//! library's burden. After every 7th call, a fused all_reduce + residual + RMSNorm the same
//! way (the decoder layer's exit: one kernel up to 64 rows, a second launch above, chunked
//! above the staging). Every result is compared bit for bit with `fixed-tree` (the tree, the
//! fused norm's reference); any error (a timeout included) fails the test.
//!
//! Used by `nvidia_shared_gpu.rs` (thread ranks) and `nvidia_shared_gpu_processes.rs` (one
//! process per rank, several processes on one GPU under MPS).
#![allow(dead_code)] // each suite uses part of it
use collective_core::conformance::data::{finite_values, reference_reduce};
use collective_core::fixed_tree::{Element, RmsNormShape, residual_rmsnorm};
use collective_core::{Collective, DType, Op, Reducible, Route};
use collective_factory::{NvidiaCollective, Routing};
use cuda_ipc::cudarc::driver::{CudaStream, DeviceRepr, ValidAsZeroBits};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Every IPC route by size (per-rank input bytes), so the calls below take each of them;
/// the capacity ([`CAPACITY`]) makes the largest calls run in chunks.
pub const EVERY_IPC_ROUTE: &str = r#"{"platform":"nvidia","source":"test: every IPC route","rules":[
  {"op":"all_reduce","min_bytes":0,"max_bytes":2048,"route":"ipc_push_ll"},
  {"op":"all_reduce","min_bytes":2048,"max_bytes":16384,"route":"ipc_one_shot"},
  {"op":"all_reduce","min_bytes":16384,"max_bytes":131072,"route":"ipc_rs_ag"},
  {"op":"all_reduce","min_bytes":131072,"max_bytes":null,"route":"ipc_push"},
  {"op":"all_gather","min_bytes":0,"max_bytes":2048,"route":"ipc_push_ll"},
  {"op":"all_gather","min_bytes":2048,"max_bytes":16384,"route":"ipc_one_shot"},
  {"op":"all_gather","min_bytes":16384,"max_bytes":null,"route":"ipc_push"},
  {"op":"reduce_scatter","min_bytes":0,"max_bytes":2048,"route":"ipc_push_ll"},
  {"op":"reduce_scatter","min_bytes":2048,"max_bytes":16384,"route":"ipc_one_shot"},
  {"op":"reduce_scatter","min_bytes":16384,"max_bytes":null,"route":"ipc_push"},
  {"op":"reduce_scatter_many","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}]}"#;

/// Staging bytes per rank: calls above it run in chunks.
pub const CAPACITY: usize = 256 << 10;

/// Whether a CUDA GPU is here; prints the skip (and why) when not.
pub fn gpu_present() -> bool {
    match cuda_ipc::driver::device_count() {
        Ok(n) if n > 0 => true,
        other => {
            println!("skipped: no CUDA device ({other:?})");
            false
        }
    }
}

/// DETCOLL_SHARED_GPU_CALLS: calls per world (default 10,000).
pub fn calls() -> usize {
    match std::env::var("DETCOLL_SHARED_GPU_CALLS") {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("DETCOLL_SHARED_GPU_CALLS={v:?}: expected a count")),
        Err(_) => 10_000,
    }
}

pub fn routing() -> Routing {
    Routing::from_json(EVERY_IPC_ROUTE).expect("test table")
}

/// Call `i`'s op, dtype and per-rank input elements (a multiple of 8, so every world divides
/// it): mostly small calls, every route, now and then one above the capacity.
pub fn plan(i: usize) -> (Op, DType, usize) {
    const OPS: [Op; 3] = [Op::AllReduce, Op::AllGather, Op::ReduceScatter];
    // Per-rank input bytes: LL, one-shot, RS+AG / push, bulk, chunked.
    const BYTES: [usize; 8] = [64, 1024, 4096, 12 << 10, 48 << 10, 96 << 10, 192 << 10, 1 << 20];
    let op = OPS[i % 3];
    let dtype = if (i / 3).is_multiple_of(2) { DType::BF16 } else { DType::F32 };
    // Sizes cycle with a stride coprime to the op and dtype cycles; the 1 MiB calls (chunked)
    // are every 8th size pick but only 1 in 4 of them, to keep host-side reference work low.
    let pick = (i / 6 + i) % 8;
    let bytes = if pick == 7 && !(i / 48).is_multiple_of(4) { BYTES[i % 4] } else { BYTES[pick] };
    (op, dtype, bytes / dtype.size())
}

/// What rank `rank` must get from call `i` of a world of `world`: the bytes of fixed-tree's
/// result (the whole tree, the rank's shard, or the concatenation).
pub fn expected(i: usize, world: usize, rank: usize) -> (Vec<u8>, Vec<u8>) {
    let (op, dtype, n) = plan(i);
    let inputs: Vec<Vec<u8>> = (0..world).map(|q| finite_values(dtype, n, seed(i, q))).collect();
    let want = match op {
        Op::AllGather => inputs.concat(),
        Op::ReduceScatter => {
            let full = reference_reduce(&inputs, dtype);
            let shard = full.len() / world;
            full[rank * shard..(rank + 1) * shard].to_vec()
        }
        _ => reference_reduce(&inputs, dtype),
    };
    (inputs[rank].clone(), want)
}

fn seed(i: usize, q: usize) -> u64 {
    (i as u64) << 8 | q as u64
}

/// An element type of the typed entry points, from and to little-endian bytes.
pub trait Elem: Reducible + Element + DeviceRepr + ValidAsZeroBits + Copy + Default + Unpin + 'static {
    fn from_le(b: &[u8]) -> Self;
    fn put_le(self, out: &mut Vec<u8>);
}
impl Elem for f32 {
    fn from_le(b: &[u8]) -> Self {
        f32::from_le_bytes(b.try_into().unwrap())
    }
    fn put_le(self, out: &mut Vec<u8>) {
        out.extend(self.to_le_bytes())
    }
}
impl Elem for half::bf16 {
    fn from_le(b: &[u8]) -> Self {
        half::bf16::from_bits(u16::from_le_bytes(b.try_into().unwrap()))
    }
    fn put_le(self, out: &mut Vec<u8>) {
        out.extend(self.to_bits().to_le_bytes())
    }
}

/// One call exactly as the README does it; returns the downloaded output's bytes.
fn one_call<T: Elem>(
    comm: &NvidiaCollective,
    stream: &Arc<CudaStream>,
    op: Op,
    input: &[u8],
) -> Result<Vec<u8>, String> {
    let size = std::mem::size_of::<T>();
    let host: Vec<T> = input.chunks_exact(size).map(T::from_le).collect();
    let world = comm.world_size();
    let out_len = match op {
        Op::AllGather => host.len() * world,
        Op::ReduceScatter => host.len() / world,
        _ => host.len(),
    };
    let x = stream.clone_htod(&host).map_err(|e| format!("clone_htod: {e}"))?;
    let mut y = stream.alloc_zeros::<T>(out_len).map_err(|e| format!("alloc_zeros: {e}"))?;
    let called = match op {
        Op::AllGather => comm.all_gather_into(&x, &mut y, stream),
        Op::ReduceScatter => comm.reduce_scatter_into(&x, &mut y, stream),
        _ => comm.all_reduce_into(&x, &mut y, stream),
    };
    called.map_err(|e| format!("the call: {e}"))?;
    comm.synchronize(stream).map_err(|e| format!("synchronize: {e}"))?;
    let back = stream.clone_dtoh(&y).map_err(|e| format!("clone_dtoh: {e}"))?;
    drop((x, y));
    let mut bytes = Vec::with_capacity(back.len() * size);
    for v in back {
        v.put_le(&mut bytes);
    }
    Ok(bytes)
}

/// The fused call made after call `i`, every 7th: (dtype, rows, hidden) — the one-kernel form
/// (up to 64 rows), a second launch (100 rows), chunked above the staging (64 x 4096 f32).
pub fn fused_plan(i: usize) -> Option<(DType, usize, usize)> {
    const SHAPES: [(usize, usize); 6] = [(1, 4096), (3, 1024), (8, 4096), (64, 1024), (100, 1024), (64, 4096)];
    if i % 7 != 6 {
        return None;
    }
    let dtype = if (i / 42).is_multiple_of(2) { DType::BF16 } else { DType::F32 };
    let (rows, hidden) = SHAPES[(i / 7) % SHAPES.len()];
    Some((dtype, rows, hidden))
}

/// The fused call after call `i` on rank `rank`, as the README's pattern makes it (pageable
/// uploads, allocation, the call, `synchronize`, downloads, frees), checked bit for bit
/// against `fixed_tree::residual_rmsnorm` of every rank's inputs.
fn fused_call<T: Elem>(
    comm: &NvidiaCollective,
    stream: &Arc<CudaStream>,
    i: usize,
    rows: usize,
    hidden: usize,
) -> Result<(), String> {
    let (rank, world, n) = (comm.rank(), comm.world_size(), rows * hidden);
    let dtype = T::DTYPE;
    let typed = |b: Vec<u8>| -> Vec<T> { b.chunks_exact(dtype.size()).map(T::from_le).collect() };
    let xs: Vec<Vec<T>> = (0..world).map(|q| typed(finite_values(dtype, n, seed(i, q) ^ 0xf00d))).collect();
    let residual = typed(finite_values(dtype, n, seed(i, 200)));
    let weight = typed(finite_values(dtype, hidden, seed(i, 201)));
    let x = stream.clone_htod(&xs[rank]).map_err(|e| format!("clone_htod: {e}"))?;
    let mut h = stream.clone_htod(&residual).map_err(|e| format!("clone_htod: {e}"))?;
    let w = stream.clone_htod(&weight).map_err(|e| format!("clone_htod: {e}"))?;
    let mut y = stream.alloc_zeros::<T>(n).map_err(|e| format!("alloc_zeros: {e}"))?;
    comm.all_reduce_residual_rmsnorm_into(&x, &mut y, &mut h, &w, hidden, 1e-6, stream)
        .map_err(|e| format!("the fused call: {e}"))?;
    comm.synchronize(stream).map_err(|e| format!("synchronize: {e}"))?;
    let (got_h, got_y) = (
        stream.clone_dtoh(&h).map_err(|e| format!("clone_dtoh: {e}"))?,
        stream.clone_dtoh(&y).map_err(|e| format!("clone_dtoh: {e}"))?,
    );
    drop((x, h, w, y));
    let parts: Vec<&[T]> = xs.iter().map(|v| v.as_slice()).collect();
    let (mut want_h, mut want_y) = (vec![T::default(); n], vec![T::default(); n]);
    residual_rmsnorm(&parts, &residual, &weight, 1e-6, RmsNormShape { rows, hidden }, &mut want_h, &mut want_y)
        .map_err(|e| format!("reference: {e}"))?;
    let bits = |v: &[T]| v.iter().map(|e| if e.is_nan() { u32::MAX } else { e.to_bits_u32() }).collect::<Vec<_>>();
    if bits(&got_h) != bits(&want_h) || bits(&got_y) != bits(&want_y) {
        return Err("h or y differs from fixed_tree::residual_rmsnorm".into());
    }
    Ok(())
}

/// This rank's `calls` calls, each checked bit for bit, with a fused call after every 7th
/// ([`fused_plan`]); returns how many calls took each route (and how many ran in chunks, as
/// `"chunked"`, and how many were fused, as `"fused"`).
pub fn run_rank(comm: &NvidiaCollective, calls: usize) -> Result<BTreeMap<String, usize>, String> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let stream = comm.context().new_stream().map_err(|e| format!("rank {rank}: new_stream: {e}"))?;
    let mut routes = BTreeMap::new();
    for i in 0..calls {
        let (op, dtype, n) = plan(i);
        let (input, want) = expected(i, world, rank);
        let route: Route = comm.route(op, n * dtype.size());
        *routes.entry(route.name().to_string()).or_default() += 1;
        if n * dtype.size() * if op == Op::AllGather { world } else { 1 } > CAPACITY {
            *routes.entry("chunked".to_string()).or_default() += 1;
        }
        let got = match dtype {
            DType::F32 => one_call::<f32>(comm, &stream, op, &input),
            _ => one_call::<half::bf16>(comm, &stream, op, &input),
        }
        .map_err(|e| format!("rank {rank} of {world}, call {i} ({op} {dtype} x{n}, {}): {e}", route.name()))?;
        if got != want {
            let first = got.iter().zip(&want).position(|(a, b)| a != b);
            return Err(format!(
                "rank {rank} of {world}, call {i} ({op} {dtype} x{n}, {}): result differs from fixed-tree (first byte {first:?}, lengths {} / {})",
                route.name(),
                got.len(),
                want.len()
            ));
        }
        if let Some((dtype, rows, hidden)) = fused_plan(i) {
            *routes.entry("fused".to_string()).or_default() += 1;
            match dtype {
                DType::F32 => fused_call::<f32>(comm, &stream, i, rows, hidden),
                _ => fused_call::<half::bf16>(comm, &stream, i, rows, hidden),
            }
            .map_err(|e| {
                format!("rank {rank} of {world}, fused call after call {i} ({dtype} {rows} x {hidden}): {e}")
            })?;
        }
    }
    Ok(routes)
}

/// Every IPC route (and chunking) was taken.
pub fn check_routes(routes: &BTreeMap<String, usize>) -> Result<(), String> {
    for r in ["ipc_push_ll", "ipc_one_shot", "ipc_rs_ag", "ipc_push", "chunked", "fused"] {
        if !routes.contains_key(r) {
            return Err(format!("route {r} was never taken: {routes:?}"));
        }
    }
    Ok(())
}
