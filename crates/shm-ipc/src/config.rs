//! Construction parameters of the CPU twin.
use collective_core::protocol::Timeouts;

/// How a CPU-twin collective is built. Every rank must pass the same values (checked).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShmConfig {
    /// Staging bytes per frame: the most one rank contributes to one call.
    pub capacity: usize,
    /// Bounds on waits for peers and on close. `None`: `DETCOLL_TIMEOUT_MS` when set, else
    /// [`Timeouts::default`], read when the collective is built (an invalid value fails the
    /// construction with `InvalidConfig`). Agreed between ranks like the capacity.
    pub timeouts: Option<Timeouts>,
    /// all_reduce calls of at least this many bytes take IPC reduce_scatter + all_gather.
    pub rs_ag_threshold: usize,
}

impl ShmConfig {
    /// `capacity` bytes of staging, timeouts from the environment (`DETCOLL_TIMEOUT_MS`, read
    /// at construction), and RS+AG from 256 KiB.
    pub fn new(capacity: usize) -> Self {
        ShmConfig { capacity, timeouts: None, rs_ag_threshold: 256 << 10 }
    }

    /// Builder: explicit wait bounds (instead of `DETCOLL_TIMEOUT_MS`).
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = Some(timeouts);
        self
    }
}
