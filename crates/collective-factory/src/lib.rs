//! What downstream crates depend on: one constructor that detects the platform, agrees with
//! every other rank on what is possible, and routes every call by a measured table.
//!
//! Every choice is collective. Each rank gathers its [`Facts`] (platform, host identity, what
//! it can load, capacity, routing table), every rank receives every rank's facts through the
//! bootstrap, and [`decide`] — a pure function of all of them — gives every rank the same
//! [`Decision`] or the same error. There is never a silent per-rank fallback (that would
//! deadlock the ranks that did not fall back).
//!
//! Cargo features select backends: `cpu` (the CPU twin, default). GPU backends join under
//! `cuda`/`rocm` as their crates land; a build without them contains none of their code.

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
#[cfg(feature = "cpu")]
pub use cpu::{CpuCollective, cpu_collective, cpu_with_transport};
