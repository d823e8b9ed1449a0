//! HIP IPC backend of detcoll (AMD ROCm: MI300X gfx942, MI355X gfx950).
//!
//! Layers, one job each:
//!
//! * [`sys`]: the raw function-pointer table of the ~40 HIP runtime symbols we call, loaded at
//!   run time from `libamdhip64` (nothing is linked at build time), with the constants and
//!   type sizes of the ROCm 6+ headers checked at compile time;
//! * [`result`]: `hipError_t` to [`collective_core::Error`], with `hipGetErrorString`;
//! * [`runtime`]: the safe layer — devices, streams, events, device / fine-grained /
//!   host-mapped memory, IPC handles, copies;
//! * [`kernels`]: the code object for the device's `gfx` target — prebuilt
//!   (`kernels/build/detcoll_hip.<gfx>.co`) when present, else the embedded kernels compiled by
//!   hiprtc at run time — loading it and checking its ABI table;
//! * [`rtc`]: the raw hiprtc binding (8 symbols of `libhiprtc`, loaded at run time like
//!   [`sys`]; missing is [`collective_core::Error::LibraryMissing`]) and its compile call;
//! * [`build`]: the HIP kernel compile driver shared by `cargo xtask build` and the tests
//!   (hipcc, else Debian's clang, else the clang bundled with zig);
//! * [`HipDevice`]: the engine's [`Device`] on this binding; [`HipIpcCollective`] is the shared
//!   engine's collective on it ([`ipc_engine`]): ranks as threads ([`group`]) or one process
//!   per rank over a bootstrap ([`new`]), one `hipModuleLaunchKernel` per call;
//! * [`FusedTree`]: the fused tree kernel alone (W inputs -> 1 output), the device code of the
//!   RCCL transport's local reduction (`ccl-transport`, feature `rocm`).
//!
//! A missing `libamdhip64` is [`collective_core::Error::LibraryMissing`], never a panic.
//!
//! Status: written and compiled, never executed: nothing of this crate has run on an AMD GPU
//! (none was available). See docs/rocm.md for what was compiled and what ran.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod build;
mod device;
mod entry;
mod group;
pub mod kernels;
mod norm;
pub mod result;
pub mod rtc;
pub mod runtime;
mod staging;
pub mod sys;
mod tree;

/// Backend name used in [`collective_core::Error::Backend`].
pub const BACKEND: &str = "hip-ipc";

pub use detcoll_protocol::NormDevice;
pub use detcoll_protocol::norm::NormArgs;
/// The configuration of a HIP IPC collective: the backend-neutral one `cuda-ipc` uses too.
pub use detcoll_protocol::{DEFAULT_RSAG_THRESHOLD, IpcConfig as HipIpcConfig};
pub use device::{FALLBACK_WALL_CLOCK_KHZ, HipDevice, khz_from_samples, wait_ticks};
pub use group::{
    ALLOW_SHARED_GPU_ENV, DEFAULT_HW_QUEUES, HW_QUEUES_ENV, check_hw_queues, check_shared_gpu, group, group_on_ordinal,
    new, new_on,
};
pub use ipc_engine::{Device, IpcCollective, RawStream};
pub use staging::{
    CONTROL_MEMORY_ENV, ControlMemory, EXPORT_GRANULE, allocation_sizes, check_control_attributes, export_size,
};

/// One rank of a HIP IPC collective: the engine's collective on a [`HipDevice`].
/// `Collective::Stream` is [`Stream`]; the engine's `enqueue*` methods take a [`RawStream`]
/// (a `hipStream_t`).
pub type HipIpcCollective = IpcCollective<HipDevice>;
pub use runtime::{Event, Stream};
pub use tree::{Arithmetic, FusedTree};
