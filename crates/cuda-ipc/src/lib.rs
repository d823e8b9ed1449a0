//! The CUDA IPC twin of detcoll: bitwise-deterministic collectives on NVIDIA GPUs.
//!
//! Every reduction evaluates the fixed balanced rank tree
//! `((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7))` in the element's own dtype, rounded to nearest even,
//! so results are identical on every rank, run to run, route to route, and to `fixed-tree`.
//!
//! * One kernel launch per call runs the protocol of [`detcoll_protocol`]: stage into
//!   the own frame, publish a per-block `generation | signature digest` flag with a system-scope
//!   release, acquire every peer's, evaluate the tree reading peers' frames in rank order.
//!   Generations live on the device, so captured CUDA graphs replay correctly.
//! * Every wait is bounded (`%globaltimer`); a timeout, a mismatching peer or corrupt state is
//!   written to host-mapped memory and poisons the collective ([`CudaIpcCollective::check`]).
//! * Ranks as threads of one process ([`group`]) use peers' pointers directly; one process per
//!   rank ([`new`]) exchanges CUDA IPC handles through a
//!   [`collective_core::bootstrap::Bootstrap`]. The host side of the protocol is the shared
//!   engine's ([`ipc_engine`]); this crate is its [`Device`] on cudarc ([`CudaDevice`]).
//! * Collective launches are programmatic dependent launches on sm_90+ (their blocks start
//!   while the previous kernel ends and wait for it before touching memory; `DETCOLL_PDL=0`
//!   turns it off): see `docs/protocol.md`, "The launch".
//! * Nothing is linked at build time: libcuda and libnvrtc are loaded at run time, and their
//!   absence is [`collective_core::Error::LibraryMissing`], never a panic.
//!
//! `Collective::Stream` is cudarc's `CudaStream`. For graph capture and the lowest host cost,
//! disable cudarc's event tracking (`CudaContext::disable_event_tracking`) or use the raw
//! `enqueue` entry points.
#![deny(unsafe_op_in_unsafe_fn)]

mod config;
mod device;
pub mod driver;
mod group;
pub mod kernels;
mod launch;
mod memory;
mod norm;
mod programmatic;
mod tree;

pub use config::{CudaIpcConfig, DEFAULT_RSAG_THRESHOLD};
pub use cudarc;
pub use detcoll_protocol::NormDevice;
pub use detcoll_protocol::norm::NormArgs;
pub use device::{CudaAllocation, CudaDevice, CudaEvent};
pub use group::{group, group_on_device, group_on_ordinal, new, new_on_ordinal};
pub use ipc_engine::{Device, IpcCollective, RawStream};
pub use programmatic::PDL_ENV;
pub use tree::FusedTree;

/// One rank of a CUDA IPC collective: the engine's collective on a [`CudaDevice`].
/// `Collective::Stream` is cudarc's `CudaStream`; the engine's `enqueue*` methods take a
/// [`RawStream`] (a `CUstream`).
pub type CudaIpcCollective = IpcCollective<CudaDevice>;
