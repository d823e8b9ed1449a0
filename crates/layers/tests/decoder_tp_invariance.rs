//! The decoder layer's tail over the CPU twin at TP = 1, 2, 4, 8: the FFN's all_reduce fused
//! with the residual add and the next RMSNorm (`FfnShard::forward_residual_rmsnorm`, through
//! the composed collective's `ResidualRmsNorm`) gives the same `h` and `y` bits at every TP,
//! equal to the single-process reference, on every rank; with the plain FFN and the gated one
//! (SwiGLU).
mod common;
use collective_factory::{Collective, Config, cpu};
use common::{SIZES, bits};
use detcoll_layers::data::SplitMix64;
use detcoll_layers::decoder::{reference_residual_rmsnorm, reference_residual_rmsnorm_gated};
use detcoll_layers::{FfnShape, FfnShard, NextNorm, ReferenceGemm, Scalar};
use half::bf16;

struct Case<T> {
    shape: FfnShape,
    x: Vec<T>,
    w1: Vec<T>,
    w2: Vec<T>,
    residual: Vec<T>,
    weight: Vec<T>,
    /// The gated FFN's up projection; `None`: SiLU alone.
    w3: Option<Vec<T>>,
}

impl<T: Scalar> Case<T> {
    fn new(shape: FfnShape, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed);
        let (s, h, f) = (shape.tokens, shape.hidden, shape.ffn);
        Case {
            shape,
            x: rng.values(s * h, 1.0),
            w1: rng.values(h * f, 1.0 / (h as f32).sqrt()),
            w2: rng.values(f * h, 1.0 / (f as f32).sqrt()),
            residual: rng.values(s * h, 1.0),
            weight: rng.values(h, 1.0),
            w3: None,
        }
    }

    /// [`Case::new`] with an up projection: the gated FFN's decoder tail.
    fn gated(shape: FfnShape, seed: u64) -> Self {
        let w3 = SplitMix64::new(!seed).values(shape.hidden * shape.ffn, 1.0 / (shape.hidden as f32).sqrt());
        Case { w3: Some(w3), ..Case::new(shape, seed) }
    }

    fn norm(&self) -> NextNorm<'_, T> {
        NextNorm { weight: &self.weight, eps: 1e-6 }
    }

    /// Every rank's `(h, y)` at TP = `tp` (composed collectives of the CPU twin: the fused
    /// call takes the IPC routes' one-kernel form).
    fn run(&self, tp: usize) -> Vec<(Vec<T>, Vec<T>)> {
        let comms = cpu::thread_group(tp, &Config::new().with_capacity(1 << 16)).expect("thread group");
        let out = std::thread::scope(|s| {
            let hs: Vec<_> = comms
                .iter()
                .map(|comm| {
                    s.spawn(move || {
                        let (shape, r) = (self.shape, comm.rank());
                        let shard = match &self.w3 {
                            None => FfnShard::from_full(shape, &self.w1, &self.w2, tp, r),
                            Some(w3) => FfnShard::from_full_gated(shape, &self.w1, w3, &self.w2, tp, r),
                        }
                        .unwrap();
                        let mut h = self.residual.clone();
                        let mut y = vec![T::from_f32(f32::NAN); h.len()];
                        shard
                            .forward_residual_rmsnorm(comm, &ReferenceGemm, &self.x, &mut h, self.norm(), &mut y)
                            .unwrap();
                        (h, y)
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("rank")).collect()
        });
        close(&comms);
        out
    }
}

/// Close is collective: every rank on its own thread.
fn close<C: Collective + Sync>(comms: &[C]) {
    std::thread::scope(|s| {
        for c in comms {
            s.spawn(move || c.close().expect("close"));
        }
    });
}

fn tp_invariant<T: Scalar>(case: &Case<T>) {
    let (gemm, shape, x, residual) = (&ReferenceGemm, case.shape, &case.x, &case.residual);
    let (h, y) = match &case.w3 {
        None => reference_residual_rmsnorm(gemm, shape, x, (&case.w1, &case.w2), residual, case.norm()),
        Some(w3) => reference_residual_rmsnorm_gated(gemm, shape, x, (&case.w1, w3, &case.w2), residual, case.norm()),
    }
    .unwrap();
    assert!(y.iter().all(|v| v.to_f32().is_finite()) && y.iter().any(|v| v.to_f32() != 0.0));
    for tp in SIZES {
        for (r, (gh, gy)) in case.run(tp).into_iter().enumerate() {
            assert_eq!(bits(&gh), bits(&h), "{}: TP={tp} rank {r}: h differs from the reference", T::NAME);
            assert_eq!(bits(&gy), bits(&y), "{}: TP={tp} rank {r}: y differs from the reference", T::NAME);
        }
        println!("{}: TP={tp}: h and y of every rank bit-identical to the reference", T::NAME);
    }
}

#[test]
fn bf16_decoder_tail_is_bit_identical_at_every_tp() {
    tp_invariant(&Case::<bf16>::new(FfnShape { tokens: 8, hidden: 64, ffn: 256 }, 0xdec0de));
}

#[test]
fn f32_decoder_tail_is_bit_identical_at_every_tp() {
    tp_invariant(&Case::<f32>::new(FfnShape { tokens: 5, hidden: 48, ffn: 128 }, 0xf32));
}

#[test]
fn bf16_gated_decoder_tail_is_bit_identical_at_every_tp() {
    tp_invariant(&Case::<bf16>::gated(FfnShape { tokens: 8, hidden: 64, ffn: 256 }, 0xdec0));
}

#[test]
fn a_wrong_norm_weight_is_refused_before_any_call() {
    let case = Case::<f32>::new(FfnShape { tokens: 2, hidden: 16, ffn: 64 }, 3);
    let comms = cpu::thread_group(2, &Config::new()).expect("thread group");
    for comm in &comms {
        let shard = FfnShard::from_full(case.shape, &case.w1, &case.w2, 2, comm.rank()).unwrap();
        let mut h = case.residual.clone();
        let mut y = vec![0f32; h.len()];
        let norm = NextNorm { weight: &case.weight[..15], eps: 1e-6 };
        let err = shard.forward_residual_rmsnorm(comm, &ReferenceGemm, &case.x, &mut h, norm, &mut y).unwrap_err();
        assert!(matches!(err, detcoll_layers::Error::Shape(_)), "{err}");
        assert_eq!(bits(&h), bits(&case.residual), "the residual was written");
        assert!(y.iter().all(|v| *v == 0.0), "y was written");
    }
    close(&comms);
}

/// A GEMM that counts its calls (and computes nothing): what ran before a refusal.
struct Counting(std::sync::atomic::AtomicUsize);

impl<T> detcoll_layers::Gemm<T> for Counting {
    fn gemm(&self, _: &[T], _: &[T], _: usize, _: usize, _: usize, _: &mut [T]) -> Result<(), detcoll_layers::Error> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

/// A bad `eps` or `hidden` is a shape error before any GEMM runs (an outside probe, 2026-12-05:
/// `eps = NaN` came back from the fused all_reduce after the whole FFN had run, as an error of
/// an all_reduce the caller never made), with nothing written, on one rank alone.
#[test]
fn a_bad_eps_or_hidden_is_refused_before_any_gemm() {
    let case = Case::<f32>::new(FfnShape { tokens: 2, hidden: 16, ffn: 64 }, 3);
    let comms = cpu::thread_group(1, &Config::new()).expect("thread group");
    let shard = FfnShard::from_full(case.shape, &case.w1, &case.w2, 1, 0).unwrap();
    let gemm = Counting(Default::default());
    for eps in [f32::NAN, f32::INFINITY, -1.0, -f32::MIN_POSITIVE] {
        let (mut h, mut y) = (case.residual.clone(), vec![0f32; case.residual.len()]);
        let norm = NextNorm { weight: &case.weight, eps };
        let gemm: &dyn detcoll_layers::Gemm<f32> = &gemm; // a GEMM chosen at run time
        let err = shard.forward_residual_rmsnorm(&comms[0], gemm, &case.x, &mut h, norm, &mut y).unwrap_err();
        assert!(matches!(&err, detcoll_layers::Error::Shape(d) if d.contains("eps")), "eps {eps}: {err}");
        assert_eq!(bits(&h), bits(&case.residual), "the residual was written");
        assert!(y.iter().all(|v| *v == 0.0), "y was written");
    }
    assert_eq!(gemm.0.into_inner(), 0, "a GEMM ran before the refusal");
    let empty = FfnShape { tokens: 2, hidden: 0, ffn: 64 };
    let shard = FfnShard::<f32>::from_full(empty, &[], &[], 1, 0).unwrap();
    let err = shard
        .forward_residual_rmsnorm(&comms[0], &ReferenceGemm, &[], &mut [], NextNorm { weight: &[], eps: 1e-6 }, &mut [])
        .unwrap_err();
    assert!(matches!(&err, detcoll_layers::Error::Shape(d) if d.contains("hidden 0")), "{err}");
    close(&comms);
}

/// Shards loaded per rank (`from_shards`) are the shards `from_full` cuts: the same bits at
/// TP 2, and wrong lengths are refused.
#[test]
fn shards_loaded_per_rank_give_the_same_bits() {
    let case = Case::<bf16>::new(FfnShape { tokens: 3, hidden: 16, ffn: 64 }, 5);
    let want = case.run(2);
    let (h, f) = (case.shape.hidden, case.shape.ffn);
    let comms = cpu::thread_group(2, &Config::new().with_capacity(1 << 16)).expect("thread group");
    let got: Vec<(Vec<bf16>, Vec<bf16>)> = std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .map(|comm| {
                let case = &case;
                s.spawn(move || {
                    let r = comm.rank();
                    let cols = r * f / 2..(r + 1) * f / 2;
                    let w1: Vec<bf16> = case.w1.chunks(f).flat_map(|row| row[cols.clone()].to_vec()).collect();
                    let w2 = case.w2[cols.start * h..cols.end * h].to_vec();
                    let short = FfnShard::from_shards(case.shape, w1[1..].to_vec(), w2.clone(), 2, r).unwrap_err();
                    assert!(short.to_string().contains("w1_shard"), "{short}");
                    let shard = FfnShard::from_shards(case.shape, w1, w2, 2, r).unwrap();
                    let mut h = case.residual.clone();
                    let mut y = vec![bf16::ZERO; h.len()];
                    shard.forward_residual_rmsnorm(comm, &ReferenceGemm, &case.x, &mut h, case.norm(), &mut y).unwrap();
                    (h, y)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    });
    for (r, ((gh, gy), (wh, wy))) in got.iter().zip(&want).enumerate() {
        assert_eq!((bits(gh), bits(gy)), (bits(wh), bits(wy)), "rank {r}");
    }
    close(&comms);
}
