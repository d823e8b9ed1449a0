//! The shared conformance suite with the ranks threads of this process spread over every GPU:
//! rank `r` on device `r % device_count`, ranks of one device sharing its context, peers on
//! other devices reached through peer access ([`cuda_ipc::CudaIpcCollective::group`] with one
//! context per rank). Needs 2+ GPUs; otherwise each test prints why it was skipped and passes.
mod common;

use collective_core::conformance::skip;
use cuda_ipc::cudarc::driver::CudaContext;
use std::sync::Arc;

/// Rank `r` on device `r % device_count`; `None` (skipped) with fewer than 2 devices.
fn across_gpus(world: usize) -> Result<Option<Vec<Arc<CudaContext>>>, String> {
    let devices = match common::device_count() {
        Ok(n) if n >= 2 => n,
        Ok(n) => {
            skip(&format!("needs 2+ GPUs (the driver reports {n})"));
            return Ok(None);
        }
        Err(e) => {
            skip(&format!("needs 2+ GPUs (no CUDA device: {e})"));
            return Ok(None);
        }
    };
    (0..world).map(|r| common::open_gpu(r % devices)).collect::<Result<Vec<_>, _>>().map(Some)
}

collective_core::conformance_suite!(super::common::ThreadRanks {
    name: "cuda-ipc (threads across GPUs)",
    place: super::across_gpus
});
