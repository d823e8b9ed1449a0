//! Shapes at the edges of `usize`: empty products with a huge other dimension are `Ok` without
//! allocating that dimension, and shapes whose sizes overflow are `Error::Shape`, never a
//! panic or an abort (an outside probe found an allocation of 2^40 f32 and two overflow panics).
mod common;
use collective_core::Collective;
use common::on_group;
use detcoll_layers::attention::{self, AttentionInput, AttentionOutput, AttentionShape};
use detcoll_layers::{Error, FfnShape, Gemm, ReferenceGemm, ffn};
use half::bf16;

#[test]
fn an_empty_gemm_allocates_nothing_for_its_other_dimension() {
    // m = 0: `out` is empty whatever n is; n = 2^40 f32 would be 4 TiB.
    let mut out: [bf16; 0] = [];
    ReferenceGemm.gemm(&[], &[], 0, 0, 1 << 40, &mut out).unwrap();
    ReferenceGemm.gemm(&[], &[], 0, 0, usize::MAX, &mut out).unwrap();
    // k = 0 with rows and columns: zeros (the empty sum), every element written.
    let mut out = [bf16::ONE; 6];
    ReferenceGemm.gemm(&[], &[], 2, 0, 3, &mut out).unwrap();
    assert!(out.iter().all(|v| v.to_bits() == 0));
}

#[test]
fn the_ffn_reference_of_no_tokens_is_empty() {
    for hidden in [1usize << 40, usize::MAX] {
        let shape = FfnShape { tokens: 0, hidden, ffn: 0 };
        let y = ffn::reference::<bf16, _>(&ReferenceGemm, shape, &[], &[], &[]).unwrap();
        assert!(y.is_empty(), "hidden {hidden}");
    }
}

fn shape_error(r: Result<(), Error>) -> String {
    match r {
        Err(e @ Error::Shape(_)) => e.to_string(),
        other => panic!("expected a shape error, got {other:?}"),
    }
}

#[test]
fn attention_refuses_a_token_length_that_overflows_even_without_tokens() {
    let shape = AttentionShape { tokens: 0, heads: 1 << 33, head_dim: 1 << 33 };
    let (mut out, mut lse) = ([bf16::ZERO; 0], [0f32; 0]);
    let none = AttentionInput::<bf16> { q: &[], k: &[], v: &[], positions: &[] };
    let msg = shape_error(attention::reference(shape, none, AttentionOutput { out: &mut out, lse: &mut lse }));
    assert!(msg.contains("heads x head_dim"), "{msg}");

    for r in on_group(2, |comm| {
        let (mut out, mut lse) = ([bf16::ZERO; 0], [0f32; 0]);
        let r = attention::forward(comm, shape, none, AttentionOutput { out: &mut out, lse: &mut lse });
        (comm.rank(), r)
    }) {
        let (rank, r) = r;
        let msg = shape_error(r);
        assert!(msg.contains("heads x head_dim"), "rank {rank}: {msg}");
    }
}

#[test]
fn local_len_saturates_instead_of_wrapping() {
    let shape = FfnShape { tokens: 8, hidden: usize::MAX / 2, ffn: 8 };
    assert_eq!(shape.local_len(2), usize::MAX);
    assert_eq!(FfnShape { tokens: 8, hidden: 4, ffn: 8 }.local_len(2), 16);
}

#[test]
#[should_panic(expected = "the TP size is 0")]
fn local_len_of_tp_0_panics_as_documented() {
    let _ = FfnShape { tokens: 8, hidden: 4, ffn: 8 }.local_len(0);
}

#[test]
fn shapes_with_no_output_do_not_allocate_their_intermediates() {
    // hidden 0: no output, but `tokens x ffn` activations of 2^44 elements (32 TiB of bf16)
    // were allocated (the process aborted); heads 0: an accumulator of head_dim = 2^40 f32.
    let shape = FfnShape { tokens: 1 << 20, hidden: 0, ffn: 1 << 24 };
    let y = ffn::reference::<bf16, _>(&ReferenceGemm, shape, &[], &[], &[]).unwrap();
    assert!(y.is_empty());
    for r in on_group(2, |comm| {
        let shard = ffn::FfnShard::<bf16>::from_full(shape, &[], &[], 2, comm.rank())?;
        let mut out: [bf16; 0] = [];
        shard.forward(comm, &ReferenceGemm, &[], &mut out)?;
        shard.forward_naive(comm, &ReferenceGemm, &[], &mut out)
    }) {
        r.unwrap();
    }
    let shape = AttentionShape { tokens: 1, heads: 0, head_dim: 1 << 40 };
    let (mut out, mut lse) = ([bf16::ZERO; 0], [0f32; 0]);
    let input = AttentionInput::<bf16> { q: &[], k: &[], v: &[], positions: &[0] };
    attention::reference(shape, input, AttentionOutput { out: &mut out, lse: &mut lse }).unwrap();
}

#[test]
fn shard_bounds_and_token_length_do_not_overflow() {
    // ffn near usize::MAX with hidden 0 passes the shape's products; the shard's column range
    // was `rank * ffn / tp`, which overflowed (a panic in debug builds).
    for (ffn, tp) in [(usize::MAX - 7, 8), (1 << 63, 2), (1 << 62, 4)] {
        for rank in 0..tp {
            let shape = FfnShape { tokens: 0, hidden: 0, ffn };
            let shard = ffn::FfnShard::<bf16>::from_full(shape, &[], &[], tp, rank).unwrap();
            assert_eq!(shard.leaves(), rank * 8 / tp..(rank + 1) * 8 / tp);
        }
    }
    assert_eq!(AttentionShape { tokens: 0, heads: 1 << 33, head_dim: 1 << 33 }.token_len(), usize::MAX);
    assert_eq!(AttentionShape { tokens: 0, heads: 3, head_dim: 5 }.token_len(), 15);
}

/// Heads of width 0 would scale every score by 1/√0 = ∞ (NaN `lse` for clean inputs; an
/// outside probe, 2026-12-05): a shape error, in the reference and the layer.
#[test]
fn attention_refuses_heads_of_width_zero() {
    let shape = AttentionShape { tokens: 2, heads: 3, head_dim: 0 };
    let positions = [0u32, 1];
    let input = AttentionInput::<bf16> { q: &[], k: &[], v: &[], positions: &positions };
    let (mut out, mut lse) = ([bf16::ZERO; 0], [f32::NAN; 6]);
    let msg = shape_error(attention::reference(shape, input, AttentionOutput { out: &mut out, lse: &mut lse }));
    assert!(msg.contains("width 0"), "{msg}");
    assert!(lse.iter().all(|v| v.is_nan()), "lse was written");
    let one = AttentionShape { tokens: 1, ..shape };
    let input = AttentionInput::<bf16> { q: &[], k: &[], v: &[], positions: &positions[..1] };
    for (rank, r) in on_group(2, |comm| {
        let (mut out, mut lse) = ([bf16::ZERO; 0], [0f32; 3]);
        (
            comm.rank(),
            attention::forward(
                comm,
                AttentionShape { tokens: 2, ..one },
                input,
                AttentionOutput { out: &mut out, lse: &mut lse },
            ),
        )
    }) {
        let msg = shape_error(r);
        assert!(msg.contains("width 0"), "rank {rank}: {msg}");
    }
}
