//! The shared conformance suite on the HIP IPC twin: world 1/2/4/8 as threads of this process
//! on HIP device 0. Without a HIP device (or without libamdhip64) each test prints
//! "skipped: no HIP device" and passes. Never executed on an AMD GPU (none was available).
mod common;

use collective_core::conformance::TestBackend;
use common::HipRank;
use hip_ipc::HipIpcConfig;
use std::time::Duration;

/// Worlds of ranks as threads on HIP device 0; a 32 KiB RS+AG threshold so both all_reduce
/// routes run.
struct Threads;

impl TestBackend for Threads {
    type Rank = HipRank;
    fn name(&self) -> String {
        "hip-ipc (threads on one GPU)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut HipRank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let Some(ordinal) = common::gpu() else { return Ok(()) };
        let _one_world = common::gpu_lock();
        let mut config = HipIpcConfig::new(capacity).with_rsag_threshold(32 << 10);
        config.timeouts =
            Some(collective_core::protocol::Timeouts { peer: Duration::from_secs(20), ..Default::default() });
        let comms = hip_ipc::group_on_ordinal(ordinal, world, &config).map_err(|e| e.to_string())?;
        common::run_ranks(comms, |rank| common::checked(rank, case))
    }
}

collective_core::conformance_suite!(super::Threads);
