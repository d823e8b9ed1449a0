//! The GPU FFN on one host (all ranks on GPU 0 of a one-GPU host, one thread and stream each):
//! the TP-invariant layer has the same output bits at TP = 1, 2, 4 and 8 and run to run; the
//! naive layer's bits change with TP (and differ from the invariant layer's at TP = 1, 2, 4; at
//! TP = 8 it makes the invariant layer's very calls); a captured CUDA graph replays the same
//! bits as the eager forward; wrong sizes are typed errors that leave the output untouched. The
//! same for the gated FFN (SwiGLU, `CudaFfnShard::from_full_gated`), whose f32 output is also
//! checked against the CPU reference within a tolerance (the GPU's GEMMs and `expf` are not the
//! CPU's: a check that the gate, the up projection and the leaves are wired as defined, not of
//! bits).
//! Skips, saying so, without a GPU. Run with `CUDA_DEVICE_MAX_CONNECTIONS=32` (what
//! `cargo xtask gpu-test` sets).
#![cfg(feature = "cuda")]
mod common;

use common::gpu::{Rank, download, group, on_ranks, upload};
use common::{bits, differing};
use cudarc::driver::sys;
use detcoll_layers::cuda::{CudaFfnShard, CudaGemm, CudaKernels, CudaScalar, Lockstep, StageEvents, StageHook};
use detcoll_layers::data::SplitMix64;
use detcoll_layers::{Error, FfnShape};
use half::bf16;

const SHAPE: FfnShape = FfnShape { tokens: 256, hidden: 512, ffn: 1024 };
const CAPACITY: usize = 4 << 20;

struct Inputs<T> {
    x: Vec<T>,
    w1: Vec<T>,
    w2: Vec<T>,
    /// The gated FFN's up projection; `None`: SiLU alone.
    w3: Option<Vec<T>>,
    /// Each rank built from its own shards (`from_shards*`) instead of the full matrices.
    shards: bool,
}

fn inputs<T: CudaScalar>(shape: FfnShape, seed: u64) -> Inputs<T> {
    let mut rng = SplitMix64::new(seed);
    Inputs {
        x: rng.values(shape.tokens * shape.hidden, 1.0),
        w1: rng.values(shape.hidden * shape.ffn, 1.0 / (shape.hidden as f32).sqrt()),
        w2: rng.values(shape.ffn * shape.hidden, 1.0 / (shape.ffn as f32).sqrt()),
        w3: None,
        shards: false,
    }
}

/// [`inputs`] with an up projection: the gated FFN.
fn gated_inputs<T: CudaScalar>(shape: FfnShape, seed: u64) -> Inputs<T> {
    let mut inp = inputs(shape, seed);
    inp.w3 = Some(SplitMix64::new(seed ^ 0x9a7e).values(shape.hidden * shape.ffn, 1.0 / (shape.hidden as f32).sqrt()));
    inp
}

impl<T: CudaScalar> Inputs<T> {
    /// Rank `rank`'s shard at TP = `tp`, gated when there is a `w3`.
    fn shard(
        &self,
        s: &std::sync::Arc<cudarc::driver::CudaStream>,
        tp: usize,
        rank: usize,
    ) -> Result<CudaFfnShard<T>, Error> {
        if self.shards {
            // What a per-rank checkpoint holds: columns of W1 and W3, the same rows of W2.
            let (f, h, fk) = (SHAPE.ffn, SHAPE.hidden, SHAPE.ffn / tp);
            let cols =
                |m: &[T]| -> Vec<T> { m.chunks(f).flat_map(|row| row[rank * fk..(rank + 1) * fk].to_vec()).collect() };
            let (w1, w2) = (cols(&self.w1), self.w2[rank * fk * h..(rank + 1) * fk * h].to_vec());
            return match &self.w3 {
                None => CudaFfnShard::from_shards(s, SHAPE, &w1, &w2, tp, rank),
                Some(w3) => CudaFfnShard::from_shards_gated(s, SHAPE, &w1, &cols(w3), &w2, tp, rank),
            };
        }
        match &self.w3 {
            None => CudaFfnShard::from_full(s, SHAPE, &self.w1, &self.w2, tp, rank),
            Some(w3) => CudaFfnShard::from_full_gated(s, SHAPE, &self.w1, w3, &self.w2, tp, rank),
        }
    }
}

