//! The backend-neutral halves of construction and close that device twins run on the host.
use super::{CLOSE_ACK, HEADER_WORDS, Header, Layout};
use collective_core::Error;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Runs a handle's close once and remembers how it ended: a later `close()` (or the one in
/// `Drop`) returns `Ok` after a successful close and [`Error::CloseFailed`] with the first
/// failure after a failed one — never a silent `Ok` that hides it.
#[derive(Debug, Default)]
pub struct CloseOnce {
    outcome: Mutex<Option<Result<(), String>>>,
}

impl CloseOnce {
    /// `close` on the first call (holding the lock, so concurrent closes wait for it); the
    /// remembered outcome on every later call.
    pub fn run(&self, close: impl FnOnce() -> Result<(), Error>) -> Result<(), Error> {
        let mut g = self.outcome.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match &*g {
            Some(Ok(())) => Ok(()),
            Some(Err(cause)) => Err(Error::CloseFailed { cause: cause.clone() }),
            None => {
                let r = close();
                *g = Some(r.as_ref().map(|_| ()).map_err(ToString::to_string));
                r
            }
        }
    }

    /// Whether a close has started or finished.
    pub fn started(&self) -> bool {
        self.outcome.lock().map(|g| g.is_some()).unwrap_or(true)
    }
}

/// A peer whose close acknowledgement a close did not get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingAck {
    /// Still missing when the bound passed: the peer may still read this rank's memory.
    Waited(usize),
    /// Its process exited (process id `pid`) without acknowledging: nothing of it reads this
    /// rank's memory any more.
    Exited { peer: usize, pid: u32 },
}

/// Polls this rank's `ack` lines (read through `read_ack(line offset)`) until every peer has
/// written [`CLOSE_ACK`] or is known to have exited (`exited(peer)`: its process id), or
/// `timeout` passes. Returns a peer still missing when the bound passed, else one that exited
/// without acknowledging, else `None`: a close after a peer's crash does not wait the bound
/// for it.
pub fn first_missing_ack(
    layout: &Layout,
    rank: usize,
    world: usize,
    timeout: Duration,
    mut read_ack: impl FnMut(usize) -> Result<u64, Error>,
    mut exited: impl FnMut(usize) -> Option<u32>,
) -> Result<Option<MissingAck>, Error> {
    let deadline = Instant::now() + timeout;
    loop {
        let (mut waiting, mut gone) = (None, None);
        for q in (0..world).filter(|&q| q != rank) {
            if read_ack(layout.ack(q))? == CLOSE_ACK {
                continue;
            }
            match exited(q) {
                // Read again once the process is seen gone: it may have written its ack after
                // the read above and then exited (its close returned: it had every ack, ours
                // included). Only an ack still missing after its exit is one it never wrote.
                // (Before, a rank preempted between the two checks reported such a peer as
                // `PeerDied` "exited without acknowledging close": CI, a loaded 2-core machine.)
                Some(_) if read_ack(layout.ack(q))? == CLOSE_ACK => continue,
                Some(pid) => gone = gone.or(Some(MissingAck::Exited { peer: q, pid })),
                None => {
                    waiting = Some(q);
                    break;
                }
            }
        }
        match waiting {
            None => return Ok(gone),
            Some(q) if Instant::now() >= deadline => return Ok(Some(MissingAck::Waited(q))),
            Some(_) => std::thread::sleep(Duration::from_millis(1)),
        }
    }
}

