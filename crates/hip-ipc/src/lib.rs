//! HIP IPC backend of detcoll (AMD ROCm: MI300X gfx942, MI355X gfx950).
//!
//! Layers, one job each:
//!
//! * [`sys`]: the raw function-pointer table of the ~30 HIP runtime symbols we call, loaded at
//!   run time from `libamdhip64` (nothing is linked at build time), with the constants and
//!   type sizes of the ROCm 6+ headers checked at compile time;
//! * [`result`]: `hipError_t` to [`collective_core::Error`], with `hipGetErrorString`;
//! * [`runtime`]: the safe layer — devices, streams, device / fine-grained / host-mapped
//!   memory, IPC handles, copies;
//! * [`kernels`]: finding the prebuilt code object for the device's `gfx` target
//!   (`kernels/build/detcoll_hip.<gfx>.co`), loading it and checking its ABI table;
//! * [`build`]: the HIP kernel compile driver shared by `cargo xtask build` and the tests
//!   (hipcc, else Debian's clang, else the clang bundled with zig).
//!
//! A missing `libamdhip64` is [`collective_core::Error::LibraryMissing`], never a panic.
//!
//! Status: the collective itself (`HipIpcCollective`, the HIP twin of `cuda-ipc` on the shared
//! protocol) is not written yet; see docs/rocm.md for what exists, what was compiled, and what
//! ran (nothing of this crate has run on an AMD GPU: none was available).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod build;
pub mod kernels;
pub mod result;
pub mod runtime;
pub mod sys;

/// Backend name used in [`collective_core::Error::Backend`].
pub const BACKEND: &str = "hip-ipc";