/// What one TP size gave: the invariant layer twice, the naive layer, and (when `graph`) the
/// invariant layer captured into a graph and replayed; each over all tokens in rank order.
struct Outputs<T> {
    tree: Vec<T>,
    again: Vec<T>,
    naive: Vec<T>,
    replayed: Option<Vec<T>>,
}

/// Rank `r`'s part of [`run`]: every allocation, handle and warm-up before the barrier, then
/// the forwards in lockstep.
fn rank_run<T: CudaScalar>(rank: Rank<'_>, tp: usize, inp: &Inputs<T>, graph: bool) -> Result<Outputs<T>, Error> {
    use collective_core::Collective;
    let (comm, s) = (rank.comm, &rank.stream);
    let r = comm.rank();
    let n = SHAPE.local_len(tp);
    let shard = inp.shard(s, tp, r)?;
    assert_eq!(shard.is_gated(), inp.w3.is_some());
    let mut ws = shard.workspace(s)?;
    let gemm = CudaGemm::new(s)?;
    let kernels = CudaKernels::new(comm.context())?;
    let x = upload(s, &inp.x[r * n..(r + 1) * n]);
    let mut out = upload(s, &vec![T::from_f32(0.0); n]);
    let mut events = StageEvents::new(comm.context(), 16)?;
    shard.warm_up(&gemm, &kernels, &mut ws, s)?;
    rank.barrier.wait()?;

    let mut lock = Lockstep { barrier: rank.barrier };
    let mut forward = |naive: bool, out: &mut _, hook: &mut dyn StageHook| {
        if naive {
            shard.forward_naive(comm, &gemm, &kernels, &mut ws, &x, out, s, hook)
        } else {
            shard.forward(comm, &gemm, &kernels, &mut ws, &x, out, s, hook)
        }
    };
    forward(false, &mut out, &mut (&mut lock, &mut events))?;
    let tree = download(s, &out);
    if r == 0 {
        let stages: Vec<String> =
            events.totals_ms()?.iter().map(|(st, ms)| format!("{} {ms:.3} ms", st.name())).collect();
        println!("  TP={tp} rank 0 stages: {}", stages.join(", "));
    }
    events.reset();
    forward(false, &mut out, &mut (&mut lock, &mut events))?;
    let again = download(s, &out);
    events.reset();
    forward(true, &mut out, &mut (&mut lock, &mut events))?;
    let naive = download(s, &out);
    let mut replayed = None;
    if graph {
        s.begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| Error::cuda("cuStreamBeginCapture", e))?;
        // Lockstep only: the timing events are for eager runs.
        let enq = forward(false, &mut out, &mut lock);
        let g =
            s.end_capture(sys::CUgraphInstantiate_flags_enum(0)).map_err(|e| Error::cuda("cuStreamEndCapture", e))?;
        enq?;
        let g = g.ok_or_else(|| Error::Shape("an empty graph".into()))?;
        g.upload().map_err(|e| Error::cuda("cuGraphUpload", e))?;
        // Instantiation and upload may synchronise the device: nobody replays before every
        // rank has finished them. Outputs cleared (on a drained stream) so a replay that did
        // nothing cannot pass.
        s.synchronize().map_err(|e| Error::cuda("cuStreamSynchronize", e))?;
        s.memset_zeros(&mut out).map_err(|e| Error::cuda("cuMemsetD8Async", e))?;
        s.synchronize().map_err(|e| Error::cuda("cuStreamSynchronize", e))?;
        rank.barrier.wait()?;
        g.launch().map_err(|e| Error::cuda("cuGraphLaunch", e))?;
        rank.barrier.wait()?;
        replayed = Some(download(s, &out));
    }
    if let Some(Err(e)) = comm.ipc().map(|i| i.check()) {
        return Err(e.into());
    }
    Ok(Outputs { tree, again, naive, replayed })
}

