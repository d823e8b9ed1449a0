//! `Collective::abandon` as a user composing collectives calls it: a rank whose other group
//! failed (a data-parallel step, the hierarchical route's step across nodes) abandons this
//! one, and its peers waiting in a call of this one fail at once with `PeerFailed` — not
//! `PeerTimeout` at their own bound — on every IPC route and on the hierarchical route; the
//! abandoning rank's later calls are `Poisoned` with the cause, and nothing is an `Ok`.
#![cfg(feature = "cpu")]

mod norm_data;

use collective_factory::{Collective, Config, CpuCollective, Error, Io, cpu};
use norm_data::every_size_by;
use std::time::{Duration, Instant};

/// The peers' bound: waiting for an abandoned rank must end far sooner.
const BOUND: Duration = Duration::from_secs(30);
const CAUSE: &str = "the data-parallel all_reduce failed";

/// Every rank but `quitter` makes one all_reduce of `n` elements while `quitter` abandons
/// the group (after `delay`, so most peers are already waiting): each must fail with
/// `PeerFailed` (`across`: or the transport's `Bootstrap` error) well within the bound; then
/// every rank's next call is refused at once.
fn abandon_during_a_call(comms: &[CpuCollective], quitter: usize, n: usize, delay: Duration, across: bool) {
    std::thread::scope(|s| {
        for comm in comms {
            s.spawn(move || {
                let me = comm.rank();
                let x = vec![(me + 1) as f32; n];
                let mut y = vec![-7.0f32; n];
                if me == quitter {
                    std::thread::sleep(delay);
                    comm.abandon(CAUSE);
                } else {
                    let t = Instant::now();
                    let got = comm.all_reduce(Io::host(&x, &mut y), &());
                    let took = t.elapsed();
                    match &got {
                        Err(Error::PeerFailed { .. }) => {}
                        // Across nodes the host transport says its partner released the
                        // exchange (the transport's own `abandon`).
                        Err(Error::Bootstrap(_)) if across => {}
                        other => panic!("rank {me}: expected PeerFailed, got {other:?} after {took:?}"),
                    }
                    assert!(took < BOUND / 3, "rank {me} waited {took:?} for the abandoned rank");
                }
                // Later calls fail at once, on the abandoning rank with its cause.
                let t = Instant::now();
                match comm.all_reduce(Io::host(&x, &mut y), &()) {
                    Err(Error::Poisoned { cause }) if me == quitter => {
                        assert!(cause.contains(CAUSE), "rank {me}: the cause: {cause}")
                    }
                    Err(Error::Poisoned { .. }) if me != quitter => {}
                    other => panic!("rank {me}: the call after abandon: {other:?}"),
                }
                assert!(t.elapsed() < BOUND / 3, "rank {me}: the call after abandon took {:?}", t.elapsed());
            });
        }
    });
}

#[test]
fn peers_of_a_rank_that_abandons_fail_at_once_on_every_ipc_route() {
    for route in ["ipc_push_ll", "ipc_one_shot", "ipc_push", "ipc_rs_ag"] {
        for (world, quitter) in [(2, 1), (4, 2), (4, 0)] {
            let config =
                Config::new().with_capacity(1 << 16).with_timeout(BOUND).with_routing(every_size_by("cpu", route));
            let comms = cpu::thread_group(world, &config).expect("thread group");
            // 1000 elements (one launch) and 40000 (chunks above the 64 KiB staging).
            for n in [1000, 40_000] {
                let comms = if n == 1000 { &comms } else { &cpu::thread_group(world, &config).expect("thread group") };
                abandon_during_a_call(comms, quitter, n, Duration::from_millis(200), false);
            }
            println!("{route}, world {world}: rank {quitter} abandoned, every peer PeerFailed at once");
        }
    }
}

#[test]
fn peers_called_after_the_abandon_fail_at_once() {
    let comms = cpu::thread_group(3, &Config::new().with_timeout(BOUND)).expect("thread group");
    abandon_during_a_call(&comms, 1, 4096, Duration::ZERO, false);
}

