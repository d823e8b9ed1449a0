//! Route equivalence on NVIDIA GPUs: the factory's collective built with a forced routing (every
//! op through IPC one-shot; IPC reduce_scatter + all_gather; the NCCL transport; the hybrid, IPC
//! reduce_scatter + transport all_gather) must give fixed-tree's bits on every call of
//! `common::plan`: every op, f32/f16/bf16, odd and above-256-KiB sizes, in place and not,
//! reduce_scatter_many with 2 and 3 lanes, and report the forced route.
//!
//! One process per rank (CUDA IPC handles cannot be opened in the process that made them), one
//! GPU per rank (NCCL refuses two ranks on one GPU): the world is the largest of 2, 4, 8 that
//! the GPUs allow. With fewer than 2 GPUs, no CUDA or no NCCL each test prints why it skipped.
//! The AMD twin is `tests/rocm_routes.rs` (same checks, `common::check_routes`).
#![cfg(feature = "cuda")]
mod common;

common::route_tests!(common::nvidia::Nvidia);
