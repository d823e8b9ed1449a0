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
//!   (`((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))` in the element's dtype) — over a [`Device`]:
//!   [`CudaDevice`] (feature `cuda`, default) reuses the CUDA twin's fused tree kernel,
//!   [`HipDevice`] (feature `rocm`) the HIP twin's (the same `detcoll_tree` device code).
//! * [`watchdog`]: a thread (on by default) that bounds every call's device time, so a caller
//!   waiting with its own stream synchronisation gets an error, never a hang, when a peer dies
//!   or makes another call;
//! * [`nonstrict`]: native NCCL all_reduce / reduce_scatter, NOT deterministic, for benchmark
//!   comparison only.
//!
//! Without the `cuda` feature the crate contains no CUDA code, without `rocm` no HIP code: a
//! ROCm build is `default-features = false, features = ["rocm"]`.
#![deny(unsafe_op_in_unsafe_fn)]

mod agree;
mod collective;
mod comm;
mod config;
#[cfg(feature = "cuda")]
mod cuda;
mod device;
mod error;
#[cfg(feature = "rocm")]
mod hip;
pub mod loader;
pub mod nonstrict;
mod plan;
pub mod result;
#[cfg(test)]
mod sim;
pub mod sys;
mod version;
pub mod watchdog;
mod workspace;

pub use collective::TransportCollective;
pub use comm::{CommOptions, Communicator};
pub use config::{DEFAULT_PACK_THRESHOLD, TransportConfig, Watchdog};
#[cfg(feature = "cuda")]
pub use cuda::{CudaAllocation, CudaDevice, CudaEvent};
#[cfg(feature = "cuda")]
pub use cuda_ipc;
pub use device::{Device, RawStream};
pub use error::{BACKEND, NcclError};
#[cfg(feature = "rocm")]
pub use hip::HipDevice;
#[cfg(feature = "rocm")]
pub use hip_ipc;
pub use loader::{LIBRARY_ENV, Vendor, load, load_from, load_path};
pub use result::Progress;
pub use sys::NcclLibrary;
pub use version::Version;
