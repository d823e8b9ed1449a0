//! A downstream engine's program: the end of a Llama-style decoder layer (the gated FFN,
//! `W2 · (SiLU(x · W1) ⊙ (x · W3))`, its all_reduce fused with the residual add and the next
//! RMSNorm) at TP 2, ranks as threads over `collective_factory::cpu::thread_group`, each rank
//! holding only its own weight shards as a per-rank checkpoint stores them
//! (`FfnShard::from_shards_gated`). Every rank's `h` and `y` are checked bit for bit against the
//! single-process reference (`decoder::reference_residual_rmsnorm_gated`), which is what the
//! layer gives at every TP. With feature `cuda` (no toolkit needed to build): without a GPU the
//! GPU path's first call is a typed error, not a panic.
#![forbid(unsafe_code)]

use collective_factory::half::bf16;
use collective_factory::{Collective, Config, cpu};
use detcoll_layers::decoder::reference_residual_rmsnorm_gated;
use detcoll_layers::{FfnShape, FfnShard, NextNorm, ReferenceGemm};

const TP: usize = 2;

/// A deterministic bf16 value in [-1, 1) scaled by `scale`.
fn value(i: usize, salt: usize, scale: f32) -> bf16 {
    bf16::from_f32((((i * 2654435761 + salt * 40503) % 1021) as f32 / 510.5 - 1.0) * scale)
}

fn main() {
    let shape = FfnShape { tokens: 5, hidden: 64, ffn: 256 };
    let (s, h, f) = (shape.tokens, shape.hidden, shape.ffn);
    let full = |salt: usize, n: usize, scale: f32| -> Vec<bf16> { (0..n).map(|i| value(i, salt, scale)).collect() };
    let x = full(1, s * h, 1.0);
    let (w1, w3) = (full(2, h * f, 0.125), full(3, h * f, 0.125)); // gate, up: hidden x ffn
    let w2 = full(4, f * h, 0.0625); // down: ffn x hidden
    let residual = full(5, s * h, 2.0);
    let weight = full(6, h, 1.0);
    let norm = NextNorm { weight: &weight, eps: 1e-5 };
    let (want_h, want_y) =
        reference_residual_rmsnorm_gated(&ReferenceGemm, shape, &x, (&w1, &w3, &w2), &residual, norm)
            .expect("the reference");

    // Rank r's checkpoint shards: columns r·F/TP.. of W1 and W3, the same rows of W2.
    let shard_of = |r: usize| {
        let cols = r * f / TP..(r + 1) * f / TP;
        let columns = |w: &[bf16]| -> Vec<bf16> { w.chunks(f).flat_map(|row| row[cols.clone()].to_vec()).collect() };
        (columns(&w1), columns(&w3), w2[cols.start * h..cols.end * h].to_vec())
    };
    let comms = cpu::thread_group(TP, &Config::new().with_capacity(1 << 16)).expect("cpu::thread_group");
    let outs: Vec<(Vec<bf16>, Vec<bf16>)> = std::thread::scope(|sc| {
        let hs: Vec<_> = comms
            .iter()
            .map(|comm| {
                let (x, residual, shard_of) = (&x, &residual, &shard_of);
                sc.spawn(move || {
                    let (g, u, d) = shard_of(comm.rank());
                    let shard = FfnShard::from_shards_gated(shape, g, u, d, TP, comm.rank()).expect("the rank's shard");
                    let mut h = residual.clone();
                    let mut y = vec![bf16::ZERO; h.len()];
                    shard
                        .forward_residual_rmsnorm(comm, &ReferenceGemm, x, &mut h, norm, &mut y)
                        .expect("decoder tail");
                    comm.close().expect("close");
                    (h, y)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let bits = |v: &[bf16]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
    for (r, (h, y)) in outs.iter().enumerate() {
        assert_eq!(bits(h), bits(&want_h), "rank {r}: h is not the reference's");
        assert_eq!(bits(y), bits(&want_y), "rank {r}: y is not the reference's");
    }
    assert!(want_y.iter().any(|v| v.to_f32() != 0.0) && want_y.iter().all(|v| v.to_f32().is_finite()));
    println!("uses-layers: gated decoder tail at TP {TP} from per-rank shards: h and y of both ranks = the reference");
    #[cfg(feature = "cuda")]
    gpu_path();
}

/// The GPU path without a GPU (or with one): a typed answer, never a panic.
#[cfg(feature = "cuda")]
fn gpu_path() {
    match detcoll_layers::cuda::require_device() {
        Ok(n) => println!("uses-layers: {n} CUDA device(s) visible"),
        Err(e) => {
            // No driver: the collective's `LibraryMissing`; a driver without a device: `Cuda`.
            let missing =
                matches!(e, detcoll_layers::Error::Collective(collective_factory::Error::LibraryMissing { .. }));
            assert!(missing || matches!(e, detcoll_layers::Error::Cuda { .. }), "{e:?}");
            println!("uses-layers: no CUDA device: a typed error ({e})");
        }
    }
}
