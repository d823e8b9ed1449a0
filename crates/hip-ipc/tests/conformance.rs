//! The shared conformance suite on the HIP IPC twin: world 1/2/4/8 as threads of this process
//! on HIP device 0. Without a HIP device (or without libamdhip64) each test prints
//! "skipped: no HIP device (...)" and passes. Never executed on an AMD GPU (none was available).
mod common;

collective_core::conformance_suite!(gpu_conformance::Threads::<super::common::Hip>::new(
    "hip-ipc (threads on one GPU)",
    gpu_conformance::one_gpu::<super::common::Hip>
));
