//! The shared conformance suite on the CUDA IPC twin: world 1/2/4/8 as threads of this process
//! on one GPU (GPU 0). Without a GPU each test prints "skipped: no CUDA device".
mod common;

collective_core::conformance_suite!(gpu_conformance::Threads::<super::common::Cuda>::new(
    "cuda-ipc (threads on one GPU)",
    gpu_conformance::one_gpu::<super::common::Cuda>
));
