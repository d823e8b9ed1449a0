//! A layer call one rank refuses (a shape of its own) while its peers make it: the collective
//! calls the refused layer would have made count as refused on the rank's collective
//! (`Collective::count_refused_call`), so the peers' layer call and the rank's next one fail
//! with `SignatureMismatch` instead of pairing one layer's all_gather with the next layer's
//! (which returned `Ok` with another call's tokens). On the factory's CPU collective, which
//! numbers its calls; each scenario returned `Ok` on the peers before 2026-12-06.
use collective_core::{Collective, Error as CollectiveError};
use collective_factory::{Config, CpuCollective, cpu};
use detcoll_layers::{Error, FfnShape, FfnShard, NextNorm, ReferenceGemm};
use std::time::Duration;

/// `f(comm)` on each of two ranks of the factory's CPU collective, one thread each.
fn on_two<R: Send>(f: impl Fn(&CpuCollective) -> R + Sync) -> Vec<R> {
    let ranks = cpu::thread_group(2, &Config::new().with_timeout(Duration::from_secs(20))).unwrap();
    std::thread::scope(|s| {
        let f = &f;
        let hs: Vec<_> = ranks.iter().map(|comm| s.spawn(move || f(comm))).collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Rank `r`'s shard of an FFN of `shape` (fixed weights).
fn shard(shape: FfnShape, r: usize) -> FfnShard<f32> {
    let w1: Vec<f32> = (0..shape.hidden * shape.ffn).map(|i| (i % 7) as f32 * 0.125).collect();
    let w2: Vec<f32> = (0..shape.ffn * shape.hidden).map(|i| (i % 5) as f32 * 0.25).collect();
    FfnShard::from_full(shape, &w1, &w2, 2, r).unwrap()
}

fn out_of_step(r: &Result<(), Error>) -> bool {
    matches!(r, Err(Error::Collective(CollectiveError::SignatureMismatch { .. } | CollectiveError::Poisoned { .. })))
}

/// Rank 1's first FFN call has an `x_local` one element short (refused: `Error::Shape`);
/// rank 0's is right. Both then make a right one.
#[test]
fn an_ffn_call_one_rank_refused_fails_on_both() {
    let shape = FfnShape { tokens: 8, hidden: 16, ffn: 32 };
    let results = on_two(|comm| {
        let r = comm.rank();
        let shard = shard(shape, r);
        let n = shape.local_len(2);
        let x = vec![1.0f32; n];
        let mut out = vec![0f32; n];
        let short = if r == 1 { &x[..n - 1] } else { &x[..] };
        let first = shard.forward(comm, &ReferenceGemm, short, &mut out);
        (first, shard.forward(comm, &ReferenceGemm, &x, &mut out))
    });
    let (a0, _) = &results[0];
    let (a1, b1) = &results[1];
    assert!(matches!(a1, Err(Error::Shape(_))), "rank 1's short x: {a1:?}");
    assert!(out_of_step(a0), "rank 0's layer call, which rank 1 refused: {a0:?}");
    assert!(out_of_step(b1), "rank 1's next layer call: {b1:?}");
}

/// The decoder tail (one fused call): rank 1's weight is one element short.
#[test]
fn a_decoder_tail_one_rank_refused_fails_on_both() {
    let shape = FfnShape { tokens: 4, hidden: 16, ffn: 32 };
    let results = on_two(|comm| {
        let r = comm.rank();
        let shard = shard(shape, r);
        let x = vec![1.0f32; 4 * 16];
        let weight = vec![1.0f32; 16];
        let call = |weight: &[f32]| {
            let mut residual = vec![0.5f32; 4 * 16];
            let mut y = vec![0f32; 4 * 16];
            let norm = NextNorm { weight, eps: 1e-6 };
            shard.forward_residual_rmsnorm(comm, &ReferenceGemm, &x, &mut residual, norm, &mut y)
        };
        let first = call(if r == 1 { &weight[..15] } else { &weight[..] });
        (first, call(&weight))
    });
    let (a0, _) = &results[0];
    let (a1, b1) = &results[1];
    assert!(matches!(a1, Err(Error::Shape(_))), "rank 1's short weight: {a1:?}");
    assert!(out_of_step(a0), "rank 0's decoder tail, which rank 1 refused: {a0:?}");
    assert!(out_of_step(b1), "rank 1's next decoder tail: {b1:?}");
}
