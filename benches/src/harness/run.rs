//! The measurement loop every rank runs, generic over [`BenchBackend`].
//!
//! Per size: where the backend has one, an empty-kernel row (every rank launches the empty
//! kernel at once: the launch floor); one copy-baseline row (all ranks copy their input
//! concurrently; rank 0 also alone); then one row per operation. A row: allocate and fill,
//! barrier, one first call (its output is checked against the fixed tree rebuilt from every
//! rank's deterministic input, and hashed), `warmup` untimed calls, then `samples` x (barrier,
//! `iterations` back-to-back timed calls); the output of the last call is hashed again. Each
//! rank's latencies, hashes and verdicts are exchanged through the bootstrap, so every rank
//! assembles the same rows.
//!
//! `--graph`: after the first (checked) eager call, every rank drains its stream and meets the
//! others at a barrier, captures `iterations` calls into one graph and instantiates and uploads
//! it; the ranks then agree that every rank captured (an all-gather, which is also the barrier
//! between "every rank instantiated" and the first replay: ranks sharing a GPU wait for each
//! other inside kernels, and instantiation can wait for the device to go idle). Warm-up is one
//! untimed replay; each sample is a barrier and `--replays` (default 1) timed replays back to
//! back (per call = sample time / (replays x iterations)), with nothing else enqueued between
//! replays. The graph is destroyed after a barrier that follows every rank's last replay.
use super::args::{BenchArgs, BenchOp};
use super::backend::{BenchBackend, NativeKind};
use super::progress;
use super::reference::RowReference;
use super::report::Row;
use super::routes;
use super::stats::{Summary, digest, gbps, slowest_rank};
use anyhow::Context;
use collective_core::bootstrap::Bootstrap;
use collective_core::conformance::data::finite_values;
use collective_core::{Collective, DType, Io};
use serde::{Deserialize, Serialize};

/// `operation` of the empty-kernel rows.
pub const EMPTY_KERNEL: &str = "empty_kernel";
/// `route` of the empty-kernel rows: the kernel's name.
pub const EMPTY_KERNEL_ROUTE: &str = "detcoll_noop";

/// What a row measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowKind {
    /// The plain copy baseline.
    Copy,
    /// The launch floor: one empty kernel per call.
    EmptyKernel,
    /// A collective.
    Op(BenchOp),
}

/// What one rank measured for one row (exchanged as JSON through the bootstrap).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankRow {
    /// Seconds per call, one per sample.
    pub latencies: Vec<f64>,
    /// Copy rows, rank 0 only: seconds per copy with the other ranks idle.
    pub alone: Vec<f64>,
    /// Digest of the output after the first call.
    pub first: u64,
    /// Digest of the output after the last timed call.
    pub last: u64,
    /// The first output matched the reference (copy rows: the source).
    pub reference_ok: bool,
    /// The first difference, when not.
    pub mismatch: Option<String>,
    pub workspace_bytes: usize,
    pub peak_temp_bytes: usize,
    /// Seconds per native (non-strict) call, one per sample, per [`NativeKind::ALL`] entry;
    /// empty where that reference did not run.
    #[serde(default)]
    pub native: Vec<Vec<f64>>,
    /// Largest |native - fixed tree| of the first native (default) call's output.
    #[serde(default)]
    pub native_max_abs_diff: Option<f64>,
}

