//! Causal CP attention over the CPU twin at CP = 1, 2, 4, 8: the same bits (output and
//! log-sum-exp) at every CP size, and the same as the single-process reference.
mod common;
use collective_core::Collective;
use common::{SIZES, bits, on_group};
use detcoll_layers::attention::{self, AttentionInput, AttentionOutput, AttentionShape};
use detcoll_layers::data::SplitMix64;
use half::bf16;

#[test]
fn bf16_attention_is_bit_identical_at_every_cp() {
    let shape = AttentionShape { tokens: 64, heads: 2, head_dim: 16 };
    let e = shape.tokens * shape.token_len();
    let mut rng = SplitMix64::new(0xa77e);
    // Scores of a few units: the softmax is neither uniform nor one-hot.
    let q: Vec<bf16> = rng.values(e, 2.0);
    let k: Vec<bf16> = rng.values(e, 2.0);
    let v: Vec<bf16> = rng.values(e, 1.0);
    let positions: Vec<u32> = (0..shape.tokens as u32).map(|t| 1000 + t).collect();

    let mut want = vec![bf16::ZERO; e];
    let mut want_lse = vec![0f32; shape.tokens * shape.heads];
    let all = AttentionInput { q: &q, k: &k, v: &v, positions: &positions };
    attention::reference(shape, all, AttentionOutput { out: &mut want, lse: &mut want_lse }).unwrap();
    assert!(want_lse.iter().all(|l| l.is_finite()));

    for cp in SIZES {
        let (n, row) = (shape.tokens / cp, shape.token_len());
        let per_rank = on_group(cp, |comm| {
            let r = comm.rank();
            let block = |a: &[bf16]| a[r * n * row..(r + 1) * n * row].to_vec();
            let (q, k, v) = (block(&q), block(&k), block(&v));
            let local = AttentionInput { q: &q, k: &k, v: &v, positions: &positions[r * n..(r + 1) * n] };
            let mut out = vec![bf16::NAN; n * row];
            let mut lse = vec![f32::NAN; n * shape.heads];
            attention::forward(comm, shape, local, AttentionOutput { out: &mut out, lse: &mut lse }).unwrap();
            (out, lse)
        });
        let out: Vec<bf16> = per_rank.iter().flat_map(|(o, _)| o.clone()).collect();
        let lse: Vec<f32> = per_rank.iter().flat_map(|(_, l)| l.clone()).collect();
        assert_eq!(bits(&out), bits(&want), "CP={cp}: output differs from the reference");
        assert_eq!(bits(&lse), bits(&want_lse), "CP={cp}: log-sum-exp differs from the reference");
        println!("CP={cp}: {} output and {} LSE values bit-identical to the reference", out.len(), lse.len());
    }
}

#[test]
fn a_nan_or_infinite_score_gives_nan_not_the_no_key_result() {
    // A query that sees keys is `o / l` and `m + ln l` whatever the values: a NaN in k or an
    // infinity in q made `l` NaN, and `l > 0` sent the query to the no-key branch (zeros and
    // -inf), hiding the poisoned input. Now NaN, at every CP size alike.
    let shape = AttentionShape { tokens: 2, heads: 1, head_dim: 2 };
    let v = [3.0f32, 4.0, 5.0, 6.0];
    for (q, k) in
        [([1.0f32, 0.0, 1.0, 0.0], [f32::NAN, 0.0, 1.0, 0.0]), ([f32::INFINITY, 0.0, 1.0, 0.0], [1.0, 0.0, 1.0, 0.0])]
    {
        let (mut out, mut lse) = ([0f32; 4], [0f32; 2]);
        let input = AttentionInput { q: &q, k: &k, v: &v, positions: &[0, 1] };
        attention::reference(shape, input, AttentionOutput { out: &mut out, lse: &mut lse }).unwrap();
        assert!(out[..2].iter().all(|x| x.is_nan()) && lse[0].is_nan(), "token 0: {out:?} {lse:?}");
        if k[0].is_nan() {
            // Token 1 sees key 0 too: its sum is NaN as well.
            assert!(out[2..].iter().all(|x| x.is_nan()) && lse[1].is_nan(), "token 1: {out:?} {lse:?}");
        }
        let per_rank = on_group(2, |comm| {
            let r = comm.rank();
            let (mut o, mut l) = ([0f32; 2], [0f32; 1]);
            let local = AttentionInput {
                q: &q[2 * r..2 * r + 2],
                k: &k[2 * r..2 * r + 2],
                v: &v[2 * r..2 * r + 2],
                positions: &[r as u32],
            };
            attention::forward(comm, shape, local, AttentionOutput { out: &mut o, lse: &mut l }).unwrap();
            (o, l)
        });
        for (r, (o, l)) in per_rank.iter().enumerate() {
            assert_eq!(bits(o), bits(&out[2 * r..2 * r + 2]), "CP 2 rank {r}");
            assert_eq!(l[0].to_bits(), lse[r].to_bits(), "CP 2 rank {r}: lse");
        }
    }
}
