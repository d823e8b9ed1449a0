//! The shared conformance suite on the CUDA IPC twin: world 1/2/4/8 as threads of this process
//! on one GPU. Without a GPU each test prints "skipped: no CUDA device".
mod common;

use collective_core::conformance::TestBackend;
use cuda_ipc::{CudaIpcCollective, CudaIpcConfig};
use std::time::Duration;

/// Worlds of ranks as threads on GPU 0; a 32 KiB RS+AG threshold so both all_reduce routes run
/// (the suite's sizes go up to its 256 KiB capacity).
struct Threads;

impl TestBackend for Threads {
    type Rank = common::CudaRank;
    fn name(&self) -> String {
        "cuda-ipc (threads on one GPU)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let Some(ctx) = common::gpu() else { return Ok(()) };
        let _one_world = common::gpu_lock();
        let mut config = CudaIpcConfig::new(capacity).with_rsag_threshold(32 << 10);
        config.timeouts.peer = Duration::from_secs(20);
        let comms = CudaIpcCollective::group_on_device(&ctx, world, &config).map_err(|e| e.to_string())?;
        common::run_ranks(&ctx, comms, |rank| {
            let r = case(rank);
            rank.stream.synchronize().map_err(|e| e.to_string())?;
            rank.comm.check().map_err(|e| format!("recorded kernel failure: {e}"))?;
            r
        })
    }
}

collective_core::conformance_suite!(super::Threads);
