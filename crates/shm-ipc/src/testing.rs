//! Test-only fault injection (hidden). Faults are process-global: set them only in a process
//! that runs a single rank (the fault tests' child processes), never in a process whose other
//! threads build collectives.
use std::sync::atomic::{AtomicU8, Ordering};

/// A fault the next constructions of this process inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Fault {
    /// Reserving the shared object fails as on a full `/dev/shm` (`ENOSPC`).
    FailAllocation = 1,
    /// The owner shrinks its object to one page right after creating it, before peers map it.
    TruncateAfterCreate = 2,
    /// The process SIGKILLs itself right after creating its object.
    KillAfterCreate = 4,
    /// Behave as if `/proc/<pid>/fd` could not be opened: use the named fallback.
    NoProcFd = 8,
    /// Skip the sweep of stale fallback objects, so a test can observe what a kill leaves.
    NoSweep = 16,
}

static FAULTS: AtomicU8 = AtomicU8::new(0);

/// Injects `faults` (replacing earlier ones) into every later construction of this process.
pub fn inject(faults: &[Fault]) {
    FAULTS.store(faults.iter().fold(0, |m, &f| m | f as u8), Ordering::SeqCst);
}

/// Whether `fault` is injected.
pub(crate) fn has(fault: Fault) -> bool {
    FAULTS.load(Ordering::Relaxed) & fault as u8 != 0
}
