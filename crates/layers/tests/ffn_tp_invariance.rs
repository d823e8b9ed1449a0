//! The sequence-parallel FFN over the CPU twin at TP = 1, 2, 4, 8: the TP-invariant layer gives
//! the same bits at every TP (and the single-process tree over the 8 leaves); the naive layer
//! does not.
mod common;
use collective_core::Collective;
use common::{SIZES, bits, differing, on_group};
use detcoll_layers::data::SplitMix64;
use detcoll_layers::{FfnShape, FfnShard, ReferenceGemm, Scalar, ffn};
use half::bf16;

struct Case<T> {
    shape: FfnShape,
    x: Vec<T>,
    w1: Vec<T>,
    w2: Vec<T>,
}

impl<T: Scalar> Case<T> {
    fn new(shape: FfnShape, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let (s, h, f) = (shape.tokens, shape.hidden, shape.ffn);
        // Weights at about 1/sqrt(fan-in), so activations stay O(1) as in a trained layer.
        let x = rng.values(s * h, 1.0);
        let w1 = rng.values(h * f, 1.0 / (h as f32).sqrt());
        let w2 = rng.values(f * h, 1.0 / (f as f32).sqrt());
        Case { shape, x, w1, w2 }
    }

    /// The layer's output over all tokens at TP = `tp`, gathered back in token order.
    fn run(&self, tp: usize, naive: bool) -> Vec<T> {
        let n = self.shape.local_len(tp);
        on_group(tp, |comm| {
            let r = comm.rank();
            let shard = FfnShard::from_full(self.shape, &self.w1, &self.w2, tp, r).unwrap();
            let mut out = vec![T::from_f32(f32::NAN); n];
            let x = &self.x[r * n..(r + 1) * n];
            if naive {
                shard.forward_naive(comm, &ReferenceGemm, x, &mut out).unwrap();
            } else {
                shard.forward(comm, &ReferenceGemm, x, &mut out).unwrap();
            }
            out
        })
        .concat()
    }
}

fn tp_invariant<T: Scalar>(case: &Case<T>) {
    let want = ffn::reference(&ReferenceGemm, case.shape, &case.x, &case.w1, &case.w2).unwrap();
    assert!(want.iter().all(|v| v.to_f32().is_finite()));
    assert!(want.iter().any(|v| v.to_f32() != 0.0));
    for tp in SIZES {
        let got = case.run(tp, false);
        assert_eq!(bits(&got), bits(&want), "{}: TP={tp} differs from the 8-leaf tree", T::NAME);
        println!("{}: TP={tp}: {} elements bit-identical to the 8-leaf tree", T::NAME, got.len());
    }
}

#[test]
fn bf16_ffn_is_bit_identical_at_every_tp() {
    tp_invariant(&Case::<bf16>::new(FfnShape { tokens: 64, hidden: 64, ffn: 256 }, 0x5eed));
}

#[test]
fn f32_ffn_is_bit_identical_at_every_tp() {
    tp_invariant(&Case::<f32>::new(FfnShape { tokens: 32, hidden: 48, ffn: 128 }, 0xf32));
}

#[test]
fn naive_ffn_changes_bits_with_tp() {
    let case = Case::<bf16>::new(FfnShape { tokens: 64, hidden: 64, ffn: 256 }, 0x5eed);
    let tp1 = case.run(1, true);
    // Each TP is deterministic by itself: a second run gives the same bits.
    assert_eq!(bits(&case.run(2, true)), bits(&case.run(2, true)));
    for tp in [2, 4, 8] {
        let got = case.run(tp, true);
        let n = differing(&tp1, &got);
        println!("naive bf16 FFN: TP={tp} differs from TP=1 in {n} of {} elements", got.len());
        assert!(n > 0, "the naive layer at TP={tp} happened to match TP=1");
    }
}

#[test]
fn shapes_are_checked_before_any_call() {
    let shape = FfnShape { tokens: 8, hidden: 4, ffn: 12 }; // 12 is not 8 leaves
    let err = FfnShard::<bf16>::from_full(shape, &[bf16::ZERO; 48], &[bf16::ZERO; 48], 2, 0).unwrap_err();
    assert!(matches!(err, detcoll_layers::Error::Shape(_)), "{err}");
    let shape = FfnShape { tokens: 8, hidden: 4, ffn: 16 };
    let errs = on_group(2, |comm| {
        let shard = FfnShard::<f32>::from_full(shape, &[0.0; 64], &[0.0; 64], 2, comm.rank()).unwrap();
        let mut out = [0f32; 16];
        shard.forward(comm, &ReferenceGemm, &[0.0; 15], &mut out).unwrap_err()
    });
    assert!(errs.iter().all(|e| matches!(e, detcoll_layers::Error::Shape(_))));
}