fn run<T: CudaScalar>(tp: usize, inp: &Inputs<T>, graph: bool) -> Option<Outputs<T>> {
    let ranks = group(tp, CAPACITY)?;
    let outs = on_ranks(&ranks, |rank| rank_run(rank, tp, inp, graph).expect("a rank's forwards"));
    let cat = |f: &dyn Fn(&Outputs<T>) -> Vec<T>| outs.iter().flat_map(f).collect::<Vec<T>>();
    Some(Outputs {
        tree: cat(&|o| o.tree.clone()),
        again: cat(&|o| o.again.clone()),
        naive: cat(&|o| o.naive.clone()),
        replayed: graph.then(|| cat(&|o| o.replayed.clone().unwrap_or_default())),
    })
}

fn tp_invariance<T: CudaScalar>(name: &str, inp: &Inputs<T>) -> Option<Vec<T>> {
    println!("{name} FFN, {} tokens, hidden {}, ffn {}:", SHAPE.tokens, SHAPE.hidden, SHAPE.ffn);
    let one = run(1, inp, true)?;
    assert_eq!(bits(&one.tree), bits(&one.again), "TP=1 run to run");
    assert_eq!(bits(&one.tree), bits(one.replayed.as_deref().unwrap_or(&[])), "TP=1 graph replay vs eager");
    for tp in [2, 4, 8] {
        let o = run(tp, inp, tp == 8).expect("the device was there for TP=1");
        assert_eq!(
            bits(&o.tree),
            bits(&one.tree),
            "TP={tp} vs TP=1: {} elements differ",
            differing(&o.tree, &one.tree)
        );
        assert_eq!(bits(&o.tree), bits(&o.again), "TP={tp} run to run");
        if let Some(rep) = &o.replayed {
            assert_eq!(bits(rep), bits(&o.tree), "TP={tp} graph replay vs eager");
        }
        let (d, dn) = (differing(&o.naive, &one.tree), differing(&o.naive, &one.naive));
        let n = o.tree.len();
        println!(
            "  TP={tp}: invariant layer matches TP=1; naive layer: {d} of {n} differ from it, {dn} from naive TP=1"
        );
        // The naive layer's bits change with TP ...
        assert!(dn > 0, "TP={tp}: the naive layer gave its TP=1 bits (the test would not see a TP dependence)");
        // ... and differ from the invariant layer's, except at TP=8, where each rank's shard is
        // one leaf and the naive layer makes exactly the invariant layer's calls.
        if tp == 8 {
            assert_eq!(d, 0, "TP=8: the naive layer makes the same GEMM calls as the invariant one");
        } else {
            assert!(d > 0, "TP={tp}: the naive layer gave the invariant bits");
        }
    }
    let d1 = differing(&one.naive, &one.tree);
    println!("  TP=1: naive layer: {d1} of {} elements differ from the invariant layer", one.tree.len());
    assert!(d1 > 0, "TP=1: the naive layer gave the invariant bits");
    Some(one.tree)
}

/// The GPU's f32 output against the CPU reference of the same weights (the plain or the gated
/// FFN), element by element within `1e-3 · max(1, |reference|)`: the GEMMs' sums and `expf`
/// differ in their last bits between the two, a wrong wiring (a missing gate, the up projection
/// of the wrong leaves) by far more.
fn near_the_cpu_reference(got: &[f32], inp: &Inputs<f32>) {
    use detcoll_layers::{ReferenceGemm, ffn};
    let want = match &inp.w3 {
        None => ffn::reference(&ReferenceGemm, SHAPE, &inp.x, &inp.w1, &inp.w2),
        Some(w3) => ffn::reference_gated(&ReferenceGemm, SHAPE, &inp.x, &inp.w1, w3, &inp.w2),
    }
    .expect("the CPU reference");
    let worst = got.iter().zip(&want).map(|(g, w)| (g - w).abs() / w.abs().max(1.0)).fold(0f32, f32::max);
    println!("  f32 TP=1 vs the CPU reference: largest relative difference {worst:.2e}");
    assert!(worst <= 1e-3, "the GPU FFN is not the CPU reference's function: relative difference {worst}");
}

#[test]
fn bf16_ffn_bits_are_the_same_at_every_tp_and_in_a_graph() {
    tp_invariance::<bf16>("bf16", &inputs(SHAPE, 7));
}

#[test]
fn f32_ffn_bits_are_the_same_at_every_tp_and_in_a_graph() {
    let inp = inputs(SHAPE, 7);
    if let Some(one) = tp_invariance::<f32>("f32", &inp) {
        near_the_cpu_reference(&one, &inp);
    }
}

