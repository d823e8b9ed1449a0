//! Every `DETCOLL_*` variable the CPU factory reads that does not parse, or is out of range,
//! fails construction with `InvalidConfig` naming it — on every rank at once, also when only
//! one rank's environment is wrong (reported through the agreement) — instead of silently
//! falling back to a default; the GPU's and the transport's variables, which it does not read,
//! fail nothing however bad. One test in this binary: it sets process environment variables,
//! which no other test may observe.
use collective_core::Error;
use collective_core::bootstrap::LocalBootstrap;
use collective_factory::{Config, cpu};
use std::time::{Duration, Instant};

fn build(world: usize) -> Vec<Result<(), Error>> {
    let boots = LocalBootstrap::group_with_timeout(world, Duration::from_secs(10));
    std::thread::scope(|s| {
        let hs: Vec<_> = boots
            .iter()
            .map(|b| {
                s.spawn(move || {
                    cpu::with_transport(
                        b,
                        &Config::new().with_capacity(1 << 16),
                        None::<fn() -> Result<collective_factory::NoTransport<()>, Error>>,
                    )
                    .map(drop)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank panicked")).collect()
    })
}

#[test]
fn invalid_environment_values_are_invalid_config_naming_the_variable() {
    let cases: &[(&str, &str)] = &[
        ("DETCOLL_TIMEOUT_MS", "abc"),
        ("DETCOLL_TIMEOUT_MS", "0"),
        ("DETCOLL_TIMEOUT_MS", "-1"),
        ("DETCOLL_TIMEOUT_MS", "99999999999"),
        ("DETCOLL_PLATFORM", "foo"),
        ("DETCOLL_PLATFORM", ""),
        ("DETCOLL_HOST_ID", ""),
        ("DETCOLL_ROUTING_TABLE", "/nonexistent/detcoll-routing.json"),
    ];
    for &(var, value) in cases {
        // SAFETY: the only test of this binary; no other thread reads the environment now.
        unsafe { std::env::set_var(var, value) };
        for world in [1, 2, 4] {
            let t = Instant::now();
            let got = build(world);
            let took = t.elapsed();
            for (rank, r) in got.iter().enumerate() {
                match r {
                    // The world's error says "invalid configuration" once, not again per reason.
                    Err(e @ Error::InvalidConfig { detail }) if detail.contains(var) => {
                        let msg = e.to_string();
                        assert_eq!(msg.matches("invalid configuration").count(), 1, "{msg}");
                    }
                    other => panic!(
                        "{var}={value:?}, world {world}, rank {rank}: expected InvalidConfig naming it, got {other:?}"
                    ),
                }
            }
            assert!(took < Duration::from_secs(5), "{var}={value:?}: failing took {took:?}");
        }
        // SAFETY: as above.
        unsafe { std::env::remove_var(var) };
    }
    // And with every variable unset the same builds work.
    assert!(build(2).iter().all(Result::is_ok));

    // The GPU's and the NCCL/RCCL transport's variables are not the CPU twin's: bad values
    // there leave a CPU job alone (docs/running.md, "Environment"; a GPU job fails on them).
    let gpu_only: &[(&str, &str)] = &[
        ("DETCOLL_LOCKSTEP", "bogus"),
        ("DETCOLL_PDL", "bogus"),
        ("DETCOLL_KERNEL_DIR", ""),
        ("DETCOLL_NCCL_LIBRARY", ""),
        ("DETCOLL_NCCL_BLOCKING", "bogus"),
        ("DETCOLL_HIP_ARCH", ""),
        ("DETCOLL_HIP_CONTROL_MEMORY", "bogus"),
        ("DETCOLL_TRANSPORT_WATCHDOG", "bogus"),
    ];
    for &(var, value) in gpu_only {
        // SAFETY: as above.
        unsafe { std::env::set_var(var, value) };
        for world in [1, 2, 4] {
            for (rank, r) in build(world).iter().enumerate() {
                assert!(r.is_ok(), "{var}={value:?}, world {world}, rank {rank}: a CPU rank failed: {r:?}");
            }
            let group = cpu::thread_group(world, &Config::new().with_capacity(1 << 16));
            assert!(group.is_ok(), "{var}={value:?}: a CPU thread group of {world} failed: {:?}", group.err());
        }
        // SAFETY: as above.
        unsafe { std::env::remove_var(var) };
    }
}
