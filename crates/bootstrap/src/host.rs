//! Which host a rank runs on: ranks compare it to decide whether same-host IPC is possible, and
//! [`split`](fn@crate::split) counts a group's members per host with it.

use crate::BootstrapError;

/// `DETCOLL_HOST_ID`: overrides [`host_identity`].
pub const HOST_ID_ENV: &str = "DETCOLL_HOST_ID";

/// `hostname/boot-id`: equal for two processes exactly when they run on the same booted host
/// (a hostname alone is not enough: containers and clones share names).
///
/// `DETCOLL_HOST_ID` overrides it: for containers that share a boot id but no memory, and for
/// tests that simulate several hosts on one.
/// An empty or non-UTF-8 `DETCOLL_HOST_ID`, or one with a control character (a newline, a
/// tab...: it is one line in every message that shows it), is [`BootstrapError::InvalidConfig`]
/// naming it. (`collective_core::host_identity` is this, with collective-core's error type.)
pub fn host_identity() -> Result<String, BootstrapError> {
    identity().map_err(|detail| BootstrapError::InvalidConfig { detail })
}

/// [`host_identity`], or what is wrong with `DETCOLL_HOST_ID`.
pub(crate) fn identity() -> Result<String, String> {
    match std::env::var(HOST_ID_ENV) {
        Ok(id) => return check_host_id(&id).map(|()| id),
        Err(std::env::VarError::NotPresent) => {}
        Err(std::env::VarError::NotUnicode(v)) => return Err(invalid(&v.to_string_lossy(), "valid UTF-8")),
    }
    Ok(machine_identity())
}

/// `hostname/boot-id` of the machine itself, which `DETCOLL_HOST_ID` never overrides: what
/// names a physical device together with a per-machine id (a PCI bus id), so that ranks of
/// simulated hosts on one machine still see that they share a GPU.
pub fn machine_identity() -> String {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let mut name = read("/proc/sys/kernel/hostname");
    if name.is_empty() {
        name = std::env::var("HOSTNAME").unwrap_or_else(|_| "unknown-host".into());
    }
    format!("{name}/{}", read("/proc/sys/kernel/random/boot_id"))
}

/// Whether `id` is a usable `DETCOLL_HOST_ID`: not empty (nor only whitespace), no control
/// characters (newline, carriage return, tab, escape...) and no Unicode line or paragraph
/// separator.
fn check_host_id(id: &str) -> Result<(), String> {
    if id.trim().is_empty() {
        return Err(invalid(id, "a non-empty host identity"));
    }
    if id.chars().any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}') {
        return Err(invalid(id, "one line of text: a host identity without control characters or line breaks"));
    }
    Ok(())
}

/// The message for `DETCOLL_HOST_ID=value` when `expected` was expected (worded like every
/// `DETCOLL_*` variable's).
fn invalid(value: &str, expected: &str) -> String {
    format!("environment variable {HOST_ID_ENV}={value:?} is invalid: expected {expected}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ids_are_one_line_of_text() {
        assert!(check_host_id("node-7/containers-a").is_ok());
        assert!(check_host_id("a host").is_ok());
        for bad in ["", "  ", "node\nother", "node\r", "a\tb", "x\u{1b}[2J", "\u{85}", "a\u{2028}b"] {
            match check_host_id(bad) {
                Err(detail) => assert!(detail.contains(HOST_ID_ENV), "{detail}"),
                Ok(()) => panic!("{bad:?} accepted"),
            }
        }
    }
}