#[test]
fn bf16_gated_ffn_bits_are_the_same_at_every_tp_and_in_a_graph() {
    let gated = gated_inputs(SHAPE, 7);
    let Some(one) = tp_invariance::<bf16>("bf16 gated", &gated) else { return };
    // The up projection is applied: the plain FFN of the same W1, W2 gives other bits.
    let plain = run(1, &inputs::<bf16>(SHAPE, 7), false).expect("the device").tree;
    let d = differing(&one, &plain);
    println!("  bf16 gated vs plain at TP=1: {d} of {} elements differ", one.len());
    assert!(d > one.len() / 2, "the gated FFN gave the plain FFN's bits in {} elements", one.len() - d);
}

#[test]
fn f32_gated_ffn_bits_are_the_same_at_every_tp_and_in_a_graph() {
    let inp = gated_inputs(SHAPE, 7);
    if let Some(one) = tp_invariance::<f32>("f32 gated", &inp) {
        near_the_cpu_reference(&one, &inp);
    }
}

/// Ranks built from their own weight shards (`from_shards`, `from_shards_gated`: no rank holds
/// the full matrices) give the bits of ranks built from the full matrices, plain and gated.
#[test]
fn shards_loaded_per_rank_give_the_full_matrices_bits() {
    for gated in [false, true] {
        let full = if gated { gated_inputs::<bf16>(SHAPE, 9) } else { inputs::<bf16>(SHAPE, 9) };
        let shards = Inputs { shards: true, ..if gated { gated_inputs::<bf16>(SHAPE, 9) } else { inputs(SHAPE, 9) } };
        for tp in [2, 4] {
            let Some(want) = run(tp, &full, false) else { return };
            let got = run(tp, &shards, false).expect("the device was there");
            assert_eq!(bits(&got.tree), bits(&want.tree), "gated {gated} TP={tp}: invariant layer");
            assert_eq!(bits(&got.naive), bits(&want.naive), "gated {gated} TP={tp}: naive layer");
            println!("shards per rank, gated {gated}, TP={tp}: the full matrices' bits");
        }
    }
}

#[test]
fn wrong_sizes_are_typed_errors_and_leave_the_output_untouched() {
    let Some(ranks) = group(1, CAPACITY) else { return };
    let inp = inputs::<bf16>(SHAPE, 3);
    on_ranks(&ranks, |rank| {
        let s = &rank.stream;
        // Construction: weights of the wrong length, a TP size the tree does not take.
        let short = &inp.w1[..inp.w1.len() - 1];
        assert!(matches!(CudaFfnShard::from_full(s, SHAPE, short, &inp.w2, 1, 0), Err(Error::Shape(_))));
        assert!(matches!(CudaFfnShard::from_full(s, SHAPE, &inp.w1, &inp.w2, 3, 0), Err(Error::Shape(_))));
        let odd = FfnShape { ffn: 1020, ..SHAPE };
        assert!(matches!(CudaFfnShard::<bf16>::from_full(s, odd, &[], &[], 1, 0), Err(Error::Shape(_))));
        let w3 = &inp.w1;
        let e = CudaFfnShard::from_shards(s, SHAPE, &inp.w1[..512 * 1024 / 2], &inp.w2[..1024 * 512 / 2], 1, 0);
        assert!(matches!(&e, Err(Error::Shape(d)) if d.starts_with("w1_shard")), "{e:?}");
        assert!(matches!(
            CudaFfnShard::from_full_gated(s, SHAPE, &inp.w1, &w3[1..], &inp.w2, 1, 0),
            Err(Error::Shape(_))
        ));
        let shard = CudaFfnShard::from_full(s, SHAPE, &inp.w1, &inp.w2, 1, 0).expect("a shard");
        let mut ws = shard.workspace(s).expect("a workspace");
        let gemm = CudaGemm::new(s).expect("cuBLAS");
        let kernels = CudaKernels::new(rank.comm.context()).expect("kernels");
        let n = shard.local_len();
        let pattern: Vec<bf16> = (0..n).map(|i| bf16::from_f32(i as f32)).collect();
        let mut out = upload(s, &pattern);
        let x_short = upload(s, &inp.x[..n - 1]);
        let e = shard.forward(rank.comm, &gemm, &kernels, &mut ws, &x_short, &mut out, s, &mut ());
        assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
        let x = upload(s, &inp.x[..n]);
        let mut out_short = upload(s, &pattern[..n - 1]);
        let e = shard.forward_naive(rank.comm, &gemm, &kernels, &mut ws, &x, &mut out_short, s, &mut ());
        assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
        // A workspace of another shard is refused too: of another shape, or of the gated FFN.
        let gated = CudaFfnShard::from_full_gated(s, SHAPE, &inp.w1, w3, &inp.w2, 1, 0).expect("a gated shard");
        let mut gated_ws = gated.workspace(s).expect("a gated workspace");
        let e = shard.forward(rank.comm, &gemm, &kernels, &mut gated_ws, &x, &mut out, s, &mut ());
        assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
        let e = gated.forward(rank.comm, &gemm, &kernels, &mut ws, &x, &mut out, s, &mut ());
        assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
        let other = CudaFfnShard::from_full(s, FfnShape { tokens: 128, ..SHAPE }, &inp.w1, &inp.w2, 1, 0).unwrap();
        let mut other_ws = other.workspace(s).unwrap();
        let e = shard.forward(rank.comm, &gemm, &kernels, &mut other_ws, &x, &mut out, s, &mut ());
        assert!(matches!(e, Err(Error::Shape(_))), "{e:?}");
        assert_eq!(bits(&download(s, &out)), bits(&pattern), "out was written");
        println!("wrong sizes: typed shape errors, out untouched");
    });
}