/// Checks that the header words read from rank `q`'s allocation describe the same layout as
/// this rank's `header` (everything but rank and pid must match).
pub fn check_peer_header(words: [u64; HEADER_WORDS], q: usize, header: &Header) -> Result<(), Error> {
    let expect = Header { rank: q as u64, pid: words[6], ..*header };
    let Some(theirs) = Header::from_words(words) else {
        return Err(Error::ConfigMismatch {
            detail: format!("rank {q}'s staging holds no readable header ({words:?}): another protocol version?"),
        });
    };
    if theirs == expect {
        return Ok(());
    }
    let differs: Vec<String> = [
        ("world", theirs.world, expect.world),
        ("rank", theirs.rank, expect.rank),
        ("capacity", theirs.capacity, expect.capacity),
        ("blocks", theirs.blocks, expect.blocks),
        ("ll_capacity", theirs.ll_capacity, expect.ll_capacity),
    ]
    .iter()
    .filter(|(_, a, b)| a != b)
    .map(|(name, a, b)| format!("{name} {a} (this rank: {b})"))
    .collect();
    Err(Error::ConfigMismatch {
        detail: format!("rank {q}'s staging was built with another configuration: {}", differs.join(", ")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_acks_are_named_and_bounded() {
        let layout = Layout::new(64, 1).unwrap();
        let all = |off: usize| Ok(if off == layout.ack(2) { 0 } else { CLOSE_ACK });
        let t = Instant::now();
        let live = |_| None;
        assert_eq!(
            first_missing_ack(&layout, 0, 4, Duration::from_millis(20), all, live).unwrap(),
            Some(MissingAck::Waited(2))
        );
        assert!(t.elapsed() >= Duration::from_millis(20) && t.elapsed() < Duration::from_secs(2));
        assert_eq!(first_missing_ack(&layout, 2, 4, Duration::ZERO, all, live).unwrap(), None);
    }

    #[test]
    fn a_peer_that_acknowledged_and_exited_between_two_reads_is_not_missing() {
        // The peer's ack lands after the first read of its line, then its process exits: the
        // exit is seen, and the ack with it.
        let layout = Layout::new(64, 1).unwrap();
        let reads = std::cell::Cell::new(0);
        let late = |off: usize| {
            if off != layout.ack(1) {
                return Ok(CLOSE_ACK);
            }
            reads.set(reads.get() + 1);
            Ok(if reads.get() == 1 { 0 } else { CLOSE_ACK })
        };
        let r = first_missing_ack(&layout, 0, 3, Duration::from_secs(30), late, |q| (q == 1).then_some(99));
        assert_eq!(r.unwrap(), None);
    }

    #[test]
    fn a_peer_that_exited_is_not_waited_for() {
        let layout = Layout::new(64, 1).unwrap();
        let all = |off: usize| Ok(if off == layout.ack(2) { 0 } else { CLOSE_ACK });
        let t = Instant::now();
        let r = first_missing_ack(&layout, 0, 4, Duration::from_secs(30), all, |q| (q == 2).then_some(4242));
        assert_eq!(r.unwrap(), Some(MissingAck::Exited { peer: 2, pid: 4242 }));
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
        // A peer still alive and missing is waited for (and named) even when another exited.
        let none = |off: usize| Ok(if off == layout.ack(1) || off == layout.ack(3) { 0 } else { CLOSE_ACK });
        let r = first_missing_ack(&layout, 0, 4, Duration::from_millis(20), none, |q| (q == 1).then_some(7));
        assert_eq!(r.unwrap(), Some(MissingAck::Waited(3)));
    }

    #[test]
    fn a_failed_close_is_reported_again() {
        let c = CloseOnce::default();
        let r = c.run(|| Err(Error::PeerTimeout { peer: 1, what: "acknowledge close", waited: Duration::ZERO }));
        assert!(matches!(r, Err(Error::PeerTimeout { peer: 1, .. })));
        match c.run(|| Ok(())) {
            Err(Error::CloseFailed { cause }) => assert!(cause.contains("rank 1"), "{cause}"),
            other => panic!("{other:?}"),
        }
        let ok = CloseOnce::default();
        assert!(ok.run(|| Ok(())).is_ok() && ok.run(|| panic!("ran twice")).is_ok() && ok.started());
    }

    #[test]
    fn peer_headers_must_match_but_rank_and_pid() {
        let h = Header { world: 4, rank: 0, capacity: 64, blocks: 2, pid: 10, ll_capacity: 0 };
        let peer = Header { rank: 3, pid: 99, ..h };
        check_peer_header(peer.to_words(), 3, &h).unwrap();
        assert!(check_peer_header(peer.to_words(), 2, &h).is_err());
        assert!(check_peer_header(Header { capacity: 32, ..peer }.to_words(), 3, &h).is_err());
    }
}
