//! `HostTransport::abandon` from another thread while a call of the handle waits in its exchange
//! (a composed collective giving up on this rank after a failure elsewhere): abandon returns at
//! once instead of waiting out the exchange, the call in flight fails as `Poisoned` with the
//! cause and writes nothing, and the rank's peers see it gone once that call has ended.
use collective_core::bootstrap::{BootstrapError, LocalBootstrap};
use collective_core::{Collective, Error, Io};
use detcoll_host_transport::HostTransport;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every exchange's bound. An abandon that waited for the call in flight would take this long
/// (the call waits for a peer the test holds back until abandon has returned).
const TIMEOUT: Duration = Duration::from_secs(20);
/// A fail-fast bound on abandon's return, far below `TIMEOUT`; not a timing.
const PROMPT: Duration = Duration::from_secs(5);
const CAUSE: &str = "the test's other backend failed";

/// Two ranks over `LocalBootstrap` whose exchanges wait at most `timeout`.
fn transports(timeout: Duration) -> Vec<HostTransport> {
    LocalBootstrap::group_with_timeout(2, timeout)
        .into_iter()
        .map(|b| HostTransport::new(Arc::new(b)).expect("transport"))
        .collect()
}

/// Rank `t`'s all_reduce of `n` ones into sevens: its result and output.
fn ones(t: &HostTransport, n: usize) -> (Result<(), Error>, Vec<f32>) {
    let mut out = vec![7.0f32; n];
    let r = t.all_reduce(Io::host(&vec![1.0f32; n], &mut out), &());
    (r, out)
}

#[test]
fn abandon_does_not_wait_for_the_call_in_flight_which_fails_writing_nothing() {
    let ranks = transports(TIMEOUT);
    let (a, b) = (&ranks[0], &ranks[1]);
    std::thread::scope(|s| {
        // Rank 0's call waits in its exchange: rank 1 joins only after the abandon returned.
        let call = s.spawn(|| ones(a, 4));
        std::thread::sleep(Duration::from_millis(200));
        let t = Instant::now();
        a.abandon(CAUSE);
        let took = t.elapsed();
        assert!(took < PROMPT, "abandon waited {took:?} for the call in flight");
        assert!(matches!(a.check(), Err(Error::Poisoned { ref cause }) if cause == CAUSE), "{:?}", a.check());

        let mut out1 = vec![7.0f32; 4];
        let r1 = b.all_reduce(Io::host(&[2.0f32; 4], &mut out1), &());
        let (r0, out0) = call.join().expect("rank 0's call");
        assert!(matches!(r0, Err(Error::Poisoned { ref cause }) if cause == CAUSE), "rank 0: {r0:?}");
        assert_eq!(out0, vec![7.0; 4], "the abandoned call wrote its output");
        match r1 {
            // Rank 0's call was in its exchange: the exchange completed for rank 1, whose
            // result is the true sum.
            Ok(()) => assert_eq!(out1, vec![3.0; 4]),
            // Rank 0's call started after the abandon (a slow thread start) and was refused:
            // rank 1 found it gone, wrote nothing.
            Err(Error::Bootstrap(BootstrapError::PeerGone { rank: 0, .. })) => assert_eq!(out1, vec![7.0; 4]),
            Err(e) => panic!("rank 1: {e:?}"),
        }
        // Rank 0 is gone for good: rank 1's next call sees it at once, not at the timeout.
        let t = Instant::now();
        let mut out1 = vec![7.0f32; 4];
        let r1 = b.all_reduce(Io::host(&[2.0f32; 4], &mut out1), &());
        assert!(matches!(r1, Err(Error::Bootstrap(BootstrapError::PeerGone { rank: 0, .. }))), "rank 1: {r1:?}");
        assert!(t.elapsed() < PROMPT, "rank 1 waited {:?} for the abandoned rank", t.elapsed());
        assert_eq!(out1, vec![7.0; 4]);
    });
    // The abandoned handle refuses every later call, writing nothing.
    let mut out = vec![5.0f32; 4];
    let r = a.all_reduce(Io::host(&[1.0f32; 4], &mut out), &());
    assert!(matches!(r, Err(Error::Poisoned { ref cause }) if cause == CAUSE), "{r:?}");
    assert_eq!(out, vec![5.0; 4]);
}

/// The same when the call in flight's exchange then fails (its peer never comes; here after
/// the exchange bound of 2 s): the call fails as `Poisoned` with the abandon's cause, not with
/// the exchange's `PeerTimeout` (which the abandon caused). Found by an outside probe,
/// 2026-12-07: the exchange's error was returned.
#[test]
fn an_abandoned_call_whose_exchange_then_fails_is_poisoned_too() {
    let ranks = transports(Duration::from_secs(2));
    let a = &ranks[0];
    std::thread::scope(|s| {
        let call = s.spawn(|| ones(a, 8));
        std::thread::sleep(Duration::from_millis(100));
        a.abandon(CAUSE);
        let (r, out) = call.join().expect("rank 0's call");
        assert!(matches!(r, Err(Error::Poisoned { ref cause }) if cause == CAUSE), "{r:?}");
        assert_eq!(out, vec![7.0; 8]);
    });
    assert!(matches!(a.check(), Err(Error::Poisoned { ref cause }) if cause == CAUSE), "{:?}", a.check());
}