/// A shard without the naive layer's weights (`CudaFfnShard::without_naive`: half the device
/// memory of the weights) gives the invariant layer's bits of a shard with them, plain and
/// gated, at TP 2 and 4; its `forward_naive` is a typed error on every rank before any
/// collective call, with the output untouched, and the ranks' next forward runs.
#[test]
fn without_the_naive_weights_the_invariant_layer_keeps_its_bits() {
    for gated in [false, true] {
        let inp = if gated { gated_inputs::<bf16>(SHAPE, 11) } else { inputs::<bf16>(SHAPE, 11) };
        for tp in [2, 4] {
            let Some(want) = run(tp, &inp, false) else { return };
            let ranks = group(tp, CAPACITY).expect("the device was there");
            let outs = on_ranks(&ranks, |rank| {
                let (comm, s) = (rank.comm, &rank.stream);
                let r = collective_core::Collective::rank(comm);
                let n = SHAPE.local_len(tp);
                let shard = inp.shard(s, tp, r).expect("a shard").without_naive();
                assert!(!shard.has_naive());
                let mut ws = shard.workspace(s).expect("a workspace");
                let gemm = CudaGemm::new(s).expect("cuBLAS");
                let kernels = CudaKernels::new(comm.context()).expect("kernels");
                let x = upload(s, &inp.x[r * n..(r + 1) * n]);
                let mut out = upload(s, &vec![bf16::from_f32(0.0); n]);
                shard.warm_up(&gemm, &kernels, &mut ws, s).expect("warm-up");
                rank.barrier.wait().expect("barrier");
                let mut lock = Lockstep { barrier: rank.barrier };
                shard.forward(comm, &gemm, &kernels, &mut ws, &x, &mut out, s, &mut lock).expect("forward");
                let first = download(s, &out);
                let e = shard.forward_naive(comm, &gemm, &kernels, &mut ws, &x, &mut out, s, &mut lock);
                assert!(matches!(&e, Err(Error::Shape(d)) if d.contains("without_naive")), "{e:?}");
                assert_eq!(bits(&download(s, &out)), bits(&first), "rank {r}: out written by a refused call");
                s.memset_zeros(&mut out).expect("memset");
                shard.forward(comm, &gemm, &kernels, &mut ws, &x, &mut out, s, &mut lock).expect("forward again");
                let again = download(s, &out);
                assert_eq!(bits(&again), bits(&first), "rank {r}: the forward after the refusal");
                first
            });
            let got: Vec<bf16> = outs.into_iter().flatten().collect();
            assert_eq!(bits(&got), bits(&want.tree), "gated {gated} TP={tp}: without the naive weights");
            println!("without the naive weights, gated {gated}, TP={tp}: the invariant bits, forward_naive refused");
        }
    }
}
