//! Bounded waits on a peer's flag, noticing a dead peer process early.
use collective_core::Error;
use collective_core::protocol::{FlagState, FlagWord};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Who is waited for, and how long at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub rank: usize,
    /// The peer's process id when it is another process (liveness is checked), else `None`.
    pub pid: Option<u32>,
}

/// Whether process `pid` still exists.
fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

/// Spins, then yields, until `flag` is no longer [`FlagState::Behind`] for generation `g`.
///
/// Returns the final state (`Ready`, `Passed`, `Mismatch` or `Corrupt`); fails with
/// [`Error::PeerTimeout`] after `timeout`, or [`Error::PeerDied`] as soon as the peer process is
/// gone.
pub(crate) fn wait_flag(
    flag: &AtomicU64,
    g: u32,
    digest: u32,
    peer: Peer,
    timeout: Duration,
    what: &'static str,
) -> Result<FlagState, Error> {
    let check = |v| FlagWord(v).check(g, digest);
    let state = check(flag.load(Ordering::Acquire));
    if state != FlagState::Behind {
        return Ok(state);
    }
    for _ in 0..256 {
        core::hint::spin_loop();
        let state = check(flag.load(Ordering::Acquire));
        if state != FlagState::Behind {
            return Ok(state);
        }
    }
    let start = Instant::now();
    let mut polls = 0u32;
    loop {
        std::thread::yield_now();
        let state = check(flag.load(Ordering::Acquire));
        if state != FlagState::Behind {
            return Ok(state);
        }
        polls = polls.wrapping_add(1);
        if polls % 64 == 0 {
            let waited = start.elapsed();
            if let Some(pid) = peer.pid {
                if !alive(pid) {
                    return Err(Error::PeerDied {
                        peer: peer.rank,
                        detail: format!("its process {pid} exited while this rank waited to {what}"),
                    });
                }
            }
            if waited >= timeout {
                return Err(Error::PeerTimeout { peer: peer.rank, what, waited });
            }
            if waited > Duration::from_millis(2) {
                // A long wait: stop burning a core the peer may need.
                std::thread::sleep(Duration::from_micros(50));
            }
        }
    }
}

/// Waits until `word` equals `want` (close acknowledgements), bounded like [`wait_flag`].
pub(crate) fn wait_value(
    word: &AtomicU64,
    want: u64,
    peer: Peer,
    timeout: Duration,
    what: &'static str,
) -> Result<(), Error> {
    let start = Instant::now();
    loop {
        if word.load(Ordering::Acquire) == want {
            return Ok(());
        }
        if let Some(pid) = peer.pid {
            if !alive(pid) {
                return Ok(()); // A dead peer reads nothing any more.
            }
        }
        let waited = start.elapsed();
        if waited >= timeout {
            return Err(Error::PeerTimeout { peer: peer.rank, what, waited });
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}
