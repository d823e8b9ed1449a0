//! The conformance suite with every rank its own process on GPU 0, allocations exchanged as
//! CUDA IPC handles over the TCP bootstrap. Processes sharing one GPU run concurrently only
//! under MPS, so this runs when `DETCOLL_CUDA_PROCESS_TESTS=1` (set it after starting
//! `nvidia-cuda-mps-control -d`, or on a machine with one GPU per rank); otherwise each test
//! prints why it was skipped.
mod common;

use collective_core::Collective;
use collective_core::conformance::{CHILD_ENV, TestBackend, run_processes};
use cuda_ipc::{CudaIpcCollective, CudaIpcConfig};
use std::time::Duration;

struct Processes;

impl TestBackend for Processes {
    type Rank = common::CudaRank;
    fn name(&self) -> String {
        "cuda-ipc (processes)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        if std::env::var_os(CHILD_ENV).is_none() {
            if std::env::var("DETCOLL_CUDA_PROCESS_TESTS").as_deref() != Ok("1") {
                collective_core::conformance::skip("set DETCOLL_CUDA_PROCESS_TESTS=1 (ranks sharing a GPU need MPS)");
                return Ok(());
            }
            if common::gpu().is_none() {
                return Ok(());
            }
        }
        let _one_world = common::gpu_lock();
        let mut config = CudaIpcConfig::new(capacity).with_rsag_threshold(32 << 10);
        config.timeouts.peer = Duration::from_secs(30);
        run_processes(
            world,
            test,
            |boot| {
                let ctx = common::gpu().ok_or("no CUDA device in the rank process")?;
                // Memory first: no allocation once peers may have kernels in flight.
                let region = common::Region::new(&ctx, common::REGION_BYTES);
                let stream = ctx.new_stream().map_err(|e| e.to_string())?;
                let comm = CudaIpcCollective::new(boot, &ctx, &config).map_err(|e| e.to_string())?;
                Ok(common::CudaRank::owning(comm, stream, region))
            },
            &|rank: &mut common::CudaRank| {
                let r = case(rank);
                rank.stream.synchronize().map_err(|e| e.to_string())?;
                rank.comm.check().map_err(|e| format!("recorded kernel failure: {e}"))?;
                r
            },
            |rank| rank.comm.close().map_err(|e| e.to_string()),
        )
    }
}

collective_core::conformance_suite!(super::Processes);
