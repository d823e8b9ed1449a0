//! Construction parameters of the CPU twin.
use collective_core::RouteTable;
use collective_core::protocol::{DEFAULT_LL_CAPACITY, DEFAULT_RSAG_THRESHOLD, IpcConfig, Timeouts};

/// How a CPU-twin collective is built. Every rank must pass the same values (checked).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ShmConfig {
    /// Staging bytes per frame: the most one rank contributes to one generation (larger calls
    /// run in chunks). At least [`collective_core::protocol::MIN_CAPACITY`] (128 bytes, where
    /// every call can be chunked); a smaller capacity fails construction with
    /// [`collective_core::Error::InvalidConfig`].
    pub capacity: usize,
    /// Bounds on waits for peers and on close. `None`: `DETCOLL_TIMEOUT_MS` when set, else
    /// [`Timeouts::default`], read when the collective is built (an invalid value fails the
    /// construction with `InvalidConfig`). Agreed between ranks like the capacity.
    pub timeouts: Option<Timeouts>,
    /// The route policy of the collective's own calls (as [`IpcConfig::routes`]): the factory
    /// passes its agreed routing table; by default RS+AG for all_reduce from 512 KiB per rank,
    /// one-shot otherwise.
    pub routes: RouteTable,
    /// Payload bytes per rank one call may send on the LL push route (`ipc_push_ll`); the
    /// receive area takes `4 * world * ll_capacity` bytes per rank. Larger calls routed there,
    /// and every call when it is 0, take the one-shot pull route (same bits).
    pub ll_capacity: usize,
}

impl ShmConfig {
    /// `capacity` bytes of staging, timeouts from the environment (`DETCOLL_TIMEOUT_MS`, read
    /// at construction), the engine's default route table (`RouteTable::ipc_default` of
    /// `DEFAULT_RSAG_THRESHOLD`, 512 KiB), and the default LL push capacity (512 KiB).
    pub fn new(capacity: usize) -> Self {
        ShmConfig {
            capacity,
            timeouts: None,
            routes: RouteTable::ipc_default(DEFAULT_RSAG_THRESHOLD),
            ll_capacity: DEFAULT_LL_CAPACITY,
        }
    }

    /// Builder: the route policy of the collective's own calls (as [`IpcConfig::with_routes`]).
    pub fn with_routes(mut self, routes: RouteTable) -> Self {
        self.routes = routes;
        self
    }

    /// Builder: the LL push capacity in payload bytes per rank (0: no LL route).
    pub fn with_ll_capacity(mut self, bytes: usize) -> Self {
        self.ll_capacity = bytes;
        self
    }

    /// Builder: explicit wait bounds (instead of `DETCOLL_TIMEOUT_MS`).
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = Some(timeouts);
        self
    }

    /// The engine's configuration for these values (the engine checks them: a capacity every
    /// call can be chunked through, at least [`collective_core::protocol::MIN_CAPACITY`]).
    pub(crate) fn ipc(&self) -> IpcConfig {
        let mut c = IpcConfig::new(self.capacity).with_routes(self.routes.clone()).with_ll_capacity(self.ll_capacity);
        c.timeouts = self.timeouts;
        c
    }
}
