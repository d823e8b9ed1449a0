//! A downstream user's program: two ranks as threads, an f32 `all_reduce` through
//! `collective_factory::cpu::from_bootstrap` (each rank joins through a
//! `LocalBootstrap`, as ranks of one process do), bits checked on both ranks; then a decoder
//! layer's exit, the fused all_reduce + residual + RMSNorm of bf16 rows on a
//! `cpu::thread_group`, checked against the reference the factory re-exports
//! (`fixed_tree::residual_rmsnorm`), and the group dropped from one thread.
#![forbid(unsafe_code)]

use collective_factory::bootstrap::{Bootstrap, LocalBootstrap};
use collective_factory::{Collective, Config, Io};
use std::sync::Arc;

const N: usize = 4099; // not a multiple of any vector width

/// Rank `r`'s input: values whose f32 sum rounds (so a wrong dtype or order would show).
fn input(r: usize) -> Vec<f32> {
    (0..N).map(|i| (i as f32 + 0.1) * if r == 0 { 1.0 } else { 1.0e-3 } + r as f32 / 3.0).collect()
}

fn main() {
    let boots = LocalBootstrap::group(2);
    let results: Vec<Vec<f32>> = std::thread::scope(|s| {
        let handles: Vec<_> = boots
            .into_iter()
            .map(|boot| {
                s.spawn(move || {
                    let boot: Arc<dyn Bootstrap> = Arc::new(boot);
                    let config = Config::new().with_capacity(1 << 20);
                    let comm = collective_factory::cpu::from_bootstrap(boot, &config).expect("cpu::from_bootstrap");
                    let x = input(comm.rank());
                    let mut out = vec![0f32; N];
                    comm.all_reduce(Io::host(&x, &mut out), &()).expect("all_reduce");
                    comm.synchronize(&()).expect("synchronize");
                    out
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    let (a, b) = (input(0), input(1));
    for (r, out) in results.iter().enumerate() {
        for i in 0..N {
            // The tree of two ranks is r0 + r1, in f32.
            assert_eq!(out[i].to_bits(), (a[i] + b[i]).to_bits(), "rank {r}, element {i}");
        }
    }
    println!("uses-cpu: 2-rank all_reduce of {N} f32 through collective-factory: bits ok on both ranks");
    fused_norm();
}

/// Three rows of 4099 bf16 (odd: the scalar path), the residual updated in place to `h`.
fn fused_norm() {
    use collective_factory::fixed_tree::{RmsNormShape, residual_rmsnorm};
    use collective_factory::half::bf16;
    use collective_factory::{RawRef, RmsNorm, cpu};
    let (rows, hidden, eps) = (3, N, 1e-6);
    let value = |i: usize, k: usize| bf16::from_f32(((i * 31 + k * 7) % 97) as f32 / 17.0 - 2.5);
    let x = |r: usize| -> Vec<bf16> { (0..rows * hidden).map(|i| value(i, r + 1)).collect() };
    let residual: Vec<bf16> = (0..rows * hidden).map(|i| value(i, 11)).collect();
    let weight: Vec<bf16> = (0..hidden).map(|i| value(i, 13)).collect();
    let ranks = cpu::thread_group(2, &Config::new().with_capacity(1 << 16)).expect("cpu::thread_group");
    let got: Vec<(Vec<bf16>, Vec<bf16>)> = std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .iter()
            .map(|comm| {
                let (x, mut h, weight) = (x(comm.rank()), residual.clone(), &weight);
                s.spawn(move || {
                    let mut y = vec![bf16::ZERO; rows * hidden];
                    let norm =
                        RmsNorm { residual: Io::host_in_place(&mut h), weight: RawRef::host(weight), hidden, eps };
                    comm.all_reduce_residual_rmsnorm(Io::host(&x, &mut y), norm, &()).expect("fused call");
                    (h, y)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread")).collect()
    });
    drop(ranks); // from this thread, as a program's end does: returns at once
    let (x0, x1) = (x(0), x(1));
    let zero = bf16::ZERO;
    let (mut h, mut y) = (vec![zero; rows * hidden], vec![zero; rows * hidden]);
    residual_rmsnorm(&[&x0[..], &x1[..]], &residual, &weight, eps, RmsNormShape { rows, hidden }, &mut h, &mut y)
        .expect("reference");
    for (r, (gh, gy)) in got.iter().enumerate() {
        let bits = |v: &[bf16]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(gh), bits(&h), "rank {r}: h");
        assert_eq!(bits(gy), bits(&y), "rank {r}: y");
    }
    println!("uses-cpu: fused all_reduce + residual + RMSNorm of {rows} x {hidden} bf16: = fixed_tree on both ranks");
}
