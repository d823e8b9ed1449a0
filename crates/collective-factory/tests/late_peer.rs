//! A peer that arrives after the others' bound (`timeouts.peer`): what each rank gets, pinned.
//! The ranks that waited report `PeerTimeout` within the bound and are poisoned. The late rank
//! finds its peers' inputs published and intact (a rank that gave up writes nothing more), so
//! it may complete the call with the exact sum, and then fails its next call within the bound:
//! never a hang, never a wrong `Ok`. (Which side of the bound the late rank falls is a race no
//! protocol can close: the late rank may read a flag just before its peer gives up on it.)
#![cfg(feature = "cpu")]

use collective_factory::{Collective, Config, Error, Io, cpu};
use std::time::{Duration, Instant};

const BOUND: Duration = Duration::from_millis(1500);

#[test]
fn a_rank_arriving_after_the_bound_gets_the_exact_sum_or_an_error_then_fails_its_next_call() {
    let ranks = cpu::thread_group(2, &Config::new().with_capacity(1 << 16).with_timeout(BOUND)).expect("group");
    let n = 1000;
    std::thread::scope(|s| {
        for comm in &ranks {
            s.spawn(move || {
                let me = comm.rank();
                let x = vec![(me + 1) as f32; n];
                let mut y = vec![-7.0f32; n];
                if me == 1 {
                    std::thread::sleep(BOUND * 2);
                }
                let t = Instant::now();
                let first = comm.all_reduce(Io::host(&x, &mut y), &());
                let took = t.elapsed();
                if me == 0 {
                    match first {
                        Err(Error::PeerTimeout { .. }) => {}
                        other => panic!("rank 0: expected PeerTimeout, got {other:?}"),
                    }
                    assert!(took < BOUND * 2, "rank 0 waited {took:?}");
                    assert!(y.iter().all(|&v| v == -7.0), "rank 0's refused call wrote its output");
                } else {
                    // If it completes: the exact sum of both inputs (rank 0's is intact where
                    // it published it).
                    if first.is_ok() {
                        assert!(y.iter().all(|&v| v.to_bits() == 3.0f32.to_bits()), "late rank's sum");
                    }
                }
                // The next call fails on both, within the bound: rank 0 is poisoned, rank 1's
                // peer never comes.
                let t = Instant::now();
                let next = comm.all_reduce(Io::host(&x, &mut y), &());
                assert!(next.is_err(), "rank {me}: the call after the timeout returned Ok");
                if me == 1 && first.is_ok() {
                    // Rank 0 is alive and stopped after its timeout: it has not died.
                    match &next {
                        Err(Error::PeerFailed { peer: 0, detail }) => {
                            assert!(detail.contains("timed out"), "rank 1: the cause: {detail}")
                        }
                        other => panic!("rank 1: expected PeerFailed naming rank 0, got {other:?}"),
                    }
                }
                assert!(t.elapsed() < BOUND * 3, "rank {me}: the next call took {:?}", t.elapsed());
                println!("rank {me}: first {first:?} after {took:?}, next {next:?}");
            });
        }
    });
}
