//! The GPU decoder tail on one host (all ranks on GPU 0 of a one-GPU host, one thread and stream
//! each): `CudaFfnShard::forward_residual_rmsnorm` gives every rank the same `h` (the next
//! residual) and `y` (the next layer's input) at TP = 1, 2, 4 and 8, run to run; at TP = 1 they
//! are `fixed_tree::residual_rmsnorm` of the plain forward's FFN output (so the fused call adds
//! exactly the reference's norm to the GPU's FFN); a wrong weight is a typed error that writes
//! nothing. Shapes: a decode batch (8 tokens of 4096: the one-kernel form) and 80 tokens (above
//! `ONE_KERNEL_MAX_ROWS`: the norm as a second launch). The same for the gated FFN (SwiGLU).
//! Skips, saying so, without a GPU.
#![cfg(feature = "cuda")]
mod common;

use common::gpu::{Rank, download, group, on_ranks, upload};
use common::{bits, differing};
use detcoll_layers::cuda::{CudaFfnShard, CudaGemm, CudaKernels, CudaScalar, Lockstep};
use detcoll_layers::data::SplitMix64;
use detcoll_layers::{Error, FfnShape};
use fixed_tree::RmsNormShape;
use half::bf16;

const CAPACITY: usize = 4 << 20;
const EPS: f32 = 1e-6;

struct Inputs<T> {
    x: Vec<T>,
    w1: Vec<T>,
    w2: Vec<T>,
    residual: Vec<T>,
    weight: Vec<T>,
    /// The gated FFN's up projection; `None`: SiLU alone.
    w3: Option<Vec<T>>,
}

fn inputs<T: CudaScalar>(shape: FfnShape, seed: u64, gated: bool) -> Inputs<T> {
    let mut rng = SplitMix64::new(seed);
    let n = shape.tokens * shape.hidden;
    Inputs {
        x: rng.values(n, 1.0),
        w1: rng.values(shape.hidden * shape.ffn, 1.0 / (shape.hidden as f32).sqrt()),
        w2: rng.values(shape.ffn * shape.hidden, 1.0 / (shape.ffn as f32).sqrt()),
        residual: rng.values(n, 4.0),
        weight: rng.values(shape.hidden, 1.0),
        w3: gated.then(|| rng.values(shape.hidden * shape.ffn, 1.0 / (shape.hidden as f32).sqrt())),
    }
}

/// One rank's `(h, y)` twice (run to run), and at TP = 1 the plain forward's FFN output.
struct Outputs<T> {
    h: Vec<T>,
    y: Vec<T>,
    again: (Vec<T>, Vec<T>),
    ffn: Option<Vec<T>>,
}

fn rank_run<T: CudaScalar>(rank: Rank<'_>, shape: FfnShape, tp: usize, inp: &Inputs<T>) -> Result<Outputs<T>, Error> {
    use collective_core::Collective;
    let (comm, s) = (rank.comm, &rank.stream);
    let r = comm.rank();
    let shard = match &inp.w3 {
        None => CudaFfnShard::from_full(s, shape, &inp.w1, &inp.w2, tp, r)?,
        Some(w3) => CudaFfnShard::from_full_gated(s, shape, &inp.w1, w3, &inp.w2, tp, r)?,
    };
    let mut ws = shard.workspace(s)?;
    let gemm = CudaGemm::new(s)?;
    let kernels = CudaKernels::new(comm.context())?;
    let x = upload(s, &inp.x);
    let weight = upload(s, &inp.weight);
    let mut residual = upload(s, &inp.residual);
    let mut y = upload(s, &vec![T::from_f32(0.0); inp.x.len()]);
    // A weight of the wrong length and the wrong rank count are refused before any work.
    let short = upload(s, &inp.weight[..shape.hidden - 1]);
    shard.warm_up(&gemm, &kernels, &mut ws, s)?;
    rank.barrier.wait()?;
    let mut lock = Lockstep { barrier: rank.barrier };

    match shard.forward_residual_rmsnorm(
        comm,
        &gemm,
        &kernels,
        &mut ws,
        &x,
        &mut residual,
        &short,
        EPS,
        &mut y,
        s,
        &mut lock,
    ) {
        Err(Error::Shape(m)) => assert!(m.contains("weight"), "{m}"),
        other => panic!("a short weight: expected Error::Shape, got {other:?}"),
    }
    assert_eq!(bits(&download(s, &residual)), bits(&inp.residual), "a refused call wrote the residual");
    assert!(download(s, &y).iter().all(|v| v.to_f32() == 0.0), "a refused call wrote y");

    let mut tail = |residual: &mut _, y: &mut _| {
        shard.forward_residual_rmsnorm(comm, &gemm, &kernels, &mut ws, &x, residual, &weight, EPS, y, s, &mut lock)
    };
    tail(&mut residual, &mut y)?;
    let (h, y1) = (download(s, &residual), download(s, &y));
    let mut residual2 = upload(s, &inp.residual);
    let mut y2 = upload(s, &vec![T::from_f32(0.0); inp.x.len()]);
    tail(&mut residual2, &mut y2)?;
    let again = (download(s, &residual2), download(s, &y2));
    let ffn = if tp == 1 {
        let mut out = upload(s, &vec![T::from_f32(0.0); inp.x.len()]);
        shard.forward(comm, &gemm, &kernels, &mut ws, &x, &mut out, s, &mut lock)?;
        Some(download(s, &out))
    } else {
        None
    };
    if let Some(Err(e)) = comm.ipc().map(|i| i.check()) {
        return Err(e.into());
    }
    Ok(Outputs { h, y: y1, again, ffn })
}

