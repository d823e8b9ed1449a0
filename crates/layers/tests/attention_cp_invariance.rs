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
