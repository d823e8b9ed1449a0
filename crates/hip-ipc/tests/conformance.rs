//! The shared conformance suite on the HIP IPC twin: world 1/2/4/8 as threads of this process
//! on HIP device 0. Without a HIP device (or without libamdhip64) each test prints
//! "skipped: no HIP device" and passes. Never executed on an AMD GPU (none was available).
mod common;

use collective_core::Collective;
use collective_core::conformance::TestBackend;
use common::HipRank;
use hip_ipc::runtime::{self, DeviceMemory};
use hip_ipc::{HipIpcCollective, HipIpcConfig, Stream};
use std::sync::Mutex;
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
        config.timeouts.peer = Duration::from_secs(20);
        let comms = HipIpcCollective::group_on_ordinal(ordinal, world, &config).map_err(|e| e.to_string())?;
        let regions = (0..world)
            .map(|_| DeviceMemory::new(ordinal, common::REGION_BYTES).map_err(|e| e.to_string()))
            .collect::<Result<Vec<_>, _>>()?;
        let streams =
            (0..world).map(|_| Stream::new(ordinal).map_err(|e| e.to_string())).collect::<Result<Vec<_>, _>>()?;
        let slots = Mutex::new(comms.into_iter().zip(streams).map(Some).collect::<Vec<_>>());
        let r = collective_core::conformance::run_threads(world, |r| {
            let (comm, stream) = slots.lock().map_err(|e| e.to_string())?[r].take().ok_or("rank taken")?;
            runtime::set_device(ordinal).map_err(|e| e.to_string())?;
            let mut rank = HipRank::borrowing(comm, stream, regions[r].ptr(), common::REGION_BYTES);
            let result = case(&mut rank);
            let synced = rank.stream.synchronize().map_err(|e| format!("stream: {e}"));
            let checked = rank.comm.check().map_err(|e| format!("recorded kernel failure: {e}"));
            let closed = rank.comm.close().map_err(|e| format!("close: {e}"));
            result.and(synced).and(checked).and(closed)
        });
        drop(regions);
        r
    }
}

collective_core::conformance_suite!(super::Threads);
