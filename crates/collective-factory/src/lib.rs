//! What downstream crates depend on: constructors that detect the platform ([`auto`]) or take
//! it from you (`cpu`, `nvidia`, `rocm`), agree with every other rank on what is possible, and
//! route every call by a measured table.
//!
//! Every choice is collective. Each rank gathers its [`Facts`] (platform, host identity, what
//! it can load, capacity, routing table), every rank receives every rank's facts through the
//! bootstrap, and [`decide`] — a pure function of all of them — gives every rank the same
//! [`Decision`] or the same error. There is never a silent per-rank fallback (that would
//! deadlock the ranks that did not fall back).
//!
//! Cargo features select backends: `cpu` (the CPU twin, default), `cuda` (CUDA IPC + NCCL),
//! `rocm` (HIP IPC + RCCL). A build without a feature contains none of its code, and a rocm-only
//! build contains no CUDA code (`tests/build_isolation.rs`).
//!
//! This crate is the only dependency an application needs: it re-exports the vocabulary of
//! `collective-core` ([`Collective`], [`Io`], [`Error`], the dtypes, [`bootstrap`]), [`half`]
//! (bf16/f16), with feature `cuda` the `cudarc` it is built on (`collective_factory::cudarc`,
//! with its `f16` feature: bf16/f16 buffers work), and with feature `rocm` the HIP types its
//! collective runs on (`collective_factory::hip`).

/// The README's examples, compiled and run as doctests (its GPU example needs `cuda`).
#[cfg_attr(all(feature = "cpu", feature = "cuda"), doc = include_str!("../README.md"))]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod agree;
pub mod auto;
mod chunked;
#[cfg(any(feature = "cuda", feature = "rocm"))]
mod compose;
mod config;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod gpu_transport;
pub mod nodes;
mod norm;
mod platform;
mod routed;
mod routing;
mod scratch;
#[cfg(any(feature = "cpu", feature = "cuda", feature = "rocm"))]
mod threads;
mod via;

/// The agreement's internals (facts every rank reports, the pure decision): for tests and
/// tools, not covered by semver.
#[doc(hidden)]
pub use agree::{Decision, Facts, decide};
pub use auto::AnyCollective;
pub use config::{Config, DEFAULT_CAPACITY, DeviceSelect};
pub use norm::{GATHERED_MIN_ROWS, NormBackend, ONE_KERNEL_MAX_ROWS, one_kernel};
pub use platform::Platform;
pub use routed::{NoTransport, Routed};
pub use routing::{Routing, RoutingTable, Rule};

#[cfg(feature = "cpu")]
pub mod cpu;
#[cfg(feature = "cpu")]
pub use cpu::CpuCollective;
#[cfg(feature = "cuda")]
pub mod cuda_api;
#[cfg(feature = "cuda")]
pub mod nvidia;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub mod raw_api;
#[cfg(any(feature = "cuda", feature = "rocm"))]
pub use gpu_transport::GpuTransport;
#[cfg(feature = "cuda")]
pub use nvidia::NvidiaCollective;
#[cfg(feature = "rocm")]
pub mod rocm;
#[cfg(feature = "rocm")]
pub use rocm::RocmCollective;

// What an application uses with the constructors, so that it depends on this crate alone.
pub use collective_core::bootstrap;
/// The CPU reference that defines every result's bits (`fixed-tree`): the canonical tree
/// (`reduce`, `tree_sum`, `all_gather`, `reduce_scatter`) and the fused norm
/// (`residual_rmsnorm`), for checking a backend's output or computing it on the host.
pub use collective_core::fixed_tree;
pub use collective_core::{
    Capabilities, Collective, DType, Error, FUSED_NORM_OP, Io, Op, Plain, RawMut, RawRef, Reducible, ResidualRmsNorm,
    RmsNorm, Route, Timeouts, lane_name,
};
/// The `half` crate: `bf16` and `f16`, the 16-bit dtypes of host and cudarc buffers.
pub use half;

/// The `cudarc` this crate is built on (driver, NVRTC, `f16`): `CudaContext` for
/// [`nvidia::from_context`], streams and buffers for the typed entry points of
/// [`NvidiaCollective`] ([`cuda_api`]).
#[cfg(feature = "cuda")]
pub use cuda_ipc::cudarc;

/// The HIP types the ROCm collective runs on (feature `rocm`): its device and stream
/// ([`RocmCollective`]'s `Collective::Stream`), device memory, and the device count.
#[cfg(feature = "rocm")]
pub mod hip {
    pub use hip_ipc::runtime::{DeviceMemory, device_count};
    pub use hip_ipc::{Event, HipDevice, Stream};
}
