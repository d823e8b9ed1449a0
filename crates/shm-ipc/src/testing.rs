//! Test-only fault injection (hidden). Faults are process-global: set one only in a process
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
    KillAfterCreate = 3,
    /// Behave as if `/proc/<pid>/fd` could not be opened: use the named fallback.
    NoProcFd = 4,
}

static FAULT: AtomicU8 = AtomicU8::new(0);

/// Injects `fault` into every later construction of this process (`None`: none).
pub fn inject(fault: Option<Fault>) {
    FAULT.store(fault.map_or(0, |f| f as u8), Ordering::SeqCst);
}

pub(crate) fn fault() -> Option<Fault> {
    match FAULT.load(Ordering::Relaxed) {
        1 => Some(Fault::FailAllocation),
        2 => Some(Fault::TruncateAfterCreate),
        3 => Some(Fault::KillAfterCreate),
        4 => Some(Fault::NoProcFd),
        _ => None,
    }
}
