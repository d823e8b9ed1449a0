//! The shared conformance suite with the ranks threads of this process spread over every GPU:
//! rank `r` on device `r % device_count`, ranks of one device sharing its context, peers on
//! other devices reached through peer access ([`cuda_ipc::CudaIpcCollective::group`] with one
//! device per rank). Needs 2+ GPUs; otherwise each test prints why it was skipped and passes.
mod common;

collective_core::conformance_suite!(gpu_conformance::Threads::<super::common::Cuda>::new(
    "cuda-ipc (threads across GPUs)",
    gpu_conformance::across_gpus::<super::common::Cuda>
));