/// Elements of every output lane of `op` for `n` input elements per rank.
pub fn output_lens(op: BenchOp, n: usize, world: usize) -> Vec<usize> {
    match op {
        BenchOp::AllReduce => vec![n],
        BenchOp::AllGather => vec![n * world],
        BenchOp::ReduceScatter => vec![n / world],
        BenchOp::ReduceScatterMany => vec![n / op.lanes() / world; op.lanes()],
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The seed of lane `lane` of rank `rank`'s input of a row.
pub fn input_seed(seed: u64, op: BenchOp, size: usize, rank: usize, lane: usize) -> u64 {
    [op.op() as u64, size as u64, rank as u64, lane as u64].iter().fold(splitmix(seed), |h, &v| splitmix(h ^ v))
}

/// Rank `rank`'s input of a row: `n` elements, lanes concatenated.
pub fn rank_input(seed: u64, op: BenchOp, dtype: DType, size: usize, n: usize, rank: usize) -> Vec<u8> {
    let lanes = op.lanes();
    (0..lanes).flat_map(|l| finite_values(dtype, n / lanes, input_seed(seed, op, size, rank, l))).collect()
}

/// What rank `rank` must receive, lanes concatenated, from the fixed tree over every rank's input:
/// the plain definition, which the bench's faster [`RowReference`] is tested against.
#[cfg(test)]
pub(crate) fn expected_output(
    seed: u64,
    op: BenchOp,
    dtype: DType,
    size: usize,
    n: usize,
    world: usize,
    rank: usize,
) -> Vec<u8> {
    let inputs: Vec<Vec<u8>> = (0..world).map(|r| rank_input(seed, op, dtype, size, n, r)).collect();
    let esize = dtype.size();
    match op {
        BenchOp::AllGather => inputs.concat(),
        BenchOp::AllReduce => collective_core::conformance::data::reference_reduce(&inputs, dtype),
        BenchOp::ReduceScatter | BenchOp::ReduceScatterMany => {
            let lanes = op.lanes();
            let lane_bytes = n / lanes * esize;
            let shard = lane_bytes / world;
            let mut out = Vec::with_capacity(shard * lanes);
            for l in 0..lanes {
                let lane: Vec<Vec<u8>> =
                    inputs.iter().map(|i| i[l * lane_bytes..(l + 1) * lane_bytes].to_vec()).collect();
                let full = collective_core::conformance::data::reference_reduce(&lane, dtype);
                out.extend_from_slice(&full[rank * shard..(rank + 1) * shard]);
            }
            out
        }
    }
}

/// Buffers of one op row.
struct OpBufs<Buf> {
    input: Buf,
    outs: Vec<Buf>,
}

/// Enqueues one call of `op` on `n` input elements per rank.
fn call<B: BenchBackend>(b: &B, op: BenchOp, dtype: DType, n: usize, bufs: &mut OpBufs<B::Buf>) -> anyhow::Result<()> {
    enqueue_call(b, op, dtype, n, bufs)
}

/// Enqueues one call of `op` on the rank's stream (see [`call`]).
fn enqueue_call<B: BenchBackend>(
    b: &B,
    op: BenchOp,
    dtype: DType,
    n: usize,
    bufs: &mut OpBufs<B::Buf>,
) -> anyhow::Result<()> {
    let (comm, stream) = (b.comm(), b.stream());
    let world = comm.world_size();
    let out_lens = output_lens(op, n, world);
    match op {
        BenchOp::ReduceScatterMany => {
            let lane = n / op.lanes();
            let esize = dtype.size();
            let lanes: Vec<Io<'_>> = bufs
                .outs
                .iter_mut()
                .zip(&out_lens)
                .enumerate()
                .map(|(l, (out, &m))| Io::OutOfPlace {
                    input: b.view(&bufs.input, l * lane * esize, lane, dtype),
                    output: b.view_mut(out, 0, m, dtype),
                })
                .collect();
            comm.reduce_scatter_many(&lanes, stream)?;
        }
        _ => {
            let io = single_io(b, dtype, n, out_lens[0], bufs);
            match op {
                BenchOp::AllReduce => comm.all_reduce(io, stream)?,
                BenchOp::AllGather => comm.all_gather(io, stream)?,
                _ => comm.reduce_scatter(io, stream)?,
            }
        }
    }
    Ok(())
}

/// The one-lane input/output views of a call on `n` input elements.
fn single_io<'a, B: BenchBackend>(b: &B, dtype: DType, n: usize, m: usize, bufs: &'a mut OpBufs<B::Buf>) -> Io<'a> {
    Io::OutOfPlace { input: b.view(&bufs.input, 0, n, dtype), output: b.view_mut(&mut bufs.outs[0], 0, m, dtype) }
}

/// Largest |got - want| over the elements (as f64; NaN when either is not finite).
pub fn max_abs_diff(got: &[u8], want: &[u8], dtype: DType) -> f64 {
    let value = |bytes: &[u8], i: usize| {
        let bits = collective_core::conformance::data::bits_at(bytes, dtype, i);
        match dtype {
            DType::F32 => f64::from(f32::from_bits(bits)),
            DType::F16 => f64::from(half::f16::from_bits(bits as u16)),
            _ => f64::from(half::bf16::from_bits(bits as u16)),
        }
    };
    (0..got.len().min(want.len()) / dtype.size()).map(|i| (value(got, i) - value(want, i)).abs()).fold(0.0, f64::max)
}

fn read_outs<B: BenchBackend>(b: &B, outs: &[B::Buf], lens: &[usize], dtype: DType) -> anyhow::Result<Vec<u8>> {
    let mut all = Vec::new();
    for (o, &m) in outs.iter().zip(lens) {
        all.extend(b.read(o, m * dtype.size())?);
    }
    Ok(all)
}

