//! Construction-time configuration of the GPU IPC twins, equal on every rank (checked).
//!
//! Moved verbatim from `crates/cuda-ipc/src/config.rs` (`CudaIpcConfig` there and
//! `HipIpcConfig` in `hip-ipc` are re-exports of [`IpcConfig`]).
use super::Timeouts;
use crate::Error;

/// Default bytes per rank from which `all_reduce` takes the IPC reduce_scatter + all_gather
/// route instead of the one-shot route (same bits either way). One-shot reads `world` inputs
/// per rank, RS+AG reads 2: above a few hundred KiB the halved traffic wins.
pub const DEFAULT_RSAG_THRESHOLD: usize = 512 << 10;

/// How a GPU IPC collective (CUDA or HIP) is built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IpcConfig {
    /// Staging bytes per rank: the most one rank contributes to one call.
    pub capacity: usize,
    /// Most blocks one call launches per rank, which is also the number of per-block flag slots.
    /// `None` picks `multiprocessors / ranks sharing the device` (minimum over ranks), so that
    /// every rank's kernel is resident at once even when all ranks share one GPU: the kernels
    /// wait on each other, and a rank whose blocks cannot be scheduled would stall the rest
    /// until the timeout.
    pub max_blocks: Option<usize>,
    /// Bound on every in-kernel wait and on close. `None`: `DETCOLL_TIMEOUT_MS` when set, else
    /// [`Timeouts::default`], read at construction ([`IpcConfig::resolved_timeouts`]).
    pub timeouts: Option<Timeouts>,
    /// `all_reduce` of at least this many bytes per rank takes the RS+AG route.
    pub rsag_threshold: usize,
}

impl IpcConfig {
    /// `capacity` bytes of staging, automatic block count, timeouts from `DETCOLL_TIMEOUT_MS`
    /// (default 10 s), the default RS+AG threshold.
    pub fn new(capacity: usize) -> Self {
        IpcConfig { capacity, max_blocks: None, timeouts: None, rsag_threshold: DEFAULT_RSAG_THRESHOLD }
    }

    /// Builder: a fixed block count.
    pub fn with_max_blocks(mut self, blocks: usize) -> Self {
        self.max_blocks = Some(blocks);
        self
    }

    /// Builder: wait bounds.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = Some(timeouts);
        self
    }

    /// Builder: RS+AG threshold in bytes per rank.
    pub fn with_rsag_threshold(mut self, bytes: usize) -> Self {
        self.rsag_threshold = bytes;
        self
    }

    /// Checks the values (block count range, positive timeouts).
    pub fn check(&self) -> Result<(), Error> {
        if let Some(b) = self.max_blocks {
            if b == 0 || b > 1024 {
                return Err(Error::InvalidConfig { detail: format!("max_blocks is {b}: expected 1..=1024") });
            }
        }
        // The staging layout must fit before anything is allocated (a capacity near usize::MAX
        // used to wrap to a tiny allocation).
        super::Layout::new(self.capacity, self.max_blocks.unwrap_or(1))?;
        self.resolved_timeouts().map(|_| ())
    }

    /// The wait bounds: as resolved at construction (the collective's own configuration always
    /// holds them); [`Timeouts::default`] while `None`.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts.unwrap_or_default()
    }

    /// The bounds this configuration means: explicit, else from `DETCOLL_TIMEOUT_MS`; checked.
    pub fn resolved_timeouts(&self) -> Result<Timeouts, Error> {
        Timeouts::resolve(self.timeouts)
    }

    /// Words every rank must agree on: `[capacity, max_blocks (0 = auto), rsag_threshold,
    /// peer timeout (ns), close timeout (ns)]` (timeouts as resolved; the defaults when invalid,
    /// which [`IpcConfig::check`] reports first).
    pub fn agreement_words(&self) -> [u64; 5] {
        let [peer, close] = self.resolved_timeouts().unwrap_or_default().agreement_words();
        [self.capacity as u64, self.max_blocks.unwrap_or(0) as u64, self.rsag_threshold as u64, peer, close]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn capacities_whose_staging_does_not_fit_are_refused() {
        for capacity in [usize::MAX, 1 << 63] {
            assert!(matches!(IpcConfig::new(capacity).check(), Err(Error::InvalidConfig { .. })), "{capacity}");
        }
        assert!(IpcConfig::new(1 << 20).with_max_blocks(132).check().is_ok());
        assert!(IpcConfig::new(1 << 20).with_max_blocks(0).check().is_err());
        let zero = Timeouts { peer: Duration::ZERO, close: Duration::from_secs(1) };
        assert!(IpcConfig::new(1 << 20).with_timeouts(zero).check().is_err());
    }

    #[test]
    fn agreement_words_carry_the_timeouts() {
        let t = Timeouts { peer: Duration::from_millis(3), close: Duration::from_millis(4) };
        let w = IpcConfig::new(1 << 20).with_timeouts(t).agreement_words();
        assert_eq!(&w[3..], &[3_000_000, 4_000_000]);
    }
}
