//! The CPU backend of `--e2e`: the layers' CPU path (`FfnShard::forward`/`forward_naive` with
//! `ReferenceGemm`, `attention::forward`) over ranks as threads of this process, through
//! `collective_factory::cpu::thread_group`; host clock.
//!
//! Stage times. The CPU API has no public per-stage functions, so:
//! * FFN: each rank also runs the same pipeline stage by stage from the crate's public pieces
//!   (the collectives, `ReferenceGemm`, `activation::silu_in_place`, `fixed_tree::reduce`) and
//!   times every stage; that staged run's output is checked bit for bit against the layer's own
//!   `forward`/`forward_naive` (a mismatch is an error), whose calls give the whole-layer time.
//! * Attention: the three all_gathers (`k`, `v`, positions) are timed as standalone calls of
//!   the same sizes, and the attention stage is the whole layer's time minus that (derived).
use super::report::{E2eRow, INVARIANT, NAIVE, StageMs, median_min_max};
use super::shapes::Plan;
use crate::harness::args::{BenchDtype, E2eLayer};
use crate::harness::progress;
use anyhow::Context;
use collective_core::{Collective, Io};
use collective_factory::{Config, cpu};
use detcoll_layers::data::SplitMix64;
use detcoll_layers::{AttentionInput, AttentionOutput, FfnShape, FfnShard, Gemm, LEAVES, ReferenceGemm, Scalar};
use half::{bf16, f16};
use std::sync::Barrier;
use std::time::Instant;

/// `backend` of CPU reports.
pub const NAME: &str = "cpu-threads";
/// `stage_method` of the FFN rows.
pub const FFN_STAGES: &str = "host clock around each stage of a staged re-run of the same pipeline from the crate's \
public pieces (its output checked bit for bit against forward/forward_naive), per call, slowest rank";
/// `stage_method` of the attention rows.
pub const ATTENTION_STAGES: &str = "all_gather: host clock around standalone all_gathers of k, v and positions of the \
same sizes; attention: whole layer minus that (derived: the CPU API has no attention-only function); slowest rank";

/// What one rank measured for one variant (and mode); both backends fill it.
#[derive(Debug, Default)]
pub(super) struct RankRun {
    /// Whole-layer time of every timed call, ms.
    pub(super) whole: Vec<f64>,
    /// Per-stage totals over the timed calls, ms, in pipeline order.
    pub(super) stages: Vec<(&'static str, f64)>,
    /// The last call's output bits (attention: `out`).
    pub(super) bits: Vec<u32>,
    /// Attention: the last call's `lse` bits.
    pub(super) lse_bits: Vec<u32>,
    /// The first timed call's output bits (all of them), for `repeat_bitwise`.
    first: Option<Vec<u32>>,
    pub(super) repeat_bitwise: bool,
}

impl RankRun {
    pub(super) fn new() -> Self {
        RankRun { repeat_bitwise: true, ..RankRun::default() }
    }

    /// A timed call of `ms` whose output had `bits`: compared with the first timed call's.
    fn timed(&mut self, ms: f64, bits: Vec<u32>) {
        self.whole.push(ms);
        match &self.first {
            None => self.first = Some(bits),
            Some(f) => self.repeat_bitwise &= *f == bits,
        }
    }

