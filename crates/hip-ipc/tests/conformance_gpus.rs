//! The shared conformance suite with the ranks threads of this process spread over every HIP
//! device: rank `r` on device `r % device_count`, ranks of one device sharing it, peers on
//! other devices reached through peer access ([`hip_ipc::group`]). Needs 2+ GPUs; otherwise
//! each test prints why it was skipped and passes. Never executed on an AMD GPU (none was
//! available).
mod common;

collective_core::conformance_suite!(gpu_conformance::Threads::<super::common::Hip>::new(
    "hip-ipc (threads across GPUs)",
    gpu_conformance::across_gpus::<super::common::Hip>
));
