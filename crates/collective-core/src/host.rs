//! Which host a rank runs on: ranks compare it to decide whether same-host IPC is possible.

/// `hostname/boot-id`: equal for two processes exactly when they run on the same booted host
/// (a hostname alone is not enough: containers and clones share names).
///
/// `DETCOLL_HOST_ID` overrides it: for containers that share a boot id but no memory, and for
/// tests that simulate several hosts on one.
pub fn host_identity() -> String {
    if let Ok(id) = std::env::var("DETCOLL_HOST_ID") {
        return id;
    }
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    let mut name = read("/proc/sys/kernel/hostname");
    if name.is_empty() {
        name = std::env::var("HOSTNAME").unwrap_or_else(|_| "unknown-host".into());
    }
    format!("{name}/{}", read("/proc/sys/kernel/random/boot_id"))
}
