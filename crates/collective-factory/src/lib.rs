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

mod agree;
mod platform;
mod routed;
mod routing;

pub use agree::{Decision, Facts, decide};
pub use platform::Platform;
pub use routed::{NoTransport, Routed};
pub use routing::{Routing, RoutingTable, Rule};

#[cfg(feature = "cpu")]
mod cpu;
#[cfg(feature = "cuda")]
mod nvidia;
#[cfg(feature = "cpu")]
pub use cpu::{CpuCollective, cpu_collective, cpu_with_transport};
#[cfg(feature = "cuda")]
pub use nvidia::{NvidiaCollective, NvidiaConfig, nvidia_collective};
#[cfg(feature = "rocm")]
mod rocm;
#[cfg(feature = "rocm")]
pub use rocm::{RocmCollective, rocm_collective};
