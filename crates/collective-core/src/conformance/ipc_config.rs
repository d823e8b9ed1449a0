//! The IPC engine's configuration for the conformance suites of every device (GPU or host).
use crate::protocol::{IpcConfig, Timeouts};
use crate::{RouteTable, SizeRoutes};
use std::time::Duration;

/// `capacity` bytes of staging, the LL push route up to 8 KiB per rank, one-shot above, RS+AG
/// (all_reduce) from 32 KiB, the bulk push route from 64 KiB (all_reduce and reduce_scatter
/// calls that do not fit its frame run as bulk chunks, all_gather calls take one-shot), so every
/// route runs (the suite's sizes go up to its 256 KiB capacity), and `peer` as the bound on
/// every wait for a peer.
pub fn ipc_suite_config(capacity: usize, peer: Duration) -> IpcConfig {
    let routes = SizeRoutes { ll_up_to: Some(8 << 10), bulk_from: Some(64 << 10), rsag_from: Some(32 << 10) };
    let mut config = IpcConfig::new(capacity).with_routes(RouteTable::by_size(routes));
    config.timeouts = Some(Timeouts { peer, ..Default::default() });
    config
}
