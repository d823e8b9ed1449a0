//! `DETCOLL_BOOTSTRAP_TIMEOUT_MS` bounds the rendezvous of the factory's thread groups, and so
//! the host transports over it (the transport route, the hierarchical route's step across
//! virtual nodes), as it bounds processes' TCP bootstrap: a rank alive that never calls is
//! `PeerTimeout` after it, not after `LocalBootstrap`'s 60 s; a bad value fails construction.
//! One test in this binary: it sets a process environment variable, which no other test may
//! observe.
#![cfg(feature = "cpu")]

use collective_factory::bootstrap::BootstrapError;
use collective_factory::{Collective, Config, Error, Io, Routing, cpu};
use std::sync::Barrier;
use std::time::{Duration, Instant};

const TRANSPORT: &str = r#"{"platform":"cpu","source":"test: every call on the transport","rules":[
  {"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"transport"},
  {"op":"all_gather","min_bytes":0,"max_bytes":null,"route":"transport"},
  {"op":"reduce_scatter","min_bytes":0,"max_bytes":null,"route":"transport"},
  {"op":"reduce_scatter_many","min_bytes":0,"max_bytes":null,"route":"transport"}]}"#;

/// Ranks `0..callers` call; the others live on without calling until those calls returned.
fn silent_peers(ranks: &[cpu::CpuCollective], callers: usize) -> Vec<Result<(), Error>> {
    let done = Barrier::new(ranks.len());
    std::thread::scope(|s| {
        let calls: Vec<_> = ranks
            .iter()
            .enumerate()
            .map(|(rank, comm)| {
                let done = &done;
                s.spawn(move || {
                    if rank >= callers {
                        done.wait();
                        return Ok(());
                    }
                    let t = Instant::now();
                    let mut y = vec![0f32; 16];
                    let r = comm.all_reduce(Io::host(&[1.0f32; 16], &mut y), &());
                    println!("rank {rank}: {r:?} after {:?}", t.elapsed());
                    done.wait();
                    r
                })
            })
            .collect();
        calls.into_iter().take(callers).map(|h| h.join().expect("rank")).collect()
    })
}

/// A bootstrap `PeerTimeout` after the variable's 1500 ms.
fn timed_out(r: &Result<(), Error>) -> bool {
    matches!(r, Err(Error::Bootstrap(BootstrapError::PeerTimeout { waited, .. })) if *waited == Duration::from_millis(1500))
}

#[test]
fn the_bootstrap_timeout_bounds_thread_groups() {
    // SAFETY: the only test of this binary; no other thread reads the environment now.
    unsafe { std::env::set_var("DETCOLL_BOOTSTRAP_TIMEOUT_MS", "1500") };
    let config = Config::new().with_capacity(1 << 16).with_timeout(Duration::from_secs(20));
    let flat = cpu::thread_group(2, &config.clone().with_routing(Routing::from_json(TRANSPORT).expect("table")))
        .expect("group");
    let r = silent_peers(&flat, 1);
    assert!(timed_out(&r[0]), "transport route: {r:?}");
    // The hierarchical route: node 0's ranks do their node step, then wait across nodes for
    // node 1's, which never call.
    let nodes = cpu::virtual_nodes(2, 2, &config).expect("group");
    let r = silent_peers(&nodes, 2);
    assert!(r.iter().all(timed_out), "hierarchical route: {r:?}");
    for value in ["0", "abc", "99999999999"] {
        // SAFETY: as above.
        unsafe { std::env::set_var("DETCOLL_BOOTSTRAP_TIMEOUT_MS", value) };
        let r = cpu::thread_group(2, &config);
        assert!(
            matches!(&r, Err(Error::Bootstrap(BootstrapError::BadEnv { var: "DETCOLL_BOOTSTRAP_TIMEOUT_MS", .. }))),
            "{value}: {:?}",
            r.as_ref().map(|_| ())
        );
    }
    // SAFETY: as above.
    unsafe { std::env::remove_var("DETCOLL_BOOTSTRAP_TIMEOUT_MS") };
}
