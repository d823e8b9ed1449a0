//! The sequence-parallel FFN over the CPU twin at TP = 1, 2, 4, 8: the TP-invariant layer gives
//! the same bits at every TP (and the single-process tree over the 8 leaves); the naive layer
//! does not. The same for the gated FFN (SwiGLU: `W2 · (SiLU(x · W1) ⊙ (x · W3))`, the FFN of
//! Llama, Mistral and Qwen), whose reference also equals an evaluation written here from the
//! definition (full GEMMs, the activation per element, the 8-leaf tree).
mod common;
use collective_core::Collective;
use common::{SIZES, bits, differing, on_group};
use detcoll_layers::data::SplitMix64;
use detcoll_layers::{FfnShape, FfnShard, Gemm, LEAVES, ReferenceGemm, Scalar, activation, ffn};
use half::bf16;

struct Case<T> {
    shape: FfnShape,
    x: Vec<T>,
    w1: Vec<T>,
    w2: Vec<T>,
    /// The gated FFN's up projection (`hidden × ffn`); `None`: SiLU alone.
    w3: Option<Vec<T>>,
}

impl<T: Scalar> Case<T> {
    fn new(shape: FfnShape, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let (s, h, f) = (shape.tokens, shape.hidden, shape.ffn);
        // Weights at about 1/sqrt(fan-in), so activations stay O(1) as in a trained layer.
        let x = rng.values(s * h, 1.0);
        let w1 = rng.values(h * f, 1.0 / (h as f32).sqrt());
        let w2 = rng.values(f * h, 1.0 / (f as f32).sqrt());
        Case { shape, x, w1, w2, w3: None }
    }

    /// [`Case::new`] with an up projection: the gated FFN of the same `x`, `W1` and `W2`.
    fn gated(shape: FfnShape, seed: u64) -> Self {
        let w3 = SplitMix64::new(!seed).values(shape.hidden * shape.ffn, 1.0 / (shape.hidden as f32).sqrt());
        Case { w3: Some(w3), ..Case::new(shape, seed) }
    }

    fn shard(&self, tp: usize, rank: usize) -> FfnShard<T> {
        let shard = match &self.w3 {
            None => FfnShard::from_full(self.shape, &self.w1, &self.w2, tp, rank),
            Some(w3) => FfnShard::from_full_gated(self.shape, &self.w1, w3, &self.w2, tp, rank),
        };
        let shard = shard.unwrap();
        assert_eq!(shard.is_gated(), self.w3.is_some());
        shard
    }

    /// The single-process reference of the case's FFN.
    fn reference(&self) -> Vec<T> {
        match &self.w3 {
            None => ffn::reference(&ReferenceGemm, self.shape, &self.x, &self.w1, &self.w2),
            Some(w3) => ffn::reference_gated(&ReferenceGemm, self.shape, &self.x, &self.w1, w3, &self.w2),
        }
        .unwrap()
    }

    /// The gated FFN by its definition, without the layer's code: the full gate and up GEMMs
    /// (each element one f32 sum over `hidden`, so a leaf's columns are the full product's),
    /// SiLU rounded to `T` times up rounded to `T`, each leaf's `S × F/8 · F/8 × H` product, and
    /// the balanced tree over the 8 products.
    fn gated_by_definition(&self) -> Vec<T> {
        let (s, h, f) = (self.shape.tokens, self.shape.hidden, self.shape.ffn);
        let (w, zero) = (f / LEAVES, T::from_f32(0.0));
        let (mut gate, mut up) = (vec![zero; s * f], vec![zero; s * f]);
        ReferenceGemm.gemm(&self.x, &self.w1, s, h, f, &mut gate).unwrap();
        ReferenceGemm.gemm(&self.x, self.w3.as_ref().expect("a gated case"), s, h, f, &mut up).unwrap();
        let act: Vec<T> = gate
            .iter()
            .zip(&up)
            .map(|(g, u)| T::from_f32(T::from_f32(activation::silu(g.to_f32())).to_f32() * u.to_f32()))
            .collect();
        let products: Vec<Vec<T>> = (0..LEAVES)
            .map(|l| {
                let a: Vec<T> = act.chunks(f).flat_map(|row| row[l * w..(l + 1) * w].to_vec()).collect();
                let mut p = vec![zero; s * h];
                ReferenceGemm.gemm(&a, &self.w2[l * w * h..(l + 1) * w * h], s, w, h, &mut p).unwrap();
                p
            })
            .collect();
        let refs: Vec<&[T]> = products.iter().map(Vec::as_slice).collect();
        let mut out = vec![zero; s * h];
        fixed_tree::reduce(&refs, &mut out).unwrap();
        out
    }

