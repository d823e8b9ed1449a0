//! Descriptors for the connections a bootstrap holds.
//!
//! Rank 0 of a TCP rendezvous keeps one connection per rank for the lifetime of its bootstrap,
//! besides the handshakes in progress: a world of a thousand ranks needs more descriptors than
//! the soft `RLIMIT_NOFILE` most systems start processes with (1024). The soft limit is the
//! process's own to raise, up to the hard limit the administrator set; so rank 0 raises it as
//! far as its world needs ([`reserve_descriptors`]; never beyond what is needed, never the
//! hard limit), and when even the hard limit is too low it fails at once with
//! [`BootstrapError::InvalidConfig`] naming the limit, instead of waiting out its connect
//! timeout with ranks it cannot take in.

use crate::BootstrapError;

/// Descriptors left free beyond the counted ones (the rest of the process may open files
/// meanwhile).
pub(crate) const RESERVED_FDS: usize = 32;

/// Makes room in this process for `count` more descriptors than it has open now (and a small
/// reserve): raises the soft `RLIMIT_NOFILE` as far as that needs, up to the hard limit.
/// [`BootstrapError::InvalidConfig`] when the hard limit is too low, naming it and how to raise
/// it.
///
/// Rank 0 of a [`TcpBootstrap`](crate::TcpBootstrap) does this for its world itself. Call it
/// in a process that holds many connections besides, e.g. one that runs many ranks as threads
/// (both ends of every connection are then in the process).
pub fn reserve_descriptors(count: usize) -> Result<(), BootstrapError> {
    ensure(count, count, "more connections")
}

/// Raises the soft limit to make room for `wanted` more descriptors if the hard limit allows
/// (else to the hard limit); `Err` when not even `required` more fit. `what` names what they
/// are for, in the error.
pub(crate) fn ensure(required: usize, wanted: usize, what: &str) -> Result<(), BootstrapError> {
    let Some(open) = open_fds() else { return Ok(()) };
    let need = |count: usize| open.saturating_add(count).saturating_add(RESERVED_FDS);
    match raise_soft_limit(need(wanted.max(required))) {
        Some((soft, hard)) if soft < need(required) => Err(BootstrapError::InvalidConfig {
            detail: format!(
                "this process needs {} descriptors ({open} open, {required} for {what}, {RESERVED_FDS} spare) \
                 but its RLIMIT_NOFILE hard limit is {hard} (soft {soft}): raise the hard limit (`ulimit -Hn`, \
                 LimitNOFILE= of a systemd unit, docker --ulimit nofile=)",
                need(required)
            ),
        }),
        _ => Ok(()),
    }
}

/// This process's `RLIMIT_NOFILE`, when its soft limit is finite.
#[cfg(unix)]
fn finite_limit() -> Option<libc::rlimit> {
    let mut rl = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `rl` is a valid, writable rlimit for the call.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut rl) } == 0;
    (ok && rl.rlim_cur != libc::RLIM_INFINITY).then_some(rl)
}

/// Raises the soft `RLIMIT_NOFILE` to `want` descriptors, or to the hard limit when that is
/// lower; never lowers it. The `(soft, hard)` limits after, or `None` when they are unlimited
/// or unknown.
#[cfg(unix)]
fn raise_soft_limit(want: usize) -> Option<(usize, usize)> {
    let mut rl = finite_limit()?;
    let want = libc::rlim_t::try_from(want).unwrap_or(libc::RLIM_INFINITY);
    if rl.rlim_cur < want {
        let raised = libc::rlimit { rlim_cur: want.min(rl.rlim_max), rlim_max: rl.rlim_max };
        // SAFETY: `raised` is a valid rlimit whose soft limit does not exceed the hard limit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            rl = raised;
        }
    }
    let hard = if rl.rlim_max == libc::RLIM_INFINITY { usize::MAX } else { usize::try_from(rl.rlim_max).ok()? };
    Some((usize::try_from(rl.rlim_cur).ok()?, hard))
}

#[cfg(not(unix))]
fn raise_soft_limit(_want: usize) -> Option<(usize, usize)> {
    None
}

/// The soft `RLIMIT_NOFILE`, if finite.
#[cfg(unix)]
pub(crate) fn fd_limit() -> Option<usize> {
    finite_limit().and_then(|rl| usize::try_from(rl.rlim_cur).ok())
}

#[cfg(not(unix))]
pub(crate) fn fd_limit() -> Option<usize> {
    None
}

/// How many descriptors this process has open (not counting the one listing them), where the
/// system lists them.
pub(crate) fn open_fds() -> Option<usize> {
    ["/proc/self/fd", "/dev/fd"]
        .iter()
        .find_map(|d| std::fs::read_dir(d).ok())
        .map(|entries| entries.count().saturating_sub(1))
}
