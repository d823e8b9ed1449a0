//! What the engine-on-host-device suites share.
use collective_core::protocol::{IpcConfig, Timeouts};
use std::time::Duration;

/// The suites' configuration: `capacity` bytes of staging, every route taken (LL push up to
/// 8 KiB per rank, one-shot above, RS+AG all_reduce from 32 KiB, bulk push from 64 KiB; calls
/// above the capacity in chunks), `peer` as the bound on every wait.
pub fn engine_config(capacity: usize, peer: Duration) -> IpcConfig {
    let mut config = IpcConfig::new(capacity)
        .with_rsag_threshold(32 << 10)
        .with_push_threshold(8 << 10)
        .with_bulk_threshold(64 << 10);
    config.timeouts = Some(Timeouts { peer, ..Default::default() });
    config
}