#[test]
fn peers_of_a_rank_that_abandons_fail_at_once_on_the_hierarchical_route() {
    // Two virtual nodes of two ranks: the abandoning rank's node peer waits for it inside the
    // node (IPC), its partner across nodes in the transport, and the remaining rank for a
    // partner that failed — each must fail well before the bound.
    let config = Config::new().with_capacity(1 << 16).with_timeout(BOUND);
    for quitter in [1, 2] {
        let comms = cpu::virtual_nodes(2, 2, &config).expect("virtual nodes");
        assert_eq!(comms[0].route(collective_factory::Op::AllReduce, 4000), collective_factory::Route::Hierarchical);
        abandon_during_a_call(&comms, quitter, 1000, Duration::from_millis(200), true);
    }
}

#[test]
fn abandon_after_close_and_twice_is_harmless() {
    let comms = cpu::thread_group(2, &Config::new().with_timeout(BOUND)).expect("thread group");
    comms[0].abandon("first");
    comms[0].abandon("second");
    let x = vec![1.0f32; 8];
    let mut y = vec![0.0f32; 8];
    match comms[0].all_reduce(Io::host(&x, &mut y), &()) {
        Err(Error::Poisoned { cause }) => assert!(cause.contains("first") && !cause.contains("second"), "{cause}"),
        other => panic!("expected Poisoned with the first cause, got {other:?}"),
    }
    comms[1].close().expect("close");
    comms[1].abandon("after close");
    assert!(matches!(comms[1].all_reduce(Io::host(&x, &mut y), &()), Err(Error::Closed)));
}

/// As `ncclCommAbort` from a watchdog thread: rank 0's call waits for rank 1, which never
/// calls; another thread abandons rank 0's handle, and the waiting call returns at once —
/// `Poisoned`, never `Ok` — on every IPC route; rank 1's calls then fail at once too (its
/// first may still complete with the exact sum from rank 0's published input).
#[test]
fn a_watchdog_abandoning_a_waiting_call_ends_it_at_once() {
    for route in ["ipc_push_ll", "ipc_one_shot", "ipc_push", "ipc_rs_ag"] {
        let config = Config::new().with_capacity(1 << 16).with_timeout(BOUND).with_routing(every_size_by("cpu", route));
        let comms = cpu::thread_group(2, &config).expect("thread group");
        let n = 1000;
        let (x, mut y) = (vec![1.0f32; n], vec![-7.0f32; n]);
        std::thread::scope(|s| {
            let comm = &comms[0];
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(300));
                comm.abandon("watchdog: the step took too long");
            });
            let t = Instant::now();
            let got = comms[0].all_reduce(Io::host(&x, &mut y), &());
            let took = t.elapsed();
            match &got {
                Err(Error::Poisoned { .. }) => {}
                other => panic!("{route}: the abandoned call: expected Poisoned, got {other:?} after {took:?}"),
            }
            assert!(took < BOUND / 3, "{route}: the abandoned call waited {took:?}");
        });
        // Rank 1 arrives late: rank 0's input may already be published and intact (a rank
        // that stopped writes nothing more), so its call may complete with the exact sum (as
        // `late_peer.rs`); otherwise, and at its next call in any case, `PeerFailed` naming
        // rank 0 at once.
        let mut z = vec![-7.0f32; n];
        let t = Instant::now();
        let mut outcome = comms[1].all_reduce(Io::host(&x, &mut z), &());
        if outcome.is_ok() {
            assert!(z.iter().all(|v| v.to_bits() == 2.0f32.to_bits()), "{route}: rank 1's Ok call: not the sum");
            outcome = comms[1].all_reduce(Io::host(&x, &mut z), &());
        }
        match outcome {
            Err(Error::PeerFailed { peer: 0, .. }) => {}
            other => panic!("{route}: rank 1 after rank 0 was abandoned: {other:?}"),
        }
        assert!(t.elapsed() < BOUND / 3, "{route}: rank 1 waited {:?}", t.elapsed());
        println!("{route}: a waiting call abandoned from another thread ended after the abandon");
    }
}
