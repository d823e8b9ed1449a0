//! `HostTransport::close`, ranks as threads over `LocalBootstrap`: it waits for a call in flight
//! on another thread of its handle, later calls and `check` are `Closed`, and a peer that
//! closes is seen at once (`PeerGone`), not after the exchange timeout.
use collective_core::bootstrap::{BootstrapError, LocalBootstrap};
use collective_core::{Collective, Error, Io};
use detcoll_host_transport::HostTransport;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every exchange's bound: a peer's close that went unnoticed shows as `PeerTimeout` after it,
/// not as the `PeerGone` the tests expect.
const TIMEOUT: Duration = Duration::from_secs(30);

fn transports(world: usize) -> Vec<HostTransport> {
    LocalBootstrap::group_with_timeout(world, TIMEOUT)
        .into_iter()
        .map(|b| HostTransport::new(Arc::new(b)).expect("transport"))
        .collect()
}

#[test]
fn a_peer_that_closes_is_gone_for_the_others_at_once() {
    let ranks = transports(3);
    std::thread::scope(|s| {
        for t in &ranks {
            s.spawn(move || {
                let rank = t.rank();
                let input = vec![rank as f32 + 1.0; 6];
                let mut out = vec![0.0f32; 6];
                t.all_reduce(Io::host(&input, &mut out), &()).expect("first all_reduce");
                assert_eq!(out, vec![6.0; 6]);
                if rank == 2 {
                    t.close().expect("close");
                    return;
                }
                let mut out = vec![5.0f32; 6];
                let r = t.all_reduce(Io::host(&input, &mut out), &());
                assert!(
                    matches!(r, Err(Error::Bootstrap(BootstrapError::PeerGone { rank: 2, .. }))),
                    "rank {rank}: {r:?}"
                );
                assert_eq!(out, vec![5.0; 6], "a failed call writes nothing");
                assert!(matches!(t.check(), Err(Error::Poisoned { .. })), "{:?}", t.check());
            });
        }
    });
}

#[test]
fn close_waits_for_the_call_in_flight_and_later_calls_are_closed() {
    let ranks = transports(2);
    let (a, b) = (&ranks[0], &ranks[1]);
    let start = Instant::now();
    std::thread::scope(|s| {
        // Rank 0's call waits in its exchange until rank 1 joins.
        let call = s.spawn(|| {
            let mut out = vec![0.0f32; 4];
            let r = a.all_reduce(Io::host(&[1.0f32; 4], &mut out), &());
            (r, out)
        });
        // Another thread of rank 0 closes meanwhile.
        let close = s.spawn(|| {
            std::thread::sleep(Duration::from_millis(100));
            let r = a.close();
            (r, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(400));
        let mut out = vec![0.0f32; 4];
        // Rank 0's call cannot end before rank 1 joins its exchange, so a close that waited for
        // that call returns after this instant. (A flag the call's thread set after the call
        // returned raced with close: close may take the call lock and return between the call's
        // end and the flag's store, which a loaded 2-core CI machine did.)
        let joined_at = start.elapsed();
        let r1 = b.all_reduce(Io::host(&[2.0f32; 4], &mut out), &());
        let (r, out0) = call.join().expect("call thread");
        let (closed, closed_at) = close.join().expect("close thread");
        closed.expect("close");
        match r {
            // The call was in flight when close came: close returned after it.
            Ok(()) => {
                r1.expect("rank 1's all_reduce");
                assert!(
                    closed_at >= joined_at,
                    "close returned at {closed_at:?}, while the call was in flight (rank 1 joined at {joined_at:?})"
                );
                assert_eq!((out0, out), (vec![3.0; 4], vec![3.0; 4]));
            }
            // Close came first (a slow thread start): the call was refused, writing nothing,
            // and rank 1 found rank 0 gone.
            Err(Error::Closed) => {
                assert_eq!(out0, vec![0.0; 4]);
                assert!(matches!(r1, Err(Error::Bootstrap(BootstrapError::PeerGone { rank: 0, .. }))), "{r1:?}");
            }
            Err(e) => panic!("{e:?}"),
        }
    });
    let mut out = vec![5.0f32; 4];
    assert!(matches!(a.all_reduce(Io::host(&[1.0f32; 4], &mut out), &()), Err(Error::Closed)));
    assert_eq!(out, vec![5.0; 4]);
    assert!(matches!(a.check(), Err(Error::Closed)), "{:?}", a.check());
    assert!(matches!(a.synchronize(&()), Err(Error::Closed)));
    a.close().expect("close twice");
}
