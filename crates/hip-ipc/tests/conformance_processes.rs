//! The conformance suite with every rank its own process on HIP device 0, allocations exchanged
//! as HIP IPC handles over the TCP bootstrap. Runs when `DETCOLL_HIP_PROCESS_TESTS=1` (ranks of
//! a world share one GPU and must run concurrently) and `DETCOLL_HIP_ALLOW_SHARED_GPU=1` (process
//! ranks sharing a GPU are refused without it: `hip_ipc::check_shared_gpu`); otherwise each test
//! prints why it was skipped. Never executed on an AMD GPU (none was available).
mod common;

use collective_core::Collective;
use collective_core::conformance::{CHILD_ENV, TestBackend, run_processes};
use common::HipRank;
use hip_ipc::runtime::{self, DeviceMemory};
use hip_ipc::{HipIpcConfig, Stream};
use std::time::Duration;

struct Processes;

impl TestBackend for Processes {
    type Rank = HipRank;
    fn name(&self) -> String {
        "hip-ipc (processes)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        if std::env::var_os(CHILD_ENV).is_none() {
            if std::env::var("DETCOLL_HIP_PROCESS_TESTS").as_deref() != Ok("1") {
                collective_core::conformance::skip("set DETCOLL_HIP_PROCESS_TESTS=1 (ranks share HIP device 0)");
                return Ok(());
            }
            if std::env::var(hip_ipc::ALLOW_SHARED_GPU_ENV).as_deref() != Ok("1") {
                collective_core::conformance::skip(
                    "set DETCOLL_HIP_ALLOW_SHARED_GPU=1 too (the ranks share HIP device 0, refused by default)",
                );
                return Ok(());
            }
            if common::gpu().is_none() {
                return Ok(());
            }
        }
        let _one_world = common::gpu_lock();
        run_processes(
            world,
            test,
            |boot| {
                let ordinal = common::gpu().ok_or("no HIP device in the rank process")?;
                // All ranks share device 0: process mode cannot detect that (no device UUID in
                // the binding), so the block count is split explicitly; equal on every rank.
                let cus = runtime::multiprocessors(ordinal).map_err(|e| e.to_string())?;
                let mut config =
                    HipIpcConfig::new(capacity).with_rsag_threshold(32 << 10).with_max_blocks((cus / world).max(1));
                config.timeouts =
                    Some(collective_core::protocol::Timeouts { peer: Duration::from_secs(30), ..Default::default() });
                // Memory first: no allocation once peers may have kernels in flight.
                let region = DeviceMemory::new(ordinal, common::REGION_BYTES).map_err(|e| e.to_string())?;
                let stream = Stream::new(ordinal).map_err(|e| e.to_string())?;
                let comm = hip_ipc::new(boot, ordinal, &config).map_err(|e| e.to_string())?;
                Ok(HipRank::owning(comm, stream, region))
            },
            &|rank: &mut HipRank| common::checked(rank, case),
            |rank| rank.comm.close().map_err(|e| e.to_string()),
        )
    }
}

collective_core::conformance_suite!(super::Processes);
