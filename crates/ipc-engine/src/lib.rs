//! The IPC engine of detcoll: the host side of the IPC protocol, written once.
//!
//! The protocol itself — the staging layout, flag words, plans, kernel parameter packing and
//! the error record — is defined in [`detcoll_protocol`]; the kernels that run it are
//! in `kernels/`. This crate is everything a GPU backend does on the host around them: building
//! a world (ranks as threads with peer pointers, or one process per rank with IPC handles
//! exchanged through a bootstrap), the per-call path (validate, plan, pack, one launch), the
//! error record and poison, and close with its acknowledgements.
//!
//! It is generic over one small trait, [`Device`] (in the spirit of wgpu-hal under wgpu-core;
//! defined with the protocol in `detcoll-protocol`):
//! `cuda-ipc` implements it on cudarc, `hip-ipc` on its own runtime-loaded HIP binding, and the
//! NCCL/RCCL transport (`ccl-transport`) runs on the same trait. A backend adds nothing but
//! its runtime's calls.
#![deny(unsafe_op_in_unsafe_fn)]

mod collective;
mod construct;
mod fused_norm;
mod lockstep;
mod order;
mod state;

pub use collective::IpcCollective;
pub use construct::LOCKSTEP_ENV;
/// The device traits the engine is generic over (defined with the protocol in `detcoll-protocol`).
pub use detcoll_protocol::{Device, IpcDevice, Launch, RawStream, Vendor};