/// Times `samples` x `iterations` calls of `f`, a barrier before each sample; seconds per call.
/// With `--graph`, the calls are captured once and each sample replays them.
fn sample<B: BenchBackend>(
    b: &B,
    boot: &dyn Bootstrap,
    args: &BenchArgs,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<Vec<f64>> {
    if args.graph {
        let graph = capture_all(b, boot, args, &mut f)?;
        let lat = replay_samples(b, boot, args, &graph, true)?;
        release(b, boot, graph)?;
        return Ok(lat);
    }
    let mut lat = Vec::with_capacity(args.samples);
    for _ in 0..args.samples {
        boot.barrier().context("barrier before a sample")?;
        let mark = b.start_timer()?;
        for _ in 0..args.iterations {
            f()?;
        }
        lat.push(b.elapsed(mark)?.as_secs_f64() / args.iterations as f64);
    }
    Ok(lat)
}

/// `--graph`: captures `iterations` calls of `f` into one graph on every rank and replays it
/// once untimed (the warm-up). Every rank drains its stream and meets the others before
/// capturing (no rank instantiates while a peer's eager call still waits for it), and every
/// rank has instantiated before any replays (the all-gather of the verdicts); a rank that
/// failed to capture makes every rank fail.
fn capture_all<B: BenchBackend>(
    b: &B,
    boot: &dyn Bootstrap,
    args: &BenchArgs,
    f: &mut dyn FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<B::Graph> {
    b.drain()?;
    boot.barrier().context("barrier before the graph capture")?;
    let captured = b.capture(args.iterations, f);
    let verdicts = boot.all_gather_bytes(&[u8::from(captured.is_ok())]).context("agreeing on the graph capture")?;
    let graph = captured.context("capturing the graph")?;
    if let Some(q) = verdicts.iter().position(|v| v.first() != Some(&1)) {
        anyhow::bail!("rank {q} could not capture its graph");
    }
    b.replay(&graph).context("the warm-up replay")?;
    Ok(graph)
}

/// `samples` x (barrier, `--replays` back-to-back replays of `graph`), timed where `timed`;
/// seconds per call.
fn replay_samples<B: BenchBackend>(
    b: &B,
    boot: &dyn Bootstrap,
    args: &BenchArgs,
    graph: &B::Graph,
    timed: bool,
) -> anyhow::Result<Vec<f64>> {
    let mut lat = Vec::with_capacity(args.samples);
    let calls = args.replays.checked_mul(args.iterations).context("--replays x --iterations overflows")?;
    for _ in 0..args.samples {
        boot.barrier().context("barrier before a sample")?;
        if timed {
            let mark = b.start_timer()?;
            for _ in 0..args.replays {
                b.replay(graph)?;
            }
            lat.push(b.elapsed(mark)?.as_secs_f64() / calls as f64);
        }
    }
    Ok(lat)
}

/// Destroys `graph` once every rank's replays have completed.
fn release<B: BenchBackend>(b: &B, boot: &dyn Bootstrap, graph: B::Graph) -> anyhow::Result<()> {
    b.drain()?;
    boot.barrier().context("barrier after the replays")?;
    drop(graph);
    Ok(())
}

/// Measures the empty-kernel row on this rank: every rank launching the empty kernel at once.
pub fn measure_empty<B: BenchBackend>(b: &B, boot: &dyn Bootstrap, args: &BenchArgs) -> anyhow::Result<RankRow> {
    boot.barrier().context("barrier before the first empty kernel")?;
    b.empty_kernel()?;
    b.drain()?;
    if !args.graph {
        for _ in 0..args.warmup {
            b.empty_kernel()?;
        }
    }
    let latencies = sample(b, boot, args, || b.empty_kernel())?;
    Ok(RankRow {
        latencies,
        alone: Vec::new(),
        first: 0,
        last: 0,
        reference_ok: true,
        mismatch: None,
        workspace_bytes: 0,
        peak_temp_bytes: 0,
        native: Vec::new(),
        native_max_abs_diff: None,
    })
}

/// Measures one op row on this rank.
pub fn measure_op<B: BenchBackend>(
    b: &B,
    boot: &dyn Bootstrap,
    args: &BenchArgs,
    op: BenchOp,
    size: usize,
) -> anyhow::Result<RankRow> {
    let dtype = args.dtype.dtype();
    let (rank, world) = (b.comm().rank(), b.comm().world_size());
    let n = size / dtype.size();
    let out_lens = output_lens(op, n, world);
    let reference = RowReference::of(args.seed, op, dtype, size, world);
    let mut input = b.alloc(size)?;
    b.write(&mut input, reference.input(rank))?;
    let outs = out_lens.iter().map(|&m| b.alloc(m * dtype.size())).collect::<anyhow::Result<Vec<_>>>()?;
    let mut bufs = OpBufs { input, outs };

    boot.barrier().context("barrier before the first call")?;
    call(b, op, dtype, n, &mut bufs).with_context(|| format!("first {} call", op.name()))?;
    let got = read_outs(b, &bufs.outs, &out_lens, dtype)?;
    let check = reference.check(rank, &got);
    let first = digest(&got);
    drop(got);

    // Under --graph the warm-up is the graph's untimed replay.
    if !args.graph {
        for _ in 0..args.warmup {
            call(b, op, dtype, n, &mut bufs)?;
        }
    }
    let latencies = sample(b, boot, args, || call(b, op, dtype, n, &mut bufs))?;
    let last = digest(&read_outs(b, &bufs.outs, &out_lens, dtype)?);

    // The native library's reference on the same buffers (after the strict output was read).
    // `has_native` is the same on every rank: what it depends on was agreed at construction.
    // No native reference under --graph (it would not be measured the same way).
    let mut native = Vec::new();
    let mut native_max_abs_diff = None;
    for kind in NativeKind::ALL {
        if args.graph || !b.has_native(kind, op) {
            native.push(Vec::new());
            continue;
        }
        boot.barrier().context("barrier before the first native call")?;
        b.native(kind, op, single_io(b, dtype, n, out_lens[0], &mut bufs))
            .with_context(|| format!("first native {kind:?} call"))?;
        if kind == NativeKind::Default {
            let got = read_outs(b, &bufs.outs, &out_lens, dtype)?;
            native_max_abs_diff = Some(max_abs_diff(&got, &reference.expected(rank), dtype));
        }
        for _ in 0..args.warmup {
            b.native(kind, op, single_io(b, dtype, n, out_lens[0], &mut bufs))?;
        }
        native.push(sample(b, boot, args, || b.native(kind, op, single_io(b, dtype, n, out_lens[0], &mut bufs)))?);
    }
    Ok(RankRow {
        latencies,
        alone: Vec::new(),
        first,
        last,
        reference_ok: check.is_ok(),
        mismatch: check.err().map(|e| format!("rank {rank}: {e}")),
        workspace_bytes: b.workspace_bytes(),
        peak_temp_bytes: b.peak_temp_bytes(),
        native,
        native_max_abs_diff,
    })
}

/// Measures the copy baseline of `size` bytes on this rank: all ranks at once, then rank 0 alone.
pub fn measure_copy<B: BenchBackend>(
    b: &B,
    boot: &dyn Bootstrap,
    args: &BenchArgs,
    size: usize,
) -> anyhow::Result<RankRow> {
    let dtype = args.dtype.dtype();
    let rank = b.comm().rank();
    let data = rank_input(args.seed, BenchOp::AllReduce, dtype, size, size / dtype.size(), rank);
    let mut src = b.alloc(size)?;
    b.write(&mut src, &data)?;
    let mut dst = b.alloc(size)?;
    boot.barrier().context("barrier before the first copy")?;
    b.copy(&mut dst, &src, size)?;
    let got = b.read(&dst, size)?;
    let ok = got == data;
    let first = digest(&got);
    let (latencies, alone) = if args.graph {
        // One graph of copies, replayed by every rank at once, then by rank 0 alone.
        let mut copy = || b.copy(&mut dst, &src, size);
        let graph = capture_all(b, boot, args, &mut copy)?;
        let all = replay_samples(b, boot, args, &graph, true)?;
        let alone = replay_samples(b, boot, args, &graph, rank == 0)?;
        release(b, boot, graph)?;
        (all, alone)
    } else {
        for _ in 0..args.warmup {
            b.copy(&mut dst, &src, size)?;
        }
        let all = sample(b, boot, args, || b.copy(&mut dst, &src, size))?;
        let mut alone = Vec::new();
        for _ in 0..args.samples {
            boot.barrier().context("barrier before a one-rank copy sample")?;
            if rank == 0 {
                let mark = b.start_timer()?;
                for _ in 0..args.iterations {
                    b.copy(&mut dst, &src, size)?;
                }
                alone.push(b.elapsed(mark)?.as_secs_f64() / args.iterations as f64);
            }
        }
        (all, alone)
    };
    boot.barrier().context("barrier after the one-rank copy samples")?;
    let last = digest(&b.read(&dst, size)?);
    Ok(RankRow {
        latencies,
        alone,
        first,
        last,
        reference_ok: ok,
        mismatch: (!ok).then(|| format!("rank {rank}: the copy differs from its source")),
        workspace_bytes: 0,
        peak_temp_bytes: 0,
        native: Vec::new(),
        native_max_abs_diff: None,
    })
}

/// Exchanges `mine` through the bootstrap; every rank's row, in rank order.
pub fn exchange(boot: &dyn Bootstrap, mine: &RankRow) -> anyhow::Result<Vec<RankRow>> {
    let bytes = serde_json::to_vec(mine)?;
    let all = boot.all_gather_bytes(&bytes).context("exchanging the row's measurements")?;
    all.iter()
        .enumerate()
        .map(|(r, b)| serde_json::from_slice(b).with_context(|| format!("rank {r}'s measurements")))
        .collect()
}

/// Builds the report row of `kind` from every rank's measurements (same result on every rank);
/// `copy` and `empty` are the baseline rows of the same size, when measured.
#[allow(clippy::too_many_arguments)]
pub fn assemble(
    kind: RowKind,
    size: usize,
    args: &BenchArgs,
    world: usize,
    route: &str,
    ranks: &[RankRow],
    copy: Option<&Row>,
    empty: Option<&Row>,
) -> Row {
    let dtype = args.dtype.dtype();
    let per_rank: Vec<Vec<f64>> = ranks.iter().map(|r| r.latencies.clone()).collect();
    let (s, medians) =
        slowest_rank(&per_rank).unwrap_or((Summary { median: f64::NAN, min: f64::NAN, max: f64::NAN }, vec![]));
    let us = |x: f64| x * 1e6;
    let repeat_each = ranks.iter().all(|r| r.first == r.last);
    let n = size / dtype.size();
    let (operation, lanes, out_bytes, replicated) = match kind {
        RowKind::Copy => ("memcpy", 1, size, false),
        RowKind::EmptyKernel => (EMPTY_KERNEL, 1, 0, false),
        RowKind::Op(op) => {
            let out: usize = output_lens(op, n, world).iter().sum::<usize>() * dtype.size();
            (op.name(), op.lanes(), out, matches!(op, BenchOp::AllReduce | BenchOp::AllGather))
        }
    };
    // Outputs every rank holds identically must hash the same on every rank.
    let same_across = !replicated || ranks.windows(2).all(|w| w[0].last == w[1].last);
    let alone = ranks.first().and_then(|r| Summary::of(&r.alone)).map(|s| us(s.median));
    let (copy_us, copy_alone_us) = match (kind, copy) {
        (RowKind::Copy, _) => (Some(us(s.median)), alone),
        (RowKind::EmptyKernel, _) => (None, None),
        (_, Some(c)) => (Some(c.median_us), c.memcpy_one_rank_median_us),
        _ => (None, None),
    };
    let empty_us = match kind {
        RowKind::EmptyKernel => None,
        _ => empty.map(|e| e.median_us),
    };
    let in_bytes = if kind == RowKind::EmptyKernel { 0 } else { size };
    let ratio = |base: Option<f64>| base.filter(|b| *b > 0.0).map(|b| us(s.median) / b);
    // A native reference counts only when every rank ran it.
    let native_us = |k: usize| {
        let per: Vec<Vec<f64>> = ranks.iter().map(|r| r.native.get(k).cloned().unwrap_or_default()).collect();
        if per.iter().any(Vec::is_empty) {
            return None;
        }
        slowest_rank(&per).map(|(s, _)| us(s.median))
    };
    let native_default_us = native_us(0);
    Row {
        operation: operation.to_owned(),
        dtype: dtype.name().to_owned(),
        size_bytes: size,
        input_bytes_per_rank: in_bytes,
        output_bytes_per_rank: out_bytes,
        lanes,
        route: route.to_owned(),
        graph: args.graph,
        median_us: us(s.median),
        min_us: us(s.min),
        max_us: us(s.max),
        per_rank_median_us: medians.into_iter().map(us).collect(),
        // The empty kernel moves no bytes (0, not NaN: NaN does not survive JSON).
        input_gbps: if in_bytes == 0 { 0.0 } else { gbps(size, s.median) },
        memcpy_median_us: copy_us,
        ratio_vs_memcpy: ratio(copy_us),
        memcpy_one_rank_median_us: copy_alone_us,
        ratio_vs_memcpy_one_rank: ratio(copy_alone_us),
        empty_kernel_median_us: empty_us,
        ratio_vs_empty_kernel: ratio(empty_us),
        repeat_bitwise: repeat_each && same_across,
        bitwise_vs_fixed_tree: match kind {
            RowKind::Copy | RowKind::EmptyKernel => None,
            RowKind::Op(_) => Some(ranks.iter().all(|r| r.reference_ok)),
        },
        mismatch: ranks
            .iter()
            .find_map(|r| r.mismatch.clone())
            .or_else(|| (!repeat_each).then(|| "the first and last outputs differ on some rank".to_owned()))
            .or_else(|| (!same_across).then(|| "ranks hold different outputs".to_owned())),
        workspace_bytes: ranks.iter().map(|r| r.workspace_bytes).max().unwrap_or(0),
        peak_temp_bytes: ranks.iter().map(|r| r.peak_temp_bytes).max().unwrap_or(0),
        native_default_us,
        native_tree_simple_us: native_us(1),
        ratio_vs_native: ratio(native_default_us),
        max_abs_diff_vs_native: ranks.iter().filter_map(|r| r.native_max_abs_diff).reduce(f64::max),
    }
}

/// Runs every row on this rank; returns the rows (identical on every rank), by size with the
/// copy baseline first. Rank 0 prints `[k/N] ... (eta ..)` per row and a summary to stderr.
pub fn run_rows<B: BenchBackend>(b: &B, boot: &dyn Bootstrap, args: &BenchArgs) -> anyhow::Result<Vec<Row>> {
    let (rank, world) = (b.comm().rank(), b.comm().world_size());
    anyhow::ensure!(
        boot.world_size() == world && boot.rank() == rank,
        "bootstrap (rank {} of {}) and collective (rank {rank} of {world}) disagree",
        boot.rank(),
        boot.world_size()
    );
    if args.graph {
        anyhow::ensure!(
            b.supports_graph(),
            "--graph: the {} collective does not support CUDA graph capture (capabilities().supports_graph_capture)",
            b.name()
        );
    }
    // The same on every rank (what it depends on was agreed at construction).
    let with_empty = b.has_empty_kernel();
    let dtype = args.dtype.dtype();
    let per_size = 1 + usize::from(with_empty) + args.operations.len();
    let total = args.size_bytes.len() * per_size;
    let total_weight: f64 = args.size_bytes.iter().map(|&s| progress::weight(s) * per_size as f64).sum();
    let start = std::time::Instant::now();
    let mut done_weight = 0.0;
    let mut rows: Vec<Row> = Vec::with_capacity(total);
    let mut report = |rows: &mut Vec<Row>, row: Row| {
        done_weight += progress::weight(row.size_bytes);
        if rank == 0 {
            let eta = (rows.len() + 1 < total)
                .then(|| progress::eta_secs(start.elapsed().as_secs_f64(), done_weight, total_weight))
                .flatten();
            eprintln!("{}", progress::row_line(rows.len() + 1, total, &row, eta));
        }
        rows.push(row);
    };
    for &size in &args.size_bytes {
        let empty_row = if with_empty {
            let mine = measure_empty(b, boot, args).with_context(|| format!("empty kernel (size group {size})"))?;
            let all = exchange(boot, &mine)?;
            let row = assemble(RowKind::EmptyKernel, size, args, world, EMPTY_KERNEL_ROUTE, &all, None, None);
            report(&mut rows, row.clone());
            Some(row)
        } else {
            None
        };
        let mine = measure_copy(b, boot, args, size).with_context(|| format!("memcpy baseline of {size} bytes"))?;
        let all = exchange(boot, &mine)?;
        let copy_row = assemble(RowKind::Copy, size, args, world, b.copy_name(), &all, None, empty_row.as_ref());
        report(&mut rows, copy_row.clone());
        for &op in &args.operations {
            let mine = measure_op(b, boot, args, op, size).with_context(|| format!("{} of {size} bytes", op.name()))?;
            let asked = b.comm().route(op.op(), size);
            let route = routes::effective_route(asked, op, size, dtype, world, args.capacity(), b.ll_capacity()).name();
            let all = exchange(boot, &mine)?;
            let row = assemble(RowKind::Op(op), size, args, world, route, &all, Some(&copy_row), empty_row.as_ref());
            report(&mut rows, row);
        }
    }
    if rank == 0 {
        eprintln!("{}", progress::summary(&rows, start.elapsed().as_secs_f64()));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_are_deterministic_and_distinct() {
        let a = rank_input(1, BenchOp::AllReduce, DType::BF16, 64, 32, 0);
        assert_eq!(a.len(), 64);
        assert_eq!(a, rank_input(1, BenchOp::AllReduce, DType::BF16, 64, 32, 0));
        assert_ne!(a, rank_input(1, BenchOp::AllReduce, DType::BF16, 64, 32, 1));
        assert_ne!(a, rank_input(2, BenchOp::AllReduce, DType::BF16, 64, 32, 0));
        let m = rank_input(1, BenchOp::ReduceScatterMany, DType::F32, 128, 32, 0);
        assert_eq!(m.len(), 128);
        assert_ne!(m[..64], m[64..], "lanes get different data");
    }

    #[test]
    fn expected_outputs_have_the_output_shapes() {
        let (size, dt) = (64, DType::F16);
        let n = size / dt.size();
        for op in BenchOp::ALL {
            for world in [1, 2, 4, 8] {
                let want: usize = output_lens(op, n, world).iter().sum::<usize>() * dt.size();
                assert_eq!(expected_output(3, op, dt, size, n, world, world - 1).len(), want, "{op:?} world {world}");
            }
        }
        // all_gather is the concatenation of every rank's input.
        let g = expected_output(3, BenchOp::AllGather, dt, size, n, 2, 0);
        assert_eq!(g[..size], rank_input(3, BenchOp::AllGather, dt, size, n, 0)[..]);
        assert_eq!(g[size..], rank_input(3, BenchOp::AllGather, dt, size, n, 1)[..]);
        // reduce_scatter shards tile the all_reduce result (same inputs when the op seeds agree).
        let ar = expected_output(3, BenchOp::ReduceScatter, dt, size, n, 1, 0);
        let rs: Vec<u8> = (0..4).flat_map(|r| expected_output(3, BenchOp::ReduceScatter, dt, size, n, 4, r)).collect();
        assert_eq!(rs.len(), ar.len());
    }

    fn rank_row(lat: &[f64], first: u64, last: u64, ok: bool) -> RankRow {
        RankRow {
            latencies: lat.to_vec(),
            alone: vec![],
            first,
            last,
            reference_ok: ok,
            mismatch: (!ok).then(|| "rank 1: element 0".to_owned()),
            workspace_bytes: 100,
            peak_temp_bytes: 0,
            native: vec![lat.iter().map(|x| x / 2.0).collect(), vec![]],
            native_max_abs_diff: Some(0.5),
        }
    }

    fn args() -> BenchArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct W {
            #[command(flatten)]
            a: BenchArgs,
        }
        W::parse_from(["x"]).a
    }

    #[test]
    fn assemble_reduces_across_ranks() {
        let a = args();
        let mut copy_ranks = vec![rank_row(&[1e-6, 2e-6], 5, 5, true), rank_row(&[1e-6, 1e-6], 6, 6, true)];
        copy_ranks[0].alone = vec![0.5e-6, 0.5e-6];
        let copy = assemble(RowKind::Copy, 4096, &a, 2, "host_memcpy", &copy_ranks, None, None);
        assert_eq!(copy.operation, "memcpy");
        assert!((copy.median_us - 1.5).abs() < 1e-9);
        assert_eq!(copy.memcpy_one_rank_median_us, Some(0.5));
        assert!(copy.repeat_bitwise, "copies of different data may differ across ranks");
        assert_eq!(copy.bitwise_vs_fixed_tree, None);

        let ranks = vec![rank_row(&[3e-6, 6e-6], 9, 9, true), rank_row(&[4e-6, 2e-6], 9, 9, true)];
        let row = assemble(RowKind::Op(BenchOp::AllReduce), 4096, &a, 2, "ipc_one_shot", &ranks, Some(&copy), None);
        // Slowest per sample: [4, 6] us.
        assert!((row.median_us - 5.0).abs() < 1e-9);
        assert!((row.min_us - 4.0).abs() < 1e-9 && (row.max_us - 6.0).abs() < 1e-9);
        assert!((row.ratio_vs_memcpy.unwrap() - 5.0 / 1.5).abs() < 1e-9);
        assert!((row.ratio_vs_memcpy_one_rank.unwrap() - 10.0).abs() < 1e-9);
        assert!((row.input_gbps - 4096.0 / 5e-6 / 1e9).abs() < 1e-9);
        assert_eq!(row.output_bytes_per_rank, 4096);
        assert!(row.repeat_bitwise && row.bitwise_vs_fixed_tree == Some(true));
        assert_eq!(row.workspace_bytes, 100);
        // Native default at half the latency on every rank: ratio 2; tree/simple did not run.
        assert!((row.native_default_us.unwrap() - 2.5).abs() < 1e-9);
        assert!((row.ratio_vs_native.unwrap() - 2.0).abs() < 1e-9);
        assert_eq!(row.native_tree_simple_us, None);
        assert_eq!(row.max_abs_diff_vs_native, Some(0.5));

        // Ranks disagreeing on a replicated output: not repeat-bitwise.
        let bad = vec![rank_row(&[1e-6], 9, 9, true), rank_row(&[1e-6], 8, 8, true)];
        let r = assemble(RowKind::Op(BenchOp::AllGather), 4096, &a, 2, "x", &bad, None, None);
        assert!(!r.repeat_bitwise);
        assert_eq!(r.output_bytes_per_rank, 8192);
        // ...but reduce_scatter shards differ by design.
        let r = assemble(RowKind::Op(BenchOp::ReduceScatter), 4096, &a, 2, "x", &bad, None, None);
        assert!(r.repeat_bitwise);
        // A run whose last output differs from its first, or a wrong result.
        let drift = vec![rank_row(&[1e-6], 1, 2, true), rank_row(&[1e-6], 1, 1, false)];
        let r = assemble(RowKind::Op(BenchOp::ReduceScatterMany), 4096, &a, 2, "x", &drift, None, None);
        assert!(!r.repeat_bitwise);
        assert_eq!(r.bitwise_vs_fixed_tree, Some(false));
        assert_eq!(r.mismatch.as_deref(), Some("rank 1: element 0"));
        assert!(progress::row_line(1, 1, &r, None).contains("NOT BITWISE"));
    }

    /// The in-memory reference collective with a pretend graph: `capture` runs the calls once
    /// (so outputs are real) and counts them, `replay` counts replays; the empty kernel counts
    /// launches. Checks the order of the `--graph` flow without a GPU.
    struct Counting {
        inner: super::super::backend::HostBackend<collective_core::conformance::memory::MemoryCollective>,
        captures: std::cell::Cell<usize>,
        captured_calls: std::cell::Cell<usize>,
        replays: std::cell::Cell<usize>,
        empties: std::cell::Cell<usize>,
    }

    impl BenchBackend for Counting {
        type Comm = collective_core::conformance::memory::MemoryCollective;
        type Buf = collective_core::conformance::HostBuf;
        type Mark = std::time::Instant;
        type Graph = usize;
        fn name(&self) -> &'static str {
            "counting"
        }
        fn copy_name(&self) -> &'static str {
            self.inner.copy_name()
        }
        fn comm(&self) -> &Self::Comm {
            self.inner.comm()
        }
        fn stream(&self) -> &() {
            &()
        }
        fn alloc(&self, bytes: usize) -> anyhow::Result<Self::Buf> {
            self.inner.alloc(bytes)
        }
        fn write(&self, buf: &mut Self::Buf, data: &[u8]) -> anyhow::Result<()> {
            self.inner.write(buf, data)
        }
        fn read(&self, buf: &Self::Buf, bytes: usize) -> anyhow::Result<Vec<u8>> {
            self.inner.read(buf, bytes)
        }
        fn view<'b>(&self, buf: &'b Self::Buf, o: usize, len: usize, dtype: DType) -> collective_core::RawRef<'b> {
            self.inner.view(buf, o, len, dtype)
        }
        fn view_mut<'b>(&self, buf: &'b mut Self::Buf, o: usize, len: usize, d: DType) -> collective_core::RawMut<'b> {
            self.inner.view_mut(buf, o, len, d)
        }
        fn copy(&self, dst: &mut Self::Buf, src: &Self::Buf, bytes: usize) -> anyhow::Result<()> {
            self.inner.copy(dst, src, bytes)
        }
        fn start_timer(&self) -> anyhow::Result<Self::Mark> {
            self.inner.start_timer()
        }
        fn elapsed(&self, mark: Self::Mark) -> anyhow::Result<std::time::Duration> {
            // Never zero, so medians are positive.
            Ok(self.inner.elapsed(mark)? + std::time::Duration::from_nanos(1))
        }
        fn workspace_bytes(&self) -> usize {
            0
        }
        fn peak_temp_bytes(&self) -> usize {
            0
        }
        fn supports_graph(&self) -> bool {
            true
        }
        fn capture(&self, calls: usize, f: &mut dyn FnMut() -> anyhow::Result<()>) -> anyhow::Result<usize> {
            self.captures.set(self.captures.get() + 1);
            for _ in 0..calls {
                f()?;
            }
            self.captured_calls.set(self.captured_calls.get() + calls);
            Ok(calls)
        }
        fn replay(&self, graph: &usize) -> anyhow::Result<()> {
            assert!(*graph > 0);
            self.replays.set(self.replays.get() + 1);
            Ok(())
        }
        fn has_empty_kernel(&self) -> bool {
            true
        }
        fn empty_kernel(&self) -> anyhow::Result<()> {
            self.empties.set(self.empties.get() + 1);
            Ok(())
        }
    }

    fn counting_run(graph: bool, replays: usize) -> (Vec<Row>, [usize; 4]) {
        use collective_core::bootstrap::LocalBootstrap;
        use collective_core::conformance::memory::{Flaw, MemoryCollective};
        let mut a = args();
        a.size_bytes = vec![4096];
        a.operations = vec![BenchOp::AllReduce, BenchOp::ReduceScatter];
        (a.warmup, a.iterations, a.samples, a.graph, a.replays) = (3, 4, 2, graph, replays);
        let world = 2;
        let results: Vec<(Vec<Row>, [usize; 4])> = std::thread::scope(|s| {
            let hs: Vec<_> = LocalBootstrap::group(world)
                .into_iter()
                .zip(LocalBootstrap::group(world))
                .map(|(cb, boot)| {
                    let a = &a;
                    s.spawn(move || {
                        let b = Counting {
                            inner: super::super::backend::HostBackend::new(
                                MemoryCollective::new(cb, 4096, Flaw::None),
                                "memory-reference",
                            ),
                            captures: Default::default(),
                            captured_calls: Default::default(),
                            replays: Default::default(),
                            empties: Default::default(),
                        };
                        let rows = run_rows(&b, &boot, a).unwrap();
                        (rows, [b.captures.get(), b.captured_calls.get(), b.replays.get(), b.empties.get()])
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(results[0].0, results[1].0, "every rank assembles the same rows");
        results.into_iter().next().unwrap()
    }

    #[test]
    fn graph_runs_capture_once_per_row_and_replay_each_sample() {
        let (rows, [captures, captured, replays, empties]) = counting_run(true, 1);
        let ops: Vec<&str> = rows.iter().map(|r| r.operation.as_str()).collect();
        assert_eq!(ops, [EMPTY_KERNEL, "memcpy", "all_reduce", "reduce_scatter"]);
        assert!(rows.iter().all(|r| r.graph && r.bitwise()), "{rows:?}");
        // One graph per row (empty kernel, copy, two ops), 4 calls each.
        assert_eq!((captures, captured), (4, 16));
        // Per row one warm-up replay and one per sample; the copy's graph also replays for
        // the one-rank samples (on rank 0).
        assert_eq!(replays, 4 * (1 + 2) + 2);
        // Empty kernels: the first (checked) launch, then the captured ones; no eager warm-up.
        assert_eq!(empties, 1 + 4);
        let (e, c, ar) = (&rows[0], &rows[1], &rows[2]);
        assert_eq!((e.route.as_str(), e.input_bytes_per_rank, e.input_gbps), (EMPTY_KERNEL_ROUTE, 0, 0.0));
        assert_eq!((e.empty_kernel_median_us, e.memcpy_median_us, e.bitwise_vs_fixed_tree), (None, None, None));
        assert_eq!(c.empty_kernel_median_us, Some(e.median_us));
        assert_eq!(ar.empty_kernel_median_us, Some(e.median_us));
        assert!((ar.ratio_vs_empty_kernel.unwrap() - ar.median_us / e.median_us).abs() < 1e-9);
        assert_eq!(ar.memcpy_median_us, Some(c.median_us));
    }

    #[test]
    fn graph_samples_replay_back_to_back() {
        let (rows, [captures, captured, replays, _]) = counting_run(true, 3);
        assert_eq!((captures, captured), (4, 16));
        // Per row one warm-up replay and 3 per sample; the copy's one-rank samples 3 each.
        assert_eq!(replays, 4 * (1 + 2 * 3) + 2 * 3);
        assert!(rows.iter().all(|r| r.graph && r.bitwise()), "{rows:?}");
    }

    #[test]
    fn eager_runs_never_capture() {
        let (rows, [captures, captured, replays, empties]) = counting_run(false, 1);
        assert_eq!((captures, captured, replays), (0, 0, 0));
        assert!(rows.iter().all(|r| !r.graph && r.bitwise()));
        // First launch, 3 warm-up, 2 samples x 4.
        assert_eq!(empties, 1 + 3 + 8);
    }

    #[test]
    fn max_abs_diff_reads_each_dtype() {
        let f = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(max_abs_diff(&f(&[1.0, 2.0, -3.0]), &f(&[1.0, 2.5, -1.0]), DType::F32), 2.0);
        let h = |v: &[f32]| v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect::<Vec<u8>>();
        assert_eq!(max_abs_diff(&h(&[4.0, 8.0]), &h(&[4.0, 6.0]), DType::BF16), 2.0);
        assert_eq!(max_abs_diff(&h(&[4.0]), &h(&[4.0]), DType::BF16), 0.0);
    }
}
