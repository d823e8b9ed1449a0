//! Shared vocabulary of detcoll.
//!
//! Every backend (the CPU twin, CUDA IPC, HIP IPC, the NCCL/RCCL transport) speaks these types:
//!
//! * [`DType`], [`Plain`] and [`Reducible`]: what may be gathered and what may be reduced;
//! * [`RawRef`]/[`RawMut`] and [`Io`]: the backend-neutral view of caller memory;
//! * [`Collective`]: the one call shape every backend implements;
//! * [`Capabilities`], [`Route`], [`Op`] and [`Signature`];
//! * [`Error`] and [`validate`]: fail-closed checks done before any device work;
//! * [`bootstrap`]: rank rendezvous (the crate `detcoll-bootstrap`, re-exported; its errors
//!   convert into [`Error`]);
//! * [`env`](mod@env): fail-closed parsing of the `DETCOLL_*` environment variables;
//! * [`Timeouts`]: the bounds on every wait for a peer;
//! * [`RouteTable`]: the route policy (`op × bytes → route`) every backend looks up;
//! * `conformance` (feature `conformance`): the suite every backend instantiates.
//!
//! Stability: the user-facing vocabulary (dtypes, views, `Collective`, `Error`, `bootstrap`,
//! `env`) is the API. `conformance` exists for detcoll's own backend crates and tests and is not
//! covered by semver. The IPC protocol (staging layout, flag words, plans, the kernel parameter
//! ABI, the device traits) is the crate `detcoll-protocol`.
#![deny(unsafe_op_in_unsafe_fn)]

mod capabilities;
mod collective;
#[cfg(feature = "conformance")]
pub mod conformance;
mod dtype;
pub mod env;
mod error;
mod host;
mod norm;
mod op;
pub mod process;
mod route;
mod route_table;
mod timeouts;
mod validate;
mod view;

pub use capabilities::{Capabilities, REDUCTION_ORDER};
pub use collective::{Collective, RouteSelect, ipc_route_for};
/// Rank rendezvous: TCP with job tokens (torchrun variables), in-process groups, `split` into
/// groups. The crate `detcoll-bootstrap`, at the bottom of detcoll's graph; its
/// `BootstrapError` converts into [`Error::Bootstrap`].
pub use detcoll_bootstrap as bootstrap;
pub use dtype::{DType, Plain, Reducible};
pub use error::{Error, display_chain};
pub use fixed_tree;
pub use host::host_identity;
pub use norm::{MAX_HIDDEN, NormCall, ResidualRmsNorm, RmsNorm, validate_norm};
pub use op::{Op, Signature};
pub use route::{IpcRoute, Route};
pub use route_table::{FUSED_NORM_OP, RouteTable, SizeRoutes};
pub use timeouts::{MAX_TIMEOUT, TIMEOUT_ENV, Timeouts};
pub use validate::{Call, LaneCall, LaneCalls, lane_name, validate, validate_many};
pub use view::{Io, RawMut, RawRef};

/// The power-of-two world sizes up to 8: the TP sizes across which a TP-invariant layer gives
/// the same bits (`fixed_tree::cross_tp_leaves`). A collective is built for any world of 1 to
/// [`MAX_WORLD_SIZE`] ranks ([`check_world_size`]), at most [`MAX_NODE_WORLD_SIZE`] of them in
/// one IPC world.
pub const SUPPORTED_WORLD_SIZES: [usize; 4] = fixed_tree::SUPPORTED_WORLD_SIZES;

/// The most ranks one collective spans: the canonical tree's limit (`fixed_tree`), reached
/// across nodes (the transport routes; the hierarchical route with up to
/// [`MAX_NODE_WORLD_SIZE`] ranks per node). Every world takes the canonical tree
/// (`fixed_tree::tree_expression`), powers of two or not.
pub const MAX_WORLD_SIZE: usize = fixed_tree::MAX_WORLD_SIZE;

/// The most ranks one IPC world (one node: the kernels' `DC_MAX_WORLD`, the CPU twin, the
/// device's fused tree) spans: up to 8 GPUs or processes, 3/5/6/7 included (six-GPU hosts,
/// TP=3 or 6 groups).
pub const MAX_NODE_WORLD_SIZE: usize = 8;

/// `Ok` for a world of 1 to [`MAX_WORLD_SIZE`] ranks, [`Error::UnsupportedWorldSize`] otherwise:
/// the check of a collective's world size (validation of every call).
pub fn check_world_size(world: usize) -> Result<(), Error> {
    if (1..=MAX_WORLD_SIZE).contains(&world) { Ok(()) } else { Err(Error::UnsupportedWorldSize { world }) }
}

/// `Ok` for an IPC world of 1 to [`MAX_NODE_WORLD_SIZE`] ranks, [`Error::UnsupportedWorldSize`]
/// otherwise: the check of the IPC engine's construction, the kernel parameters and the
/// device's fused tree.
pub fn check_node_world_size(world: usize) -> Result<(), Error> {
    if (1..=MAX_NODE_WORLD_SIZE).contains(&world) { Ok(()) } else { Err(Error::UnsupportedWorldSize { world }) }
}

/// Most lanes one `reduce_scatter_many` call may carry.
pub const MAX_LANES: usize = 16;
