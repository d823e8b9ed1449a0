//! `close` from one thread while another thread's call on the same handle waits for its peer:
//! close waits for that call to end (its waits are bounded), and the calls after it are
//! `Closed`. Before, close returned at once, while the call still ran on the staging and the
//! peers' mappings that a rank with staging of its own frees at close (found by a probe
//! written as a user calls); on the transport route it still did until 2026-12-05, and a peer
//! that closed there was seen only after the bootstrap's exchange timeout (60 s; found by
//! another probe). Every route: the IPC routes, the transport, the IPC + transport hybrid, the
//! hierarchical route (virtual nodes).
#![cfg(feature = "cpu")]

use collective_factory::bootstrap::BootstrapError;
use collective_factory::{Collective, Config, Error, Io, Routing, cpu};
use std::time::{Duration, Instant};

/// A table sending every op of every size to `route` (all_reduce) or to one-shot (the others,
/// where `route` is an all_reduce route only).
fn every_call_on(route: &str) -> Routing {
    let other = if route == "ipc_rs_transport_ag" { "ipc_one_shot" } else { route };
    let rule = |op: &str, route: &str| format!(r#"{{"op":"{op}","min_bytes":0,"max_bytes":null,"route":"{route}"}}"#);
    let json = format!(
        r#"{{"platform":"cpu","source":"test: every call on {route}","rules":[{},{},{},{}]}}"#,
        rule("all_reduce", route),
        rule("all_gather", other),
        rule("reduce_scatter", other),
        rule("reduce_scatter_many", other)
    );
    Routing::from_json(&json).expect("table")
}

fn config() -> Config {
    Config::new().with_capacity(1 << 16).with_timeout(Duration::from_secs(20))
}

/// Every layout and route the test runs on: its name and the group's ranks.
fn groups() -> Vec<(&'static str, Vec<cpu::CpuCollective>)> {
    let on = |route| cpu::thread_group(2, &config().with_routing(every_call_on(route))).expect("group");
    vec![
        ("default routes", cpu::thread_group(2, &config()).expect("group")),
        ("ipc_push_ll", on("ipc_push_ll")),
        ("transport", on("transport")),
        ("ipc_rs_transport_ag", on("ipc_rs_transport_ag")),
        ("hierarchical (2 x 2 virtual nodes)", cpu::virtual_nodes(2, 2, &config()).expect("group")),
    ]
}

#[test]
fn close_waits_for_a_call_another_thread_has_in_flight() {
    for (name, ranks) in groups() {
        println!("{name}:");
        close_waits(name, &ranks);
    }
}

/// Rank 0's thread A calls; its thread B closes 200 ms later; the other ranks call 600 ms late.
fn close_waits(name: &str, ranks: &[cpu::CpuCollective]) {
    let world = ranks.len();
    // Rank r contributes r + 1: small integers, exact in any tree order.
    let expected = (1..=world).sum::<usize>() as f32;
    let t0 = Instant::now();
    let late = Duration::from_millis(600);
    let (call_end, close_end) = std::thread::scope(|s| {
        let r0 = &ranks[0];
        // Rank 0, thread A: a call whose peers come 600 ms later.
        let a = s.spawn(move || {
            let x = vec![1.0f32; 256];
            let mut y = vec![0f32; 256];
            let r = r0.all_reduce(Io::host(&x, &mut y), &());
            let end = t0.elapsed();
            if r.is_ok() {
                assert!(y.iter().all(|&v| v.to_bits() == expected.to_bits()), "{name}: the call in flight: {y:?}");
            }
            println!("rank 0 thread A: {r:?} at {end:?}");
            end
        });
        // Rank 0, thread B: close while A waits.
        let b = s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            let r = r0.close();
            let end = t0.elapsed();
            println!("rank 0 thread B: close {r:?} at {end:?}");
            let x = vec![1.0f32; 4];
            let mut y = vec![0f32; 4];
            match r0.all_reduce(Io::host(&x, &mut y), &()) {
                Err(Error::Closed) => {}
                other => panic!("{name}: a call after close: expected Closed, got {other:?}"),
            }
            assert!(matches!(r0.check(), Err(Error::Closed)), "{name}: check after close: {:?}", r0.check());
            end
        });
        // The other ranks: their calls come late.
        for (rank, comm) in ranks.iter().enumerate().skip(1) {
            s.spawn(move || {
                std::thread::sleep(late);
                let x = vec![rank as f32 + 1.0; 256];
                let mut y = vec![0f32; 256];
                println!("rank {rank}: {:?}", comm.all_reduce(Io::host(&x, &mut y), &()));
            });
        }
        (a.join().expect("thread A"), b.join().expect("thread B"))
    });
    // The call in flight cannot end before the peers start their calls (`late` after the
    // start), and close waits for it. (Comparing with `call_end` would race: thread A reads its
    // clock only after the call has released the handle to close.)
    assert!(
        close_end >= late,
        "{name}: close returned at {close_end:?}, before the call in flight could end (the peers called at \
         {late:?}; the call ended at {call_end:?})"
    );
}

#[test]
fn a_peer_that_closes_fails_the_others_calls_at_once() {
    for closer in 0..4 {
        for (name, ranks) in groups() {
            if closer < ranks.len() {
                peer_closes(name, &ranks, closer);
            }
        }
    }
}

/// Rank `closer` closes; the others call, and keep their handles open after their error, so no
/// rank's close or drop can end another's wait.
fn peer_closes(name: &str, ranks: &[cpu::CpuCollective], closer: usize) {
    std::thread::scope(|s| {
        for (rank, comm) in ranks.iter().enumerate() {
            s.spawn(move || {
                if rank == closer {
                    comm.close().expect("close");
                    return;
                }
                let x = vec![1.0f32; 64];
                let mut y = vec![0f32; 64];
                let r = comm.all_reduce(Io::host(&x, &mut y), &());
                println!("{name}: rank {closer} closed: rank {rank}: {r:?}");
                // Each rank names the rank it waited for: the closed one, or a peer that failed
                // on it (on the hierarchical route, a partner across nodes whose node step
                // failed). Never the exchange timeout (60 s) or `timeouts.peer` (20 s).
                assert!(
                    matches!(
                        r,
                        Err(Error::PeerClosed { .. }
                            | Error::PeerFailed { .. }
                            | Error::Bootstrap(BootstrapError::PeerGone { .. }))
                    ),
                    "{name}: rank {closer} closed: rank {rank}: {r:?}"
                );
            });
        }
    });
}
