//! The NCCL/RCCL transport of detcoll: bitwise-deterministic collectives that use the vendor
//! library only to move bytes, and do every add in the local fixed-tree kernel.
//!
//! RCCL keeps NCCL's API and ABI, so one binding drives `libnccl.so.2` on NVIDIA and
//! `librccl.so.1` on ROCm. Layers, bottom up (cudarc-style):
//!
//! * [`sys`]: our own runtime-loaded binding of the NCCL subset we use (types checked against
//!   `nccl.h` at compile time, every symbol resolved at load: a missing library or symbol is
//!   a typed error, never a panic); [`loader`]: where the library is looked for;
//! * [`result`]: every `ncclResult_t` as a `Result` with the library's message;
//! * [`Communicator`]: created through a [`collective_core::bootstrap::Bootstrap`] (rank 0's
//!   unique id shared with `all_gather_bytes`), non-blocking with every wait bounded,
//!   destroyed on drop (aborted after a failure);
//! * [`TransportCollective`]: the [`collective_core::Collective`] — all_gather straight into
//!   the output; all_reduce / reduce_scatter / reduce_scatter_many as a rank-ordered
//!   all_gather into a lazily grown workspace followed by the local fixed tree
//!   (`((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))` in the element's dtype; for more than 8 ranks, up
//!   to 4096, the same canonical tree in passes of at most 8 inputs) — over the engine's
//!   [`Device`] trait: `cuda_ipc::CudaDevice` runs the CUDA twin's fused tree kernel,
//!   `hip_ipc::HipDevice` the HIP twin's (the same `detcoll_tree` device code).
//! * [`watchdog`]: a thread (on by default) that bounds every call's device time, so a caller
//!   waiting with its own stream synchronisation gets an error, never a hang, when a peer dies
//!   or makes another call;
//! * [`nonstrict`]: native NCCL all_reduce / reduce_scatter, NOT deterministic, for benchmark
//!   comparison only.
//!
//! The crate contains no CUDA and no HIP code: the device side comes from whoever composes it
//! (`collective-factory`), so a ROCm build pulls no cudarc and a CUDA build no HIP binding.
#![deny(unsafe_op_in_unsafe_fn)]

mod agree;
mod collective;
mod comm;
mod config;
mod device;
mod error;
pub mod loader;
pub mod nonstrict;
mod plan;
pub mod result;
#[cfg(test)]
mod sim;
pub mod sys;
mod version;
pub mod watchdog;

pub use collective::TransportCollective;
pub use comm::{CommOptions, Communicator};
pub use config::{DEFAULT_PACK_THRESHOLD, TransportConfig, Watchdog};
pub use device::{Device, RawStream};
pub use error::{BACKEND, NcclError};
pub use loader::{LIBRARY_ENV, Vendor, load, load_from, load_path};
pub use result::Progress;
pub use sys::NcclLibrary;
pub use version::Version;