    pub(super) fn add_stage(&mut self, stage: &'static str, ms: f64) {
        match self.stages.iter_mut().find(|(s, _)| *s == stage) {
            Some((_, total)) => *total += ms,
            None => self.stages.push((stage, ms)),
        }
    }
}

pub(super) fn bits<T: Scalar>(v: &[T]) -> Vec<u32> {
    // Widening to f32 is exact and injective, so equal f32 bits are equal `T` bits.
    v.iter().map(|x| x.to_f32().to_bits()).collect()
}

fn elapsed_ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

/// Runs the whole plan on the CPU; returns the rows (naive not yet paired).
pub fn run(plan: &Plan) -> anyhow::Result<Vec<E2eRow>> {
    match plan.dtype {
        BenchDtype::Bf16 => run_typed::<bf16>(plan),
        BenchDtype::F16 => run_typed::<f16>(plan),
        BenchDtype::F32 => run_typed::<f32>(plan),
    }
}

fn run_typed<T: Scalar + Send + Sync>(plan: &Plan) -> anyhow::Result<Vec<E2eRow>> {
    let method = if plan.layer == E2eLayer::Ffn { FFN_STAGES } else { ATTENTION_STAGES };
    sweep(plan, |tokens, tp, inputs: &Inputs<T>| {
        let runs = match plan.layer {
            E2eLayer::Ffn => ffn_group(plan, plan.ffn_shape(tokens), tp, inputs)?,
            E2eLayer::Attention => attention_group(plan, tokens, tp, inputs)?,
        };
        Ok(runs.into_iter().map(|(variant, ranks)| ((variant, "eager"), ranks, method)).collect())
    })
}

/// What one group of ranks gave: per (variant, mode) every rank's run and how its stages
/// were timed.
pub(super) type GroupRuns = Vec<((&'static str, &'static str), Vec<RankRun>, &'static str)>;

/// Every token count and size of `plan` through `group` (one group of ranks per token count
/// and size), with a progress line per group; the rows in run order.
pub(super) fn sweep<T: Scalar>(
    plan: &Plan,
    mut group: impl FnMut(usize, usize, &Inputs<T>) -> anyhow::Result<GroupRuns>,
) -> anyhow::Result<Vec<E2eRow>> {
    let started = Instant::now();
    let total = plan.tokens.len() * plan.tps.len();
    let total_weight: f64 = plan.tokens.iter().map(|&t| t as f64 * plan.tps.len() as f64).sum();
    let mut done_weight = 0.0;
    let mut rows = Vec::new();
    let mut k = 0;
    for &tokens in &plan.tokens {
        let mut reference: Vec<(&'static str, Vec<u32>)> = Vec::new();
        let inputs = Inputs::<T>::new(plan, tokens);
        for &tp in &plan.tps {
            let here = rows.len();
            k += 1;
            for (key, ranks, method) in group(tokens, tp, &inputs)? {
                rows.push(assemble(plan, (tokens, tp), key, &ranks, method, &mut reference));
            }
            done_weight += tokens as f64;
            let eta = progress::eta_secs(started.elapsed().as_secs_f64(), done_weight, total_weight);
            eprintln!("{}", progress_line(k, total, &rows[here..], eta));
        }
    }
    Ok(rows)
}

/// `[2/12] ffn bf16 64 tokens tp 2 eager: invariant 1.23 ms, naive 1.01 ms (eta 3s)`.
pub(super) fn progress_line(k: usize, n: usize, rows: &[E2eRow], eta: Option<f64>) -> String {
    let eta = eta.map(|e| format!(" (eta {})", progress::duration(e))).unwrap_or_default();
    let Some(first) = rows.first() else { return format!("[{k}/{n}] (no rows){eta}") };
    let par = if first.layer.starts_with("ffn") { "tp" } else { "cp" };
    let times: Vec<String> = rows
        .iter()
        .map(|r| {
            let bad = if r.elements_differing > 0 && r.variant == INVARIANT { " NOT BITWISE" } else { "" };
            format!("{} {} {:.3} ms{bad}", r.variant, r.mode, r.whole_ms)
        })
        .collect();
    format!(
        "[{k}/{n}] {} {} {} tokens {par} {}: {}{eta}",
        first.layer,
        first.dtype,
        first.tokens,
        first.tp,
        times.join(", ")
    )
}

/// A row from every rank's run of one variant; the first size of the run is the bitwise
/// reference of each variant.
fn assemble_row(
    plan: &Plan,
    tokens: usize,
    tp: usize,
    (variant, mode): (&'static str, &str),
    whole_per_rank: &[Vec<f64>],
    stages: Vec<StageMs>,
    stage_method: &str,
) -> E2eRow {
    let calls = whole_per_rank.iter().map(Vec::len).min().unwrap_or(0);
    let slowest: Vec<f64> =
        (0..calls).map(|i| whole_per_rank.iter().map(|w| w[i]).fold(f64::NEG_INFINITY, f64::max)).collect();
    let (whole_ms, whole_min_ms, whole_max_ms) = median_min_max(&slowest);
    let ffn = plan.layer == E2eLayer::Ffn;
    E2eRow {
        layer: plan.layer_name().to_owned(),
        variant: variant.to_owned(),
        dtype: plan.dtype.dtype().name().to_owned(),
        tokens,
        hidden: ffn.then_some(plan.hidden),
        ffn: ffn.then_some(plan.ffn),
        heads: (!ffn).then_some(plan.heads),
        head_dim: (!ffn).then_some(plan.head_dim),
        tp,
        mode: mode.to_owned(),
        iterations: plan.iterations,
        stages,
        stage_method: stage_method.to_owned(),
        whole_ms,
        whole_min_ms,
        whole_max_ms,
        per_rank_whole_ms: whole_per_rank.iter().map(|w| median_min_max(w).0).collect(),
        naive_ms: None,
        invariance_cost: None,
        reference_tp: plan.tps[0],
        elements: 0,
        elements_differing: 0,
        repeat_bitwise: true,
    }
}

/// Counts the elements of `got` whose bits differ from the variant's reference output, which
/// the first size of the run sets.
pub(super) fn compare_with_reference(
    reference: &mut Vec<(&'static str, Vec<u32>)>,
    variant: &'static str,
    got: Vec<u32>,
) -> (usize, usize) {
    let n = got.len();
    match reference.iter().find(|(v, _)| *v == variant) {
        Some((_, want)) => {
            let differing = if want.len() == n { want.iter().zip(&got).filter(|(a, b)| a != b).count() } else { n };
            (n, differing)
        }
        None => {
            reference.push((variant, got));
            (n, 0)
        }
    }
}

/// The row of one (variant, mode) from every rank's run; `method` says how its stages were
/// timed.
pub(super) fn assemble(
    plan: &Plan,
    (tokens, tp): (usize, usize),
    (variant, mode): (&'static str, &str),
    ranks: &[RankRun],
    method: &str,
    reference: &mut Vec<(&'static str, Vec<u32>)>,
) -> E2eRow {
    let whole: Vec<Vec<f64>> = ranks.iter().map(|r| r.whole.clone()).collect();
    let calls = plan.iterations.max(1) as f64;
    // Each stage: the slowest rank's total / calls.
    let stages = ranks[0]
        .stages
        .iter()
        .map(|(name, _)| StageMs {
            stage: (*name).to_owned(),
            ms: ranks
                .iter()
                .filter_map(|r| r.stages.iter().find(|(s, _)| s == name).map(|(_, t)| *t / calls))
                .fold(0.0, f64::max),
        })
        .collect();
    let mut row = assemble_row(plan, tokens, tp, (variant, mode), &whole, stages, method);
    // Rank order is token order: the concatenation is the whole output.
    let mut all: Vec<u32> = ranks.iter().flat_map(|r| r.bits.iter().copied()).collect();
    all.extend(ranks.iter().flat_map(|r| r.lse_bits.iter().copied()));
    (row.elements, row.elements_differing) = compare_with_reference(reference, variant, all);
    row.repeat_bitwise = ranks.iter().all(|r| r.repeat_bitwise);
    row
}

/// The seeded inputs of one token count (every size slices the same tensors; both backends).
pub(super) struct Inputs<T> {
    pub(super) x: Vec<T>,
    pub(super) w1: Vec<T>,
    pub(super) w2: Vec<T>,
    /// The gated FFN's up projection (`--gated`); empty otherwise.
    pub(super) w3: Vec<T>,
    pub(super) q: Vec<T>,
    pub(super) k: Vec<T>,
    pub(super) v: Vec<T>,
}

impl<T: Scalar> Inputs<T> {
    pub(super) fn new(plan: &Plan, tokens: usize) -> Self {
        let mut rng = SplitMix64::new(plan.seed ^ tokens as u64);
        match plan.layer {
            E2eLayer::Ffn => {
                let (h, f) = (plan.hidden, plan.ffn);
                let x = rng.values(tokens * h, 1.0);
                let w1 = rng.values(h * f, 1.0 / (h as f32).sqrt());
                let w2 = rng.values(f * h, 1.0 / (f as f32).sqrt());
                let w3 = if plan.gated { rng.values(h * f, 1.0 / (h as f32).sqrt()) } else { vec![] };
                Inputs { x, w1, w2, w3, q: vec![], k: vec![], v: vec![] }
            }
            E2eLayer::Attention => {
                let n = tokens * plan.heads * plan.head_dim;
                let (q, k, v) = (rng.values(n, 1.0), rng.values(n, 1.0), rng.values(n, 1.0));
                Inputs { x: vec![], w1: vec![], w2: vec![], w3: vec![], q, k, v }
            }
        }
    }
}

/// Capacity of the CPU collective: the largest message (calls above it are chunked).
fn config(plan: &Plan) -> Config {
    Config::new().with_capacity(plan.largest_message_bytes().max(1 << 16))
}

/// Runs `body` on every rank of a `tp`-rank CPU thread group; `body` gets the rank's
/// collective and a barrier shared by all ranks.
fn on_ranks<R: Send>(
    plan: &Plan,
    tp: usize,
    body: impl Fn(&cpu::CpuCollective, &Barrier) -> anyhow::Result<R> + Sync,
) -> anyhow::Result<Vec<R>> {
    let ranks = cpu::thread_group(tp, &config(plan)).context("building the CPU thread group")?;
    let barrier = Barrier::new(tp);
    let results: Vec<anyhow::Result<R>> = std::thread::scope(|s| {
        let hs: Vec<_> = ranks
            .iter()
            .map(|comm| {
                s.spawn(|| {
                    let r = body(comm, &barrier);
                    // Collective: every rank closes, also after a failed body.
                    let closed = comm.close().context("closing the CPU collective");
                    let r = r?;
                    closed.map(|()| r)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a rank thread panicked")))).collect()
    });
    results.into_iter().enumerate().map(|(r, res)| res.with_context(|| format!("rank {r} of {tp}"))).collect()
}

/// One rank's weights, sliced here as `FfnShard::from_full` (`from_full_gated`) slices them
/// (the shard keeps its own private), for the staged re-run.
struct StagedShard<T> {
    shape: FfnShape,
    tp: usize,
    w1: Vec<T>,
    w2: Vec<T>,
    /// The gated FFN's up projection shard; `None`: SiLU alone.
    w3: Option<Vec<T>>,
}

impl<T: Scalar> StagedShard<T> {
    /// `w3` empty: the plain FFN.
    fn new(shape: FfnShape, w1: &[T], w3: &[T], w2: &[T], tp: usize, rank: usize) -> Self {
        let (h, f) = (shape.hidden, shape.ffn);
        let cols = rank * f / tp..(rank + 1) * f / tp;
        let columns = |w: &[T]| w.chunks_exact(f).take(h).flat_map(|row| &row[cols.clone()]).copied().collect();
        let w3 = (!w3.is_empty()).then(|| columns(w3));
        let w2 = w2[cols.start * h..cols.end * h].to_vec();
        StagedShard { shape, tp, w1: columns(w1), w2, w3 }
    }

    /// The pipeline of `FfnShard::forward` (or `forward_naive`), stage by stage, each timed.
    fn forward<C: Collective<Stream = ()>>(
        &self,
        comm: &C,
        naive: bool,
        x_local: &[T],
        out_local: &mut [T],
        time: &mut dyn FnMut(&'static str, f64),
    ) -> anyhow::Result<()> {
        let (s, h, fk) = (self.shape.tokens, self.shape.hidden, self.shape.ffn / self.tp);
        let zero = T::from_f32(0.0);
        let t = Instant::now();
        let mut x = vec![zero; s * h];
        comm.all_gather(Io::host(x_local, &mut x), &())?;
        time("all_gather", elapsed_ms(t));
        let t = Instant::now();
        let mut act = vec![zero; s * fk];
        ReferenceGemm.gemm(&x, &self.w1, s, h, fk, &mut act)?;
        let mut up = Vec::new();
        if let Some(w3) = &self.w3 {
            up = vec![zero; s * fk];
            ReferenceGemm.gemm(&x, w3, s, h, fk, &mut up)?;
        }
        time("gemm1", elapsed_ms(t));
        let t = Instant::now();
        match self.w3 {
            None => detcoll_layers::activation::silu_in_place(&mut act),
            Some(_) => detcoll_layers::activation::silu_mul_in_place(&mut act, &up),
        }
        time("activation", elapsed_ms(t));
        let t = Instant::now();
        let mut partial = vec![zero; s * h];
        if naive {
            ReferenceGemm.gemm(&act, &self.w2, s, fk, h, &mut partial)?;
            time("gemm2", elapsed_ms(t));
        } else {
            let w = self.shape.leaf_width();
            let mut a_leaf = vec![zero; s * w];
            let products = (0..LEAVES / self.tp)
                .map(|j| {
                    for (dst, src) in a_leaf.chunks_exact_mut(w).zip(act.chunks_exact(fk)) {
                        dst.copy_from_slice(&src[j * w..(j + 1) * w]);
                    }
                    let mut p = vec![zero; s * h];
                    ReferenceGemm.gemm(&a_leaf, &self.w2[j * w * h..(j + 1) * w * h], s, w, h, &mut p)?;
                    Ok(p)
                })
                .collect::<anyhow::Result<Vec<_>>>()?;
            time("gemm2", elapsed_ms(t));
            let t = Instant::now();
            let refs: Vec<&[T]> = products.iter().map(Vec::as_slice).collect();
            fixed_tree::reduce(&refs, &mut partial)?;
            time("leaf_fold", elapsed_ms(t));
        }
        let t = Instant::now();
        comm.reduce_scatter(Io::host(&partial, out_local), &())?;
        time("reduce_scatter", elapsed_ms(t));
        Ok(())
    }
}

/// The invariant and the naive FFN at one TP size: whole-layer calls, then the staged re-run.
fn ffn_group<T: Scalar + Send + Sync>(
    plan: &Plan,
    shape: FfnShape,
    tp: usize,
    inputs: &Inputs<T>,
) -> anyhow::Result<Vec<(&'static str, Vec<RankRun>)>> {
    let per_rank = on_ranks(plan, tp, |comm, barrier| {
        let r = comm.rank();
        let rows = shape.local_len(tp);
        let x_local = &inputs.x[r * rows..(r + 1) * rows];
        let shard = if plan.gated {
            FfnShard::from_full_gated(shape, &inputs.w1, &inputs.w3, &inputs.w2, tp, r)?
        } else {
            FfnShard::from_full(shape, &inputs.w1, &inputs.w2, tp, r)?
        };
        let staged = StagedShard::new(shape, &inputs.w1, &inputs.w3, &inputs.w2, tp, r);
        let mut out = vec![T::from_f32(0.0); rows];
        let mut runs = Vec::new();
        for (variant, naive) in [(INVARIANT, false), (NAIVE, true)] {
            let mut run = RankRun::new();
            for i in 0..plan.warmup + plan.iterations {
                barrier.wait();
                let t = Instant::now();
                if naive {
                    shard.forward_naive(comm, &ReferenceGemm, x_local, &mut out)?;
                } else {
                    shard.forward(comm, &ReferenceGemm, x_local, &mut out)?;
                }
                let dt = elapsed_ms(t);
                if i >= plan.warmup {
                    run.timed(dt, bits(&out));
                }
            }
            run.bits = bits(&out);
            let mut staged_out = vec![T::from_f32(0.0); rows];
            for i in 0..plan.warmup + plan.iterations {
                barrier.wait();
                let timed = i >= plan.warmup;
                staged.forward(comm, naive, x_local, &mut staged_out, &mut |s, ms| {
                    if timed {
                        run.add_stage(s, ms);
                    }
                })?;
            }
            anyhow::ensure!(
                bits(&staged_out) == run.bits,
                "the staged {variant} FFN does not reproduce the layer's bits: its stage times would not be the \
                 layer's"
            );
            runs.push((variant, run));
        }
        Ok(runs)
    })?;
    transpose(per_rank)
}

/// Per rank `[(variant, run)]` into per variant `[run of rank 0, rank 1, ...]`.
pub(super) fn transpose<K: PartialEq, R>(per_rank: Vec<Vec<(K, R)>>) -> anyhow::Result<Vec<(K, Vec<R>)>> {
    let mut out: Vec<(K, Vec<R>)> = Vec::new();
    for runs in per_rank {
        for (variant, run) in runs {
            match out.iter_mut().find(|(v, _)| *v == variant) {
                Some((_, v)) => v.push(run),
                None => out.push((variant, vec![run])),
            }
        }
    }
    Ok(out)
}

/// The CP attention at one CP size: whole-layer calls, then the standalone all_gathers.
fn attention_group<T: Scalar + Send + Sync>(
    plan: &Plan,
    tokens: usize,
    cp: usize,
    inputs: &Inputs<T>,
) -> anyhow::Result<Vec<(&'static str, Vec<RankRun>)>> {
    let shape = plan.attention_shape(tokens);
    let per_rank = on_ranks(plan, cp, |comm, barrier| {
        let r = comm.rank();
        let n = tokens / cp;
        let e = n * shape.token_len();
        let block = |v: &[T]| v[r * e..(r + 1) * e].to_vec();
        let (q, k, v) = (block(&inputs.q), block(&inputs.k), block(&inputs.v));
        let positions: Vec<u32> = (r * n..(r + 1) * n).map(|p| p as u32).collect();
        let input = AttentionInput { q: &q, k: &k, v: &v, positions: &positions };
        let (mut out, mut lse) = (vec![T::from_f32(0.0); e], vec![0f32; n * shape.heads]);
        let mut run = RankRun::new();
        let mut gather_total = 0.0;
        let (mut k_all, mut v_all) = (vec![T::from_f32(0.0); tokens * shape.token_len()], Vec::new());
        v_all.clone_from(&k_all);
        let mut pos_all = vec![0u32; tokens];
        for i in 0..plan.warmup + plan.iterations {
            barrier.wait();
            let t = Instant::now();
            detcoll_layers::attention::forward(comm, shape, input, AttentionOutput { out: &mut out, lse: &mut lse })?;
            let dt = elapsed_ms(t);
            barrier.wait();
            let t = Instant::now();
            comm.all_gather(Io::host(&k, &mut k_all), &())?;
            comm.all_gather(Io::host(&v, &mut v_all), &())?;
            comm.all_gather(Io::host(&positions, &mut pos_all), &())?;
            let gather = elapsed_ms(t);
            if i >= plan.warmup {
                gather_total += gather;
                let mut b = bits(&out);
                b.extend(lse.iter().map(|x| x.to_bits()));
                run.timed(dt, b);
            }
        }
        run.bits = bits(&out);
        run.lse_bits = lse.iter().map(|x| x.to_bits()).collect();
        let whole_total: f64 = run.whole.iter().sum();
        run.add_stage("all_gather", gather_total);
        run.add_stage("attention", (whole_total - gather_total).max(0.0));
        Ok(vec![(INVARIANT, run)])
    })?;
    transpose(per_rank)
}
