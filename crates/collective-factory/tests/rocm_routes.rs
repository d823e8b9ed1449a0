//! Route equivalence on AMD GPUs: `rocm::from_bootstrap` built with a forced routing (every op
//! through HIP IPC one-shot; IPC reduce_scatter + all_gather; the RCCL transport; the hybrid,
//! IPC reduce_scatter + transport all_gather) must give fixed-tree's bits on every call of
//! `common::plan`: every op, f32/f16/bf16, odd and above-256-KiB sizes, in place and not,
//! reduce_scatter_many with 2 and 3 lanes, and report the forced route. The same checks as
//! `tests/nvidia_routes.rs` (`common::check_routes`).
//!
//! One process per rank (HIP IPC handles are opened by the other processes), one GPU per rank
//! (RCCL refuses two ranks on one GPU): the world is the largest of 2, 4, 8 that the GPUs
//! allow. With fewer than 2 GPUs, no HIP or no RCCL each test prints why it skipped. Never
//! executed on an AMD GPU (none was available): see docs/rocm.md.
#![cfg(feature = "rocm")]
mod common;

common::route_tests!(common::rocm::Rocm);
