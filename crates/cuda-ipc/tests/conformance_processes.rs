//! The conformance suite with every rank its own process, rank `r` on device
//! `r % device_count` (all on GPU 0 on a one-GPU host), allocations exchanged as CUDA IPC
//! handles over the TCP bootstrap. Processes sharing one GPU run concurrently only under MPS,
//! so this runs when `DETCOLL_CUDA_PROCESS_TESTS=1` (set it after starting
//! `nvidia-cuda-mps-control -d`, or on a machine with one GPU per rank; `cargo xtask gpu-test`
//! does both); otherwise each test prints why it was skipped.
mod common;

use collective_core::Collective;
use collective_core::conformance::{CHILD_ENV, TestBackend, run_processes, skip};
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
                skip("set DETCOLL_CUDA_PROCESS_TESTS=1 (ranks sharing a GPU need MPS)");
                return Ok(());
            }
            // Only the ranks open a device: the parent is not one more context (MPS client).
            if let Err(e) = common::device_count() {
                skip(&format!("no CUDA device ({e})"));
                return Ok(());
            }
        }
        let _one_world = common::gpu_lock();
        let config = common::suite_config(capacity, Duration::from_secs(30));
        run_processes(
            world,
            test,
            |boot| {
                let ctx = common::open_gpu(common::rank_device(boot.rank())?)?;
                // Memory first: no allocation once peers may have kernels in flight.
                let region = common::Region::new(&ctx, common::REGION_BYTES);
                let stream = ctx.new_stream().map_err(|e| e.to_string())?;
                let comm = cuda_ipc::new(boot, &ctx, &config).map_err(|e| e.to_string())?;
                Ok(common::CudaRank::owning(comm, stream, region))
            },
            &|rank: &mut common::CudaRank| common::checked_case(rank, case),
            |rank| rank.comm.close().map_err(|e| e.to_string()),
        )
    }
}

collective_core::conformance_suite!(super::Processes);
