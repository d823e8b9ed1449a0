//! The fail-closed outcomes the GPU twins' own tests check (`tests/gpu.rs` of `cuda-ipc` and
//! `hip-ipc`): a call mismatched between two ranks, and a rank that never arrives. The tests
//! make the calls; these judge what came back.
use crate::Error;
use std::time::Duration;

/// Rank `me` of two reduced `counts[me]` elements while its peer reduced `counts[1 - me]`. The
/// call must have ended (`waited`, enqueue to stream drained) before the peer timeout `bound`,
/// the backend's check after it (`checked`) must be the `SignatureMismatch` naming the peer and
/// both counts, and the next call (`again`, made only then) must be refused as poisoned.
pub fn expect_mismatch(
    me: usize,
    counts: [usize; 2],
    waited: Duration,
    bound: Duration,
    checked: Result<(), Error>,
    again: impl FnOnce() -> Result<(), Error>,
) -> Result<(), String> {
    if waited >= bound {
        return Err(format!("the mismatch took {waited:?}, as long as the timeout"));
    }
    match checked {
        Err(Error::SignatureMismatch { peer, ours, theirs }) => {
            if peer != 1 - me || ours.count != counts[me] as u64 || theirs.count != counts[1 - me] as u64 {
                return Err(format!("wrong mismatch report: peer {peer}, ours {ours}, theirs {theirs}"));
            }
        }
        other => return Err(format!("expected SignatureMismatch, got {other:?}")),
    }
    match again() {
        Err(Error::Poisoned { .. }) => Ok(()),
        other => Err(format!("expected Poisoned after the mismatch, got {other:?}")),
    }
}

/// The lanes every rank of a lane-split mismatch passes to `reduce_scatter_many`: element
/// counts (per rank, divisible by `world`) with the same total and lane count on every rank but
/// a different split on odd ranks (`[4w, 8w]` vs `[8w, 4w]`): before the split was part of the
/// signature, such calls returned `Ok` with the lanes' trees mixed.
pub fn split_lanes(rank: usize, world: usize) -> [usize; 2] {
    if rank.is_multiple_of(2) { [4 * world, 8 * world] } else { [8 * world, 4 * world] }
}

/// Rank `me` made the [`split_lanes`] call. Within `bound` (`waited`), the call or the
/// backend's check after it (`outcome`: the first error either returned) must be the
/// `SignatureMismatch` naming a peer of the other parity, with equal counts and lane counts but
/// different splits; `untouched` says whether every output still holds what was written before
/// the call; the next call (`again`) must be refused.
pub fn expect_split_mismatch(
    me: usize,
    waited: Duration,
    bound: Duration,
    outcome: Result<(), Error>,
    untouched: bool,
    again: impl FnOnce() -> Result<(), Error>,
) -> Result<(), String> {
    if waited >= bound {
        return Err(format!("the lane-split mismatch took {waited:?}, as long as the timeout"));
    }
    match outcome {
        Err(Error::SignatureMismatch { peer, ours, theirs }) => {
            if peer % 2 == me % 2
                || ours.count != theirs.count
                || ours.lanes != theirs.lanes
                || ours.split == theirs.split
            {
                return Err(format!("wrong mismatch report: peer {peer}, ours {ours}, theirs {theirs}"));
            }
        }
        other => return Err(format!("expected SignatureMismatch for mismatched lane splits, got {other:?}")),
    }
    if !untouched {
        return Err("a mismatched reduce_scatter_many wrote its outputs".into());
    }
    match again() {
        Err(Error::Poisoned { .. } | Error::SignatureMismatch { .. }) => Ok(()),
        other => Err(format!("expected the next call to be refused after the mismatch, got {other:?}")),
    }
}

/// Rank 0 called, rank 1 never did. The call must have ended (`waited`) after the peer timeout
/// `bound` and within ten times it, the check after it (`checked`) must be `PeerTimeout` naming
/// rank 1, and the next call (`again`, made only then) must be refused as poisoned; returns the
/// poison's cause.
pub fn expect_timeout(
    waited: Duration,
    bound: Duration,
    checked: Result<(), Error>,
    again: impl FnOnce() -> Result<(), Error>,
) -> Result<String, String> {
    if waited < bound || waited > bound * 10 {
        return Err(format!("the call ended after {waited:?}, bound {bound:?}"));
    }
    match checked {
        Err(Error::PeerTimeout { peer: 1, .. }) => {}
        other => return Err(format!("expected PeerTimeout from rank 1, got {other:?}")),
    }
    match again() {
        Err(Error::Poisoned { cause }) => Ok(cause),
        other => Err(format!("expected Poisoned, got {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{DType, Op, Route, Signature};

    fn sig(count: u64) -> Signature {
        Signature { op: Op::AllReduce, dtype: DType::F32, count, lanes: 1, split: 0, route: Route::IpcOneShot }
    }

    #[test]
    fn mismatch_outcomes() {
        let (fast, bound) = (Duration::from_millis(5), Duration::from_secs(1));
        let poisoned = || Err(Error::Poisoned { cause: "x".into() });
        let reported = |ours, theirs| Err(Error::SignatureMismatch { peer: 0, ours: sig(ours), theirs: sig(theirs) });
        expect_mismatch(1, [100, 101], fast, bound, reported(101, 100), poisoned).expect("rank 1");
        assert!(expect_mismatch(1, [100, 101], bound, bound, reported(101, 100), poisoned).is_err());
        assert!(expect_mismatch(1, [100, 101], fast, bound, reported(100, 101), poisoned).is_err());
        assert!(expect_mismatch(1, [100, 101], fast, bound, Ok(()), poisoned).is_err());
        assert!(expect_mismatch(1, [100, 101], fast, bound, reported(101, 100), || Ok(())).is_err());
    }

    #[test]
    fn timeout_outcomes() {
        let bound = Duration::from_millis(300);
        let timed_out = || Err(Error::PeerTimeout { peer: 1, what: "arrive", waited: bound });
        let poisoned = || Err(Error::Poisoned { cause: "timeout".into() });
        assert_eq!(expect_timeout(bound * 2, bound, timed_out(), poisoned).as_deref(), Ok("timeout"));
        assert!(expect_timeout(bound / 2, bound, timed_out(), poisoned).is_err());
        assert!(expect_timeout(bound * 11, bound, timed_out(), poisoned).is_err());
        assert!(expect_timeout(bound * 2, bound, Ok(()), poisoned).is_err());
        assert!(expect_timeout(bound * 2, bound, timed_out(), || Ok(())).is_err());
    }
}
