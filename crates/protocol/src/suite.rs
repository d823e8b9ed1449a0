//! The IPC configurations the conformance suites build every device's engine with (feature
//! `conformance`): one function per suite, shared by the GPU suites (`gpu-conformance`) and the
//! CPU twin's engine suites, so every device runs the same routes at the same sizes.
use crate::{DEFAULT_RSAG_THRESHOLD, IpcConfig};
use collective_core::conformance::sequence;
use collective_core::{RouteTable, SizeRoutes, Timeouts};
use std::time::Duration;

/// `capacity` bytes of staging, the LL push route up to 8 KiB per rank, one-shot above, RS+AG
/// (all_reduce) from 32 KiB, the bulk push route from 64 KiB (all_reduce and reduce_scatter
/// calls that do not fit its frame run as bulk chunks, all_gather calls take one-shot), so every
/// route runs (the suite's sizes go up to its 256 KiB capacity), and `peer` as the bound on
/// every wait for a peer.
pub fn ipc_suite_config(capacity: usize, peer: Duration) -> IpcConfig {
    let routes = SizeRoutes { ll_up_to: Some(8 << 10), bulk_from: Some(64 << 10), rsag_from: Some(32 << 10) };
    IpcConfig::new(capacity)
        .with_routes(RouteTable::by_size(routes))
        .with_timeouts(Timeouts { peer, ..Default::default() })
}

/// A randomized run (`collective_core::conformance::sequence`): `capacity` bytes of staging, the
/// LL push route up to 4 KiB, one-shot above, RS+AG (all_reduce) from 16 KiB, the bulk push route
/// from `capacity / 4` (so every route runs; bulk all_gather calls that do not fit its frame take
/// one-shot, bulk all_reduce and reduce_scatter ones run as bulk chunks), and
/// `DETCOLL_RANDOM_BLOCKS` blocks per rank when set (else the backend's default: compute units /
/// ranks sharing the GPU).
pub fn random_config(capacity: usize) -> IpcConfig {
    let routes = SizeRoutes {
        ll_up_to: Some(4 << 10),
        bulk_from: Some((capacity / 4).max(16 << 10)),
        rsag_from: Some(16 << 10),
    };
    let config = IpcConfig::new(capacity).with_routes(RouteTable::by_size(routes));
    match sequence::random_blocks() {
        Some(b) => config.with_max_blocks(b),
        None => config,
    }
}

/// The fault tests (`collective_core::conformance::faults`): 1 MiB of staging, calls up to 4 KiB
/// per rank on the LL push route (the pull routes above, so both protocols fail closed), `peer`
/// as the bound on every wait for a peer, close bounded by 5 s.
pub fn fault_config(peer: Duration) -> IpcConfig {
    let routes = SizeRoutes { ll_up_to: Some(4 << 10), rsag_from: Some(DEFAULT_RSAG_THRESHOLD), ..Default::default() };
    IpcConfig::new(1 << 20)
        .with_routes(RouteTable::by_size(routes))
        .with_timeouts(Timeouts { peer, close: Duration::from_secs(5) })
}
