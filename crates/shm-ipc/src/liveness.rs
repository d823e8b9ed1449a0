//! Whether a peer process still runs: the one thing a host wait can see that a GPU cannot.

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
