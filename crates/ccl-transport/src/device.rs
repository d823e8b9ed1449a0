//! The device side the transport runs on: the engine's [`Device`] trait (streams, workspace
//! memory, events, and the local fixed tree kernel). NCCL and RCCL share one API, so
//! everything in this crate is vendor-neutral; `cuda-ipc`'s `CudaDevice` and `hip-ipc`'s
//! `HipDevice` implement the trait with the IPC twins' own kernels, so a transport reduction is
//! the IPC route's bits by construction, and this crate depends on neither.
pub use detcoll_protocol::{Device, RawStream};
