//! `auto`: the platform from `DETCOLL_PLATFORM` or detection, fail closed, and a rank whose
//! choice failed fails every rank at once (through the agreement) instead of leaving its peers
//! waiting. One test in this binary: it sets process environment variables, which no other
//! test may observe.
#![cfg(feature = "cpu")]
use collective_factory::bootstrap::{Bootstrap, LocalBootstrap};
use collective_factory::{AnyCollective, Collective, Config, Error, Io, Platform, auto};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn config() -> Config {
    Config::new().with_capacity(1 << 16)
}

/// `auto::from_bootstrap` on every rank of a world of threads.
fn build(world: usize) -> Vec<Result<AnyCollective, Error>> {
    let boots = LocalBootstrap::group_with_timeout(world, Duration::from_secs(10));
    std::thread::scope(|s| {
        let hs: Vec<_> = boots
            .into_iter()
            .map(|b| {
                s.spawn(move || {
                    let b: Arc<dyn Bootstrap> = Arc::new(b);
                    auto::from_bootstrap(b, &config())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

fn all_reduce_on_cpu(ranks: &[AnyCollective]) {
    std::thread::scope(|s| {
        for comm in ranks {
            s.spawn(move || {
                let c = comm.as_cpu().expect("the CPU twin");
                let input = vec![1.5f32; 300];
                let mut out = vec![0f32; 300];
                c.all_reduce(Io::host(&input, &mut out), &()).unwrap();
                c.synchronize(&()).unwrap();
                assert_eq!(out[299], 1.5 * ranks.len() as f32);
            });
        }
    });
}

fn expect_invalid(r: &Result<impl std::fmt::Debug, Error>, needle: &str, what: &str) {
    match r {
        Err(Error::InvalidConfig { detail }) if detail.contains(needle) => {}
        other => panic!("{what}: expected InvalidConfig containing {needle:?}, got {other:?}"),
    }
}

#[test]
fn the_platform_is_forced_detected_or_refused_on_every_rank() {
    // Unset: detection. Without a GPU (or without its feature) that is the CPU twin.
    let p = auto::platform().unwrap();
    if p != Platform::Cpu {
        let gpu_built = cfg!(any(feature = "cuda", feature = "rocm"));
        assert!(gpu_built, "{p:?} detected without its feature");
        return; // A GPU host with a GPU build: the GPU suites cover it.
    }
    let ranks = auto::thread_group(2, &config()).unwrap();
    assert_eq!(
        ranks.iter().map(|r| (r.platform(), r.rank(), r.world_size())).collect::<Vec<_>>(),
        [(Platform::Cpu, 0, 2), (Platform::Cpu, 1, 2)]
    );
    all_reduce_on_cpu(&ranks);
    drop(ranks);
    let ranks: Vec<AnyCollective> = build(4).into_iter().map(Result::unwrap).collect();
    assert!(ranks.iter().all(|r| r.check().is_ok()));
    all_reduce_on_cpu(&ranks);
    drop(ranks);

    // A value that does not parse, or a platform this build lacks: InvalidConfig on every rank,
    // at once.
    let mut cases = vec![("foo", "DETCOLL_PLATFORM"), ("", "DETCOLL_PLATFORM"), ("cuda", "DETCOLL_PLATFORM")];
    if !cfg!(feature = "rocm") {
        cases.push(("rocm", "feature `rocm`"));
    }
    if !cfg!(feature = "cuda") {
        cases.push(("nvidia", "feature `cuda`"));
    }
    for (value, needle) in cases {
        // SAFETY: the only test of this binary; no other thread reads the environment now.
        unsafe { std::env::set_var("DETCOLL_PLATFORM", value) };
        expect_invalid(&auto::platform(), needle, &format!("platform() with {value:?}"));
        expect_invalid(&auto::thread_group(2, &config()), needle, &format!("thread_group with {value:?}"));
        for world in [1, 2, 4] {
            let t = Instant::now();
            for (rank, r) in build(world).iter().enumerate() {
                expect_invalid(r, needle, &format!("DETCOLL_PLATFORM={value:?}, world {world}, rank {rank}"));
            }
            assert!(t.elapsed() < Duration::from_secs(5), "{value:?}: failing took {:?}", t.elapsed());
        }
    }

    // Forced to the CPU twin (any case, as every DETCOLL_* choice).
    // SAFETY: as above.
    unsafe { std::env::set_var("DETCOLL_PLATFORM", "CPU") };
    assert_eq!(auto::platform().unwrap(), Platform::Cpu);
    all_reduce_on_cpu(&build(2).into_iter().map(Result::unwrap).collect::<Vec<_>>());
    // SAFETY: as above.
    unsafe { std::env::remove_var("DETCOLL_PLATFORM") };
}
