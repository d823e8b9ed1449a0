//! Bounded waits on a peer's flag, noticing a dead or closed peer early.
use collective_core::Error;
use collective_core::protocol::{CLOSE_ACK, FlagState, FlagWord};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Who is waited for, and how long at most.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Peer {
    pub rank: usize,
    /// The peer's process id when it is another process (liveness is checked), else `None`.
    pub pid: Option<u32>,
}

/// How often the slow path of a wait checks the peer's liveness and close acknowledgement.
const CHECK_EVERY: Duration = Duration::from_millis(1);

/// Whether process `pid` still runs. A zombie (exited, not yet reaped by its parent) is dead:
/// `kill(pid, 0)` succeeds for it, so its `/proc/<pid>/stat` state (`Z`, `X`) is read too. A
/// stopped process (`T`) is alive: it may be continued, and the wait's bound covers it.
pub(crate) fn alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence and permission.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    !matches!(proc_state(pid), Some(b'Z' | b'X' | b'x'))
}

/// The state letter of `/proc/<pid>/stat` (after the parenthesised command name, which may
/// itself contain spaces and parentheses), `None` when unreadable.
fn proc_state(pid: u32) -> Option<u8> {
    let stat = std::fs::read(format!("/proc/{pid}/stat")).ok()?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// Spins, then yields, until `flag` is no longer [`FlagState::Behind`] for generation `g`.
///
/// Returns the final state (`Ready`, `Passed`, `Mismatch` or `Corrupt`); fails with
/// [`Error::PeerTimeout`] after `timeout`, [`Error::PeerDied`] as soon as the peer process is
/// gone (zombies included), [`Error::PeerClosed`] as soon as the peer acknowledged close in
/// `closed` (this rank's `ack[peer]` line): a closed peer never publishes again, or with what
/// `fault` returns as soon as it returns one (a shared object truncated under its mapping: what
/// is read from it is zeros, see `guard`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn wait_flag(
    flag: &AtomicU64,
    closed: &AtomicU64,
    g: u32,
    digest: u32,
    peer: Peer,
    timeout: Duration,
    what: &'static str,
    fault: &dyn Fn() -> Option<Error>,
) -> Result<FlagState, Error> {
    wait_for(
        || {
            let state = FlagWord(flag.load(Ordering::Acquire)).check(g, digest);
            (state != FlagState::Behind).then_some(state)
        },
        closed,
        peer,
        timeout,
        what,
        fault,
    )
}

/// Waits, bounded like [`wait_flag`], until the LL word `word` carries generation `g` in its
/// high half, and returns its payload (the low half). Payload and flag travel in one atomic
/// word, so no ordering beyond the word itself is needed.
pub(crate) fn wait_ll(
    word: &AtomicU64,
    closed: &AtomicU64,
    g: u32,
    peer: Peer,
    timeout: Duration,
    fault: &dyn Fn() -> Option<Error>,
) -> Result<u32, Error> {
    wait_for(
        || {
            let v = word.load(Ordering::Relaxed);
            ((v >> 32) as u32 == g).then_some(v as u32)
        },
        closed,
        peer,
        timeout,
        "push its input",
        fault,
    )
}

/// Polls `probe` until it returns a value: spins, then yields, then sleeps; fails with
/// [`Error::PeerTimeout`] after `timeout`, [`Error::PeerDied`] / [`Error::PeerClosed`] as soon as
/// the peer is gone (probing once more first: what a peer published before closing or dying is
/// visible, and then nothing is wrong), and with `fault`'s error as soon as there is one (no
/// second probe: the memory probed may now be zero pages).
fn wait_for<T>(
    mut probe: impl FnMut() -> Option<T>,
    closed: &AtomicU64,
    peer: Peer,
    timeout: Duration,
    what: &'static str,
    fault: &dyn Fn() -> Option<Error>,
) -> Result<T, Error> {
    for _ in 0..257 {
        if let Some(v) = probe() {
            return Ok(v);
        }
        core::hint::spin_loop();
    }
    let start = Instant::now();
    let mut next_check = Duration::ZERO;
    let mut polls = 0u32;
    loop {
        std::thread::yield_now();
        if let Some(v) = probe() {
            return Ok(v);
        }
        polls = polls.wrapping_add(1);
        if polls % 64 == 0 {
            let waited = start.elapsed();
            if waited >= next_check {
                next_check = waited + CHECK_EVERY;
                if let Some(e) = fault() {
                    return Err(e);
                }
                let gone = if closed.load(Ordering::Acquire) == CLOSE_ACK {
                    Some(Error::PeerClosed { peer: peer.rank, what })
                } else {
                    peer.pid.filter(|&pid| !alive(pid)).map(|pid| Error::PeerDied {
                        peer: peer.rank,
                        detail: format!("its process {pid} exited while this rank waited to {what}"),
                    })
                };
                if let Some(err) = gone {
                    // A peer acknowledges close (release) only after its last call published
                    // everything, and exits only after that too.
                    return probe().ok_or(err);
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
    fault: &dyn Fn() -> Option<Error>,
) -> Result<(), Error> {
    let start = Instant::now();
    loop {
        if word.load(Ordering::Acquire) == want {
            return Ok(());
        }
        if let Some(e) = fault() {
            return Err(e);
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
