//! The ROCm composition on an AMD GPU host: world 1 through the factory (the HIP IPC
//! backend's local route; no transport is built for one rank), every call of `common::plan`
//! (every op, f32/f16/bf16, in place and not, reduce_scatter_many) bit-exact against
//! fixed-tree. Skips, saying so, without a HIP device (no AMD GPU was available when this was
//! written: never executed). Several GPUs: `tests/rocm_routes.rs`.
#![cfg(feature = "rocm")]
mod common;

#[test]
fn world1_through_the_factory_is_bit_exact() {
    common::world1::<common::rocm::Rocm>()
}

/// Without the HIP runtime every entry point is `LibraryMissing` (docs/running.md): the thread
/// group at once, and `from_bootstrap` on every rank, through the agreement (no rank waits for
/// one that dropped out), naming the ranks that lack it. (`from_device` takes a `HipDevice`,
/// which cannot exist without the runtime.) Skips, saying so, with a HIP runtime.
#[test]
fn without_the_runtime_every_entry_point_is_library_missing_on_every_rank() {
    use collective_core::Error;
    use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
    use collective_factory::{Config, DeviceSelect, RocmCollective, rocm};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    if hip_ipc::result::runtime_present() {
        println!("skipped: the HIP runtime is present");
        return;
    }
    let missing = |r: Result<(), Error>, ranks: &str| match r {
        Err(Error::LibraryMissing { library, detail }) => {
            assert!(library.contains("libamdhip64"), "{library}");
            assert!(detail.starts_with(ranks), "{detail}");
        }
        other => panic!("expected LibraryMissing, got {other:?}"),
    };
    // The thread group is the composed collective, as on the other platforms.
    let group: Result<Vec<RocmCollective>, Error> = rocm::thread_group(2, &Config::new());
    missing(group.map(drop), "");
    for config in [Config::new(), Config::new().with_device(DeviceSelect::Ordinal(0)), Config::new().with_capacity(0)] {
        for world in [1, 2] {
            let t = Instant::now();
            let boots = LocalBootstrap::group_with_timeout(world, Duration::from_secs(10));
            let got: Vec<Result<(), Error>> = std::thread::scope(|s| {
                let hs: Vec<_> = boots
                    .into_iter()
                    .map(|b| {
                        let config = &config;
                        s.spawn(move || {
                            let boot: Arc<dyn Bootstrap> = Arc::new(b);
                            rocm::from_bootstrap(boot, config).map(drop)
                        })
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
            });
            assert!(t.elapsed() < Duration::from_secs(5), "failing took {:?}", t.elapsed());
            for r in got {
                missing(r, if world == 1 { "rank 0: " } else { "ranks 0-1: " });
            }
        }
    }
}

/// A world of 0 ranks and a capacity of 0 are `InvalidConfig` before anything is opened.
#[test]
fn world_zero_and_capacity_zero_are_invalid_config() {
    use collective_core::Error;
    use collective_factory::{Config, rocm};
    for (world, config) in [(0, Config::new()), (2, Config::new().with_capacity(0))] {
        match rocm::thread_group(world, &config) {
            Err(Error::InvalidConfig { .. }) => {}
            Err(e) => panic!("world {world}: expected InvalidConfig, got {e:?}"),
            Ok(_) => panic!("world {world}: expected InvalidConfig, got a collective"),
        }
    }
}
