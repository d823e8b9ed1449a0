//! The shared conformance suite on the NCCL transport: one rank per GPU as threads of this
//! process. World 1 runs on any host with a GPU and NCCL; larger worlds need that many GPUs
//! (NCCL refuses two ranks on one GPU) and print a skip otherwise. The AMD twin is
//! `tests/conformance_hip.rs`.
mod common;

common::conformance!(common::cuda::Cuda);
