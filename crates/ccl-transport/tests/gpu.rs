//! GPU behaviour of the NCCL transport beyond the conformance suite (`common::checks`, shared
//! with the RCCL twin `tests/gpu_hip.rs`):
//!
//! * the transport's local tree (W stacked inputs, the workspace layout an all_gather leaves)
//!   bit-exact vs `fixed-tree` for W = 2/4/8, f32/f16/bf16, aligned, unaligned and
//!   non-co-aligned layouts, finite and special values (needs only CUDA);
//! * world 1 through NCCL (`ncclCommInitRank` with one rank): every op and every exchange
//!   mode bit-exact vs `fixed-tree`, calls alternating between streams, workspace reporting,
//!   bounded synchronize, close, and the non-strict native reference.
//! * world 2 (two GPUs, ranks as threads): the watchdog aborts a call the peer never makes —
//!   the caller's own stream synchronisation returns within the bound (+ margin), the
//!   collective is poisoned naming the watchdog, close is bounded; a healthy call first is
//!   bit-exact and not tripped.
//!
//! Without a GPU (or NCCL) each test prints "skipped: no CUDA device / no NCCL" and passes.
//! Run with `NCCL_NVLS_ENABLE=0` on shared hosts.
mod common;

common::gpu_tests!(common::cuda::Cuda);
