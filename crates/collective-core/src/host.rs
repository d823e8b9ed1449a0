//! Which host a rank runs on: ranks compare it to decide whether same-host IPC is possible.
use crate::Error;

/// `DETCOLL_HOST_ID`: overrides [`host_identity`].
pub const HOST_ID_ENV: &str = "DETCOLL_HOST_ID";

/// `hostname/boot-id`: equal for two processes exactly when they run on the same booted host
/// (a hostname alone is not enough: containers and clones share names).
///
/// `DETCOLL_HOST_ID` overrides it: for containers that share a boot id but no memory, and for
/// tests that simulate several hosts on one.
/// An empty or non-UTF-8 `DETCOLL_HOST_ID`, or one with a control character (a newline, a
/// tab...: it is one line in every message that shows it), is [`Error::InvalidConfig`] naming it.
pub fn host_identity() -> Result<String, Error> {
    if let Some(id) = crate::env::var(HOST_ID_ENV)? {
        check_host_id(&id)?;
        return Ok(id);
    }
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let mut name = read("/proc/sys/kernel/hostname");
    if name.is_empty() {
        name = std::env::var("HOSTNAME").unwrap_or_else(|_| "unknown-host".into());
    }
    Ok(format!("{name}/{}", read("/proc/sys/kernel/random/boot_id")))
}

/// Whether `id` is a usable `DETCOLL_HOST_ID`: not empty (nor only whitespace), no control
/// characters (newline, carriage return, tab, escape...) and no Unicode line or paragraph
/// separator.
fn check_host_id(id: &str) -> Result<(), Error> {
    if id.trim().is_empty() {
        return Err(crate::env::invalid(HOST_ID_ENV, id, "a non-empty host identity"));
    }
    if id.chars().any(|c| c.is_control() || c == '\u{2028}' || c == '\u{2029}') {
        return Err(crate::env::invalid(
            HOST_ID_ENV,
            id,
            "one line of text: a host identity without control characters or line breaks",
        ));
    }
    Ok(())
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
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains(HOST_ID_ENV), "{detail}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
    }
}