    /// The layer's output over all tokens at TP = `tp`, gathered back in token order.
    fn run(&self, tp: usize, naive: bool) -> Vec<T> {
        let n = self.shape.local_len(tp);
        on_group(tp, |comm| {
            let r = comm.rank();
            let shard = self.shard(tp, r);
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
    let want = case.reference();
    assert!(want.iter().all(|v| v.to_f32().is_finite()));
    assert!(want.iter().any(|v| v.to_f32() != 0.0));
    if case.w3.is_some() {
        assert_eq!(bits(&want), bits(&case.gated_by_definition()), "{}: the gated reference", T::NAME);
        // The up projection is applied: the SiLU-only FFN of the same W1, W2 differs.
        let plain = ffn::reference(&ReferenceGemm, case.shape, &case.x, &case.w1, &case.w2).unwrap();
        assert!(differing(&plain, &want) > want.len() / 2, "{}: the gated FFN ignored W3", T::NAME);
    }
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
fn bf16_gated_ffn_is_bit_identical_at_every_tp() {
    tp_invariant(&Case::<bf16>::gated(FfnShape { tokens: 64, hidden: 64, ffn: 256 }, 0x5e1));
}

#[test]
fn f32_gated_ffn_is_bit_identical_at_every_tp() {
    tp_invariant(&Case::<f32>::gated(FfnShape { tokens: 32, hidden: 48, ffn: 128 }, 0x3f32));
}

#[test]
fn naive_ffn_changes_bits_with_tp() {
    let shape = FfnShape { tokens: 64, hidden: 64, ffn: 256 };
    for case in [Case::<bf16>::new(shape, 0x5eed), Case::gated(shape, 0x5eed)] {
        naive_changes_bits(&case);
    }
}

fn naive_changes_bits(case: &Case<bf16>) {
    let tp1 = case.run(1, true);
    // Each TP is deterministic by itself: a second run gives the same bits.
    assert_eq!(bits(&case.run(2, true)), bits(&case.run(2, true)));
    for tp in [2, 4, 8] {
        let got = case.run(tp, true);
        let n = differing(&tp1, &got);
        let gated = if case.w3.is_some() { " gated" } else { "" };
        println!("naive{gated} bf16 FFN: TP={tp} differs from TP=1 in {n} of {} elements", got.len());
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

/// `from_shards_gated` of a rank's own weights is the shard `from_full_gated` cuts (the same
/// bits at TP 2); wrong `W3` lengths are refused by both, naming the argument.
#[test]
fn gated_shards_loaded_per_rank_give_the_same_bits() {
    let case = Case::<f32>::gated(FfnShape { tokens: 4, hidden: 16, ffn: 64 }, 5);
    let want = case.run(2, false);
    let (h, f, w3) = (case.shape.hidden, case.shape.ffn, case.w3.as_ref().unwrap());
    let cols = |w: &[f32], r: usize| -> Vec<f32> {
        w.chunks(f).flat_map(|row| row[r * f / 2..(r + 1) * f / 2].to_vec()).collect()
    };
    let n = case.shape.local_len(2);
    let got = on_group(2, |comm| {
        let r = comm.rank();
        let (w1, w3) = (cols(&case.w1, r), cols(w3, r));
        let w2 = case.w2[r * f / 2 * h..(r + 1) * f / 2 * h].to_vec();
        let short = FfnShard::from_shards_gated(case.shape, w1.clone(), w3[1..].to_vec(), w2.clone(), 2, r);
        assert!(short.unwrap_err().to_string().contains("w3_shard"));
        let shard = FfnShard::from_shards_gated(case.shape, w1, w3, w2, 2, r).unwrap();
        let mut out = vec![f32::NAN; n];
        shard.forward(comm, &ReferenceGemm, &case.x[r * n..(r + 1) * n], &mut out).unwrap();
        out
    })
    .concat();
    assert_eq!(bits(&got), bits(&want));
    let err = FfnShard::from_full_gated(case.shape, &case.w1, &w3[1..], &case.w2, 2, 0).unwrap_err();
    assert!(matches!(&err, detcoll_layers::Error::Shape(d) if d.contains("w3")), "{err}");
    assert!(!FfnShard::from_full(case.shape, &case.w1, &case.w2, 2, 0).unwrap().is_gated());
}
