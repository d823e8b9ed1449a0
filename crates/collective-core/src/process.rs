//! Which process a handle belongs to, so that a handle fails closed in a forked child.
//!
//! A collective's handle holds shared state — mappings of its peers' memory, a place in their
//! call sequence, a bootstrap connection. After `fork`, parent and child both hold it, and a
//! child that called through it (or acknowledged close to the peers on drop) would race the
//! parent on that state: a result computed from the other process's input, a peer told the
//! rank closed. So every handle records its [`ProcessOwner`] at construction, every call checks it
//! first ([`ProcessOwner::check`]: one atomic load), and close and drop touch nothing shared in a
//! process that is not the owner.
//!
//! How: a `pthread_atfork` child handler, registered once, advances a process epoch in the
//! child; a handle belongs to the epoch it was created in. The pid is compared too where a
//! check is rare (close, drop), for children made by a raw `clone` that skips the handlers.
use crate::Error;
use std::sync::Once;
use std::sync::atomic::{AtomicU64, Ordering};

static EPOCH: AtomicU64 = AtomicU64::new(0);
static REGISTER: Once = Once::new();

extern "C" fn in_child() {
    // Async-signal-safe: one atomic add, no allocation, no lock.
    EPOCH.fetch_add(1, Ordering::SeqCst);
}

/// The process that created a handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessOwner {
    pid: u32,
    epoch: u64,
}

impl ProcessOwner {
    /// This process, now. Registers the fork handler on first use.
    pub fn current() -> ProcessOwner {
        REGISTER.call_once(|| {
            // SAFETY: registers a handler that only does an atomic add; no prepare/parent
            // handlers. A failure (ENOMEM) leaves only the pid comparison of `is_current`.
            unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
        });
        ProcessOwner { pid: std::process::id(), epoch: EPOCH.load(Ordering::SeqCst) }
    }

    /// `Ok` in the owning process; [`Error::ForkedHandle`] in a forked child. One atomic load:
    /// cheap enough for every call.
    #[inline]
    pub fn check(&self) -> Result<(), Error> {
        if EPOCH.load(Ordering::Relaxed) == self.epoch { Ok(()) } else { Err(self.foreign()) }
    }

    /// Whether this is the owning process (epoch and pid): for close and drop, which must not
    /// touch shared state elsewhere.
    pub fn is_current(&self) -> bool {
        EPOCH.load(Ordering::SeqCst) == self.epoch && std::process::id() == self.pid
    }

    /// The error a foreign process gets.
    pub fn foreign(&self) -> Error {
        Error::ForkedHandle { owner: self.pid, pid: std::process::id() }
    }

    /// The owning process's id.
    pub fn pid(&self) -> u32 {
        self.pid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_owner_passes_its_own_check() {
        let o = ProcessOwner::current();
        assert!(o.check().is_ok());
        assert!(o.is_current());
        assert_eq!(o.pid(), std::process::id());
    }

    #[test]
    fn another_epoch_is_a_forked_handle() {
        let o = ProcessOwner { pid: 1, epoch: u64::MAX };
        assert!(matches!(o.check(), Err(Error::ForkedHandle { owner: 1, .. })));
        assert!(!o.is_current());
    }
}
