//! The conformance suite with every rank its own process on HIP device 0, allocations exchanged
//! as HIP IPC handles over the TCP bootstrap. Runs when `DETCOLL_HIP_PROCESS_TESTS=1` (ranks of
//! a world share one GPU and must run concurrently); otherwise each test prints why it was
//! skipped. Never executed on an AMD GPU (none was available).
mod common;

collective_core::conformance_suite!(gpu_conformance::Processes::<super::common::Hip>::new("hip-ipc (processes)"));
