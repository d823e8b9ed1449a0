//! A transport over any rank rendezvous: the CPU ranks' transport across hosts.
//!
//! [`HostTransport`] implements [`collective_core::Collective`] on host memory (`Stream = ()`)
//! over a [`collective_core::bootstrap::Bootstrap`]: every call is one `all_gather_bytes` of
//! this rank's contribution (prefixed by the call's signature, so ranks that make different
//! calls get [`collective_core::Error::SignatureMismatch`], never mixed data), then the
//! reductions of `fixed-tree` — the canonical tree, the oracle itself — in the element's dtype.
//! The bootstrap bounds every exchange and names a dead or absent peer, so a peer that dies or
//! never calls is a typed error within the bootstrap's exchange timeout; a failed call poisons
//! the transport.
//!
//! It plays the part NCCL plays for GPUs (and Gloo for PyTorch's CPU tensors) in the flat
//! transport route and in the hierarchical route's cross-node step. It is not fast: the
//! rendezvous is a star through rank 0, meant for CPU runs, virtual nodes in CI and control-
//! sized data, not for bandwidth.
//!
//! [`StagedTransport`] runs it on device memory of any `detcoll_protocol::Device`: each call
//! copies its device bytes to the host, runs the host transport and copies the result back.
//! The transport of ranks that share a GPU (NCCL/RCCL refuse two ranks on one GPU).
#![deny(unsafe_op_in_unsafe_fn)]

mod staged;
mod transport;
mod tree;

pub use staged::StagedTransport;
pub use transport::HostTransport;