fn decoder_tail<T: CudaScalar>(name: &str, gated: bool) {
    for shape in [FfnShape { tokens: 8, hidden: 4096, ffn: 2048 }, FfnShape { tokens: 80, hidden: 512, ffn: 1024 }] {
        let inp = inputs::<T>(shape, shape.tokens as u64 * 131 + 5, gated);
        let mut first: Option<(Vec<T>, Vec<T>)> = None;
        for tp in [1, 2, 4, 8] {
            let Some(ranks) = group(tp, CAPACITY) else { return };
            let outs = on_ranks(&ranks, |rank| rank_run(rank, shape, tp, &inp).expect("a rank's decoder tail"));
            drop(ranks);
            let (h, y) = (outs[0].h.clone(), outs[0].y.clone());
            for (r, o) in outs.iter().enumerate() {
                assert_eq!(bits(&o.h), bits(&h), "{name} TP={tp} rank {r}: h differs from rank 0");
                assert_eq!(bits(&o.y), bits(&y), "{name} TP={tp} rank {r}: y differs from rank 0");
                assert_eq!((bits(&o.again.0), bits(&o.again.1)), (bits(&h), bits(&y)), "{name} TP={tp}: run to run");
            }
            match &first {
                None => {
                    // TP = 1: the reference norm of the GPU's own FFN output.
                    let ffn = outs[0].ffn.as_ref().expect("the TP=1 FFN output");
                    let (mut rh, mut ry) = (vec![T::from_f32(0.0); ffn.len()], vec![T::from_f32(0.0); ffn.len()]);
                    let rows = RmsNormShape { rows: shape.tokens, hidden: shape.hidden };
                    fixed_tree::residual_rmsnorm(&[ffn], &inp.residual, &inp.weight, EPS, rows, &mut rh, &mut ry)
                        .expect("the reference");
                    assert_eq!(bits(&h), bits(&rh), "{name} TP=1: h is not residual + FFN(x)");
                    assert_eq!(bits(&y), bits(&ry), "{name} TP=1: y is not the reference norm of h");
                    first = Some((h, y));
                }
                Some((h1, y1)) => {
                    assert_eq!(bits(&h), bits(h1), "{name} TP={tp} vs TP=1: {} of h differ", differing(&h, h1));
                    assert_eq!(bits(&y), bits(y1), "{name} TP={tp} vs TP=1: {} of y differ", differing(&y, y1));
                }
            }
            println!(
                "{name} {}x{} (ffn {}), TP={tp}: h and y = TP=1 on every rank",
                shape.tokens, shape.hidden, shape.ffn
            );
        }
    }
}

#[test]
fn decoder_tail_is_tp_invariant_and_the_reference_norm_bf16() {
    decoder_tail::<bf16>("bf16", false);
}

#[test]
fn decoder_tail_is_tp_invariant_and_the_reference_norm_f32() {
    decoder_tail::<f32>("f32", false);
}

#[test]
fn gated_decoder_tail_is_tp_invariant_and_the_reference_norm_bf16() {
    decoder_tail::<bf16>("bf16 gated", true);
}

#[test]
fn gated_decoder_tail_is_tp_invariant_and_the_reference_norm_f32() {
    decoder_tail::<f32>("f32 gated", true);
}
