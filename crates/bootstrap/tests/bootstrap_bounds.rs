//! Bootstrap timeouts are bounded (issue 25): a timeout above one day, `Duration::MAX` included,
//! is a typed `InvalidConfig` before anything is exchanged — never a panic ("overflow when
//! adding duration to instant") in the in-process bootstrap or in `split` — and
//! `DETCOLL_BOOTSTRAP_TIMEOUT_MS` has the same upper bound.

use std::time::{Duration, Instant};

use detcoll_bootstrap::{
    Bootstrap, BootstrapError, GroupTransport, LocalBootstrap, MAX_BOOTSTRAP_TIMEOUT, SplitOptions, TorchrunEnv, env,
    split, split_with,
};

/// Runs `f` on every rank of `boots`, each on its own thread; a panic is reported as `Err`.
fn on_every_rank<B: Sync, T: Send>(
    boots: &[B],
    f: impl Fn(&B) -> Result<T, BootstrapError> + Sync,
) -> Vec<std::thread::Result<Result<T, BootstrapError>>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = boots.iter().map(|b| s.spawn(|| f(b))).collect();
        hs.into_iter().map(|h| h.join()).collect()
    })
}

fn assert_invalid_config<T: std::fmt::Debug>(r: std::thread::Result<Result<T, BootstrapError>>, what: &str) {
    match r {
        Ok(Err(BootstrapError::InvalidConfig { detail })) => {
            assert!(detail.contains("86400s"), "{what}: {detail}");
        }
        Ok(other) => panic!("{what}: expected InvalidConfig, got {other:?}"),
        Err(_) => panic!("{what}: panicked"),
    }
}

#[test]
fn local_timeouts_above_a_day_fail_every_exchange_at_once_instead_of_panicking() {
    for world in [1, 2, 4] {
        for timeout in [Duration::MAX, MAX_BOOTSTRAP_TIMEOUT + Duration::from_millis(1)] {
            let t = Instant::now();
            let boots = LocalBootstrap::group_with_timeout(world, timeout);
            for r in on_every_rank(&boots, |b| b.all_gather_bytes(&[b.rank() as u8])) {
                assert_invalid_config(r, &format!("world {world}, {timeout:?}"));
            }
            assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
            let e = LocalBootstrap::try_group_with_timeout(world, timeout).unwrap_err();
            assert!(matches!(e, BootstrapError::InvalidConfig { .. }), "{e}");
        }
        assert!(LocalBootstrap::try_group_with_timeout(world, Duration::ZERO).is_err());
        // One day exactly is a bound like any other.
        let boots = LocalBootstrap::try_group_with_timeout(world, MAX_BOOTSTRAP_TIMEOUT).unwrap();
        for r in on_every_rank(&boots, |b| b.all_gather_bytes(&[b.rank() as u8])) {
            assert_eq!(r.unwrap().unwrap().len(), world);
        }
    }
}

#[test]
fn split_timeouts_above_a_day_are_invalid_config_on_every_rank() {
    let huge = [Duration::MAX, MAX_BOOTSTRAP_TIMEOUT + Duration::from_secs(1)];
    for transport in [GroupTransport::Auto, GroupTransport::Tcp] {
        for d in huge {
            for opts in [
                SplitOptions { transport, connect_timeout: Some(d), exchange_timeout: None },
                SplitOptions { transport, connect_timeout: None, exchange_timeout: Some(d) },
            ] {
                let boots = LocalBootstrap::group_with_timeout(2, Duration::from_secs(10));
                for r in on_every_rank(&boots, |b| split_with(b, Some(0), 0, &opts).map(|g| g.is_some())) {
                    assert_invalid_config(r, &format!("{opts:?}"));
                }
                // Nothing was exchanged: the parent still works.
                for r in on_every_rank(&boots, |b| b.all_gather_bytes(b"ok")) {
                    assert_eq!(r.unwrap().unwrap().len(), 2);
                }
            }
        }
    }
}

/// A bootstrap whose own timeouts are `Duration::MAX` (an engine's "wait forever").
#[derive(Debug)]
struct Forever(LocalBootstrap);

impl Bootstrap for Forever {
    fn rank(&self) -> usize {
        self.0.rank()
    }
    fn world_size(&self) -> usize {
        self.0.world_size()
    }
    fn local_rank(&self) -> usize {
        self.0.local_rank()
    }
    fn local_world_size(&self) -> usize {
        self.0.local_world_size()
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        self.0.all_gather_bytes(mine)
    }
    fn timeouts(&self) -> Option<(Duration, Duration)> {
        Some((Duration::MAX, Duration::MAX))
    }
}

#[test]
fn groups_of_a_parent_without_bounds_get_the_largest_bound() {
    let parents: Vec<Forever> =
        LocalBootstrap::group_with_timeout(4, Duration::from_secs(10)).into_iter().map(Forever).collect();
    let groups = on_every_rank(&parents, |p| {
        let g = split(p, Some(p.rank() as u32 % 2), 0)?.expect("a group");
        let got = g.all_gather_bytes(&[p.rank() as u8])?;
        Ok((g.timeouts(), got))
    });
    for (r, res) in groups.into_iter().enumerate() {
        let (timeouts, got) = res.expect("no panic").expect("split");
        assert_eq!(timeouts, Some((MAX_BOOTSTRAP_TIMEOUT, MAX_BOOTSTRAP_TIMEOUT)), "rank {r}");
        assert_eq!(got, vec![vec![(r % 2) as u8], vec![(r % 2 + 2) as u8]], "rank {r}");
    }
}

#[test]
fn bootstrap_timeout_variable_is_at_most_a_day() {
    let vars = |timeout: &str| {
        let v: Vec<(&str, String)> = vec![
            (env::RANK, "0".into()),
            (env::WORLD_SIZE, "2".into()),
            (env::LOCAL_RANK, "0".into()),
            (env::LOCAL_WORLD_SIZE, "2".into()),
            (env::MASTER_ADDR, "127.0.0.1".into()),
            (env::MASTER_PORT, "29500".into()),
            (env::TIMEOUT_MS, timeout.into()),
        ];
        TorchrunEnv::from_lookup(|name| v.iter().find(|(n, _)| *n == name).map(|(_, x)| x.clone()))
    };
    assert_eq!(vars("86400000").unwrap().timeout, Some(MAX_BOOTSTRAP_TIMEOUT));
    for bad in ["86400001", "18446744073709551615", "0"] {
        match vars(bad) {
            Err(BootstrapError::BadEnv { var, expected, .. }) => {
                assert_eq!(var, env::TIMEOUT_MS);
                assert!(expected.contains("86400000"), "{expected}");
            }
            other => panic!("{bad}: {other:?}"),
        }
    }
}
