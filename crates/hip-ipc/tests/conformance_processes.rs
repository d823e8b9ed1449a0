//! The conformance suite with every rank its own process on HIP device 0, allocations exchanged
//! as HIP IPC handles over the TCP bootstrap. Runs when `DETCOLL_HIP_PROCESS_TESTS=1` (ranks of
//! a world share one GPU and must run concurrently); otherwise each test prints why it was
//! skipped. The ranks are built through the engine's constructor, not `hip_ipc::new`, so the
//! shared-GPU refusal (`hip_ipc::check_shared_gpu`, `DETCOLL_HIP_ALLOW_SHARED_GPU`) does not
//! apply. Never executed on an AMD GPU (none was available).
mod common;

collective_core::conformance_suite!(gpu_conformance::Processes::<super::common::Hip>::new("hip-ipc (processes)"));
