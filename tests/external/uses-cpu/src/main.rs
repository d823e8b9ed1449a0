//! A downstream user's program: two ranks as threads, an f32 `all_reduce` through
//! `collective_factory::cpu::from_bootstrap` (each rank joins through a
//! `LocalBootstrap`, as ranks of one process do), bits checked on both ranks.
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
}
