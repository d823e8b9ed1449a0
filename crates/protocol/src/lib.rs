//! The backend-neutral IPC protocol (design brief §4) and the device traits its host side runs
//! on: what every IPC backend and the NCCL/RCCL transport share, beside the kernels
//! (`detcoll-kernels`) that run it on a GPU.
//!
//! **Unstable**: for detcoll's backend crates (the engine, the CPU twin); it changes with the
//! kernel ABI and is not covered by semver.
//!
//! Every IPC backend — the CPU twin over host shared memory, CUDA IPC, HIP IPC — runs this one
//! protocol; the CPU twin executes it on the host, the GPU twins inside one kernel. What they
//! share lives here:
//!
//! * [`Layout`]: where the flags and staging frames sit in each rank's one allocation;
//! * [`FlagWord`]: the published `generation | signature digest` word and how a waiter reads it;
//! * [`Plan`]: what one call stages, reduces and gathers, per route;
//! * [`Chunks`]: the plans of a call above the staging capacity, one generation per chunk;
//! * [`Poison`]: the sticky failure state every later call reports;
//! * [`Timeouts`]: the bounds on every wait;
//! * [`params`]: the GPU kernels' parameter structs and the packing of a [`Plan`] into them;
//! * [`status`]: decoding the error record a GPU kernel wrote;
//! * [`IpcConfig`]: the construction-time configuration of the GPU twins;
//! * [`Device`] / [`IpcDevice`]: the small traits a runtime implements (streams, memory, events,
//!   the tree kernel; staging, IPC handles, the collective kernels, the error record), in the
//!   spirit of wgpu-hal: the engine (`ipc-engine`) and the transport (`ccl-transport`) are
//!   generic over them; `cuda-ipc`, `hip-ipc` and the CPU twin implement them;
//! * [`NormDevice`] ([`norm`]): the residual add + RMSNorm after an all_reduce, on the same
//!   devices.
//!
//! ```text
//!  rank r allocation:  [header][status][sig slot 0][sig slot 1][ready x B][phase2 x B][ack x W]
//!                      [frame 0: capacity bytes][frame 1: capacity bytes]
//!
//!  call g (frame f = g % 2), per block b:
//!    copy input -> own frame f               (never overwrites data a peer still reads:
//!    store sig slot f; release ready[b] = g   peers finished call g-2 before we saw their
//!    acquire every peer's ready[b] >= g       ready flags of call g-1)
//!    evaluate the tree reading peers' frame f in rank order -> output
//!    (RS+AG route: write reduced shard into own frame f, release phase2[b] = g,
//!     acquire peers' phase2[b] >= g, copy their reduced shards -> output)
//! ```
//!
//! Double-buffered frames make a second ("done") flag per call unnecessary: a rank starts call
//! `g` only after it saw every peer's ready flag of call `g-1`, which every peer publishes only
//! after it finished reading call `g-2`'s frame — the frame call `g` overwrites.
#![deny(unsafe_op_in_unsafe_fn)]

mod chunk;
pub mod close;
mod config;
pub mod device;
pub mod failure;
mod flag;
mod layout;
pub mod norm;
mod norm_device;
pub mod params;
mod plan;
mod poison;
pub mod status;
#[cfg(feature = "conformance")]
pub mod suite;
mod workspace;

pub use chunk::{
    Chunks, MIN_CAPACITY, bulk_all_reduce_elements, bulk_scatter_elements, check_capacity, chunk_elements,
};
pub use collective_core::{MAX_TIMEOUT, TIMEOUT_ENV, Timeouts};
pub use config::{DEFAULT_LL_CAPACITY, DEFAULT_RSAG_THRESHOLD, IpcConfig};
pub use device::{Device, IpcDevice, Launch, RawStream, Vendor};
pub use flag::{FlagState, FlagWord};
pub use layout::{
    CLOSE_ACK, HEADER_MAGIC, HEADER_WORDS, Header, LINE, LL_EXPANSION, Layout, MAX_BLOCKS, MAX_LL_CAPACITY,
    PROTOCOL_VERSION,
};
pub use norm::{NormArgs, NormParams};
pub use norm_device::NormDevice;
pub use plan::{Phase, Plan, Segment};
pub use poison::Poison;
pub use workspace::{GRANULE, Workspace};
