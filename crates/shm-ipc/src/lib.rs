//! The CPU twin of detcoll: the IPC protocol of `collective_core::protocol` executed on the
//! host, over shared memory.
//!
//! Each rank owns one region laid out by [`collective_core::protocol::Layout`]: a control block
//! (flags on their own lines) and two staging frames. Between processes the regions are files
//! in `/dev/shm`, whose names travel through the bootstrap and are unlinked once every rank has
//! mapped them; between threads they are heap allocations shared directly. Every call stages,
//! publishes `generation | signature digest` with a release store, waits (bounded, noticing a
//! dead peer process) for every peer's matching flag, and evaluates the fixed tree reading the
//! peers in rank order — the same protocol the GPU twins run inside one kernel.
//!
//! CI and CPU users run the real protocol through this crate; it passes the same conformance
//! suite as the GPU twins.

mod collective;
mod config;
mod engine;
mod region;
mod wait;

pub use collective::ShmCollective;
pub use config::ShmConfig;
