//! Which host a rank runs on: ranks compare it to decide whether same-host IPC is possible.
use crate::Error;

/// `DETCOLL_HOST_ID`: overrides [`host_identity`].
pub const HOST_ID_ENV: &str = "DETCOLL_HOST_ID";

/// `hostname/boot-id`: equal for two processes exactly when they run on the same booted host
/// (a hostname alone is not enough: containers and clones share names).
///
/// `DETCOLL_HOST_ID` overrides it: for containers that share a boot id but no memory, and for
/// tests that simulate several hosts on one.
/// An empty or non-UTF-8 `DETCOLL_HOST_ID` is [`Error::InvalidConfig`] naming it.
pub fn host_identity() -> Result<String, Error> {
    if let Some(id) = crate::env::var(HOST_ID_ENV)? {
        if id.trim().is_empty() {
            return Err(crate::env::invalid(HOST_ID_ENV, &id, "a non-empty host identity"));
        }
        return Ok(id);
    }
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let mut name = read("/proc/sys/kernel/hostname");
    if name.is_empty() {
        name = std::env::var("HOSTNAME").unwrap_or_else(|_| "unknown-host".into());
    }
    Ok(format!("{name}/{}", read("/proc/sys/kernel/random/boot_id")))
}
