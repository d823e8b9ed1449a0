//! The shared conformance suite on the CUDA IPC twin: world 1/2/4/8 as threads of this process
//! on one GPU (GPU 0). Without a GPU each test prints "skipped: no CUDA device".
mod common;

use cuda_ipc::cudarc::driver::CudaContext;
use std::sync::Arc;

/// Every rank on GPU 0.
fn on_gpu0(world: usize) -> Result<Option<Vec<Arc<CudaContext>>>, String> {
    Ok(common::gpu().map(|ctx| vec![ctx; world]))
}

collective_core::conformance_suite!(super::common::ThreadRanks {
    name: "cuda-ipc (threads on one GPU)",
    place: super::on_gpu0
});
