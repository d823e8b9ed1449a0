//! What downstream crates depend on: one constructor that detects the platform, agrees with
//! every other rank on what is possible, and routes every call by a measured table.
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

/// The README's examples, compiled and run as doctests (its GPU example needs `cuda`).
#[cfg_attr(all(feature = "cpu", feature = "cuda"), doc = include_str!("../README.md"))]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod agree;
mod config;
mod platform;
mod routed;
mod routing;

/// The agreement's internals (facts every rank reports, the pure decision): for tests and
/// tools, not covered by semver.
#[doc(hidden)]
pub use agree::{Decision, Facts, decide};
pub use config::{Config, DEFAULT_CAPACITY, DeviceSelect};
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
#[cfg(feature = "cuda")]
pub use nvidia::NvidiaCollective;
#[cfg(feature = "rocm")]
pub mod rocm;
#[cfg(feature = "rocm")]
pub use rocm::RocmCollective;
