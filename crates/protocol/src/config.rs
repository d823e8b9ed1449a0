//! Construction-time configuration of the GPU IPC twins, equal on every rank (checked).
//!
//! Moved verbatim from `crates/cuda-ipc/src/config.rs` (`CudaIpcConfig` there and
//! `HipIpcConfig` in `hip-ipc` are re-exports of [`IpcConfig`]).
use super::Timeouts;
use collective_core::{Error, RouteTable};

/// Default bytes per rank from which `all_reduce` takes the IPC reduce_scatter + all_gather
/// route instead of the one-shot route (same bits either way). One-shot reads `world` inputs
/// per rank, RS+AG reads 2: above a few hundred KiB the halved traffic wins.
pub const DEFAULT_RSAG_THRESHOLD: usize = 512 << 10;

/// Default payload bytes per rank a call may send on the LL push route (`ipc_push_ll`): the LL
/// receive area then takes `4 * world * 512 KiB` per rank (4 MiB at world 2, 16 MiB at world 8).
/// Larger calls routed there take the one-shot pull route instead (same bits).
pub const DEFAULT_LL_CAPACITY: usize = 512 << 10;

/// How a GPU IPC collective (CUDA or HIP) is built.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct IpcConfig {
    /// Staging bytes per rank: the most one rank contributes to one generation (larger calls
    /// run in chunks). At least [`super::MIN_CAPACITY`] (128), checked at construction.
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
    /// The route policy of this collective's own calls ([`collective_core::Collective::route`], the
    /// calls that do not name a route): the factory passes its agreed routing table; on its own,
    /// [`RouteTable::ipc_default`] (RS+AG for all_reduce from [`DEFAULT_RSAG_THRESHOLD`]). The
    /// engine only looks it up: it has no thresholds of its own.
    pub routes: RouteTable,
    /// Payload bytes per rank one call may send on the LL push route; the receive area takes
    /// `2 * world * 2 * ll_capacity` bytes per rank (0: no LL route, calls routed there take
    /// the one-shot pull route).
    pub ll_capacity: usize,
    /// Whether ranks that are threads sharing one device launch each call together (the GPU
    /// engine's lockstep: no such rank launches call `k` before all of them reached it, none
    /// returns before all launched it). `None`: `DETCOLL_LOCKSTEP` when set, else on. Turn it
    /// off only where the caller orders every enqueue itself and makes no blocking device call
    /// between calls, e.g. one host thread driving several ranks of one GPU.
    pub lockstep: Option<bool>,
}

impl IpcConfig {
    /// `capacity` bytes of staging, automatic block count, timeouts from `DETCOLL_TIMEOUT_MS`
    /// (default 10 s), the default route table ([`RouteTable::ipc_default`]).
    pub fn new(capacity: usize) -> Self {
        IpcConfig {
            capacity,
            max_blocks: None,
            timeouts: None,
            routes: RouteTable::ipc_default(DEFAULT_RSAG_THRESHOLD),
            ll_capacity: DEFAULT_LL_CAPACITY,
            lockstep: None,
        }
    }

    /// Builder: the lockstep of ranks sharing a device on (`true`) or off (see
    /// [`IpcConfig::lockstep`]).
    pub fn with_lockstep(mut self, on: bool) -> Self {
        self.lockstep = Some(on);
        self
    }

    /// Builder: the route policy of this collective's own calls (see [`IpcConfig::routes`]).
    pub fn with_routes(mut self, routes: RouteTable) -> Self {
        self.routes = routes;
        self
    }

    /// Builder: LL push capacity in payload bytes per rank (0 turns the LL route off).
    pub fn with_ll_capacity(mut self, bytes: usize) -> Self {
        self.ll_capacity = bytes;
        self
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

    /// Checks the values (a capacity of at least [`super::MIN_CAPACITY`] bytes, block count
    /// range, positive timeouts).
    pub fn check(&self) -> Result<(), Error> {
        super::check_capacity(self.capacity)?;
        if let Some(b) = self.max_blocks
            && (b == 0 || b > 1024)
        {
            return Err(Error::InvalidConfig { detail: format!("max_blocks is {b}: expected 1..=1024") });
        }
        // The staging layout must fit before anything is allocated (a capacity near usize::MAX
        // used to wrap to a tiny allocation).
        super::Layout::with_ll(self.capacity, self.max_blocks.unwrap_or(1), 8, self.ll_capacity)?;
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
    fn capacities_below_the_floor_are_refused() {
        for capacity in 0..super::super::MIN_CAPACITY {
            match IpcConfig::new(capacity).check() {
                Err(Error::InvalidConfig { detail }) => assert!(detail.contains("at least 128 bytes"), "{detail}"),
                other => panic!("capacity {capacity}: {other:?}"),
            }
        }
        assert!(IpcConfig::new(super::super::MIN_CAPACITY).check().is_ok());
    }
}
