//! The conformance suite with every rank its own process, rank `r` on device
//! `r % device_count` (all on GPU 0 on a one-GPU host), allocations exchanged as CUDA IPC
//! handles over the TCP bootstrap. Processes sharing one GPU run concurrently only under MPS,
//! so this runs when `DETCOLL_CUDA_PROCESS_TESTS=1` (set it after starting
//! `nvidia-cuda-mps-control -d`, or on a machine with one GPU per rank; `cargo xtask gpu-test`
//! does both); otherwise each test prints why it was skipped.
mod common;

collective_core::conformance_suite!(gpu_conformance::Processes::<super::common::Cuda>::new("cuda-ipc (processes)"));
