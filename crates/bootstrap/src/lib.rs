//! Rank rendezvous ("bootstrap"): the out-of-band channel collectives use at construction time
//! (to exchange IPC handles, NCCL unique ids, host identity, capabilities) and to notice dead
//! peers.
//!
//! This crate is the bottom of detcoll's graph: it depends on nothing of detcoll. Users reach
//! it as `collective_core::bootstrap` or `collective_factory::bootstrap` (re-exports of this
//! crate); collective-core converts a [`BootstrapError`] into its `Error` (`Error::Bootstrap`,
//! with this error's `source()` chain).
//!
//! Three ways in:
//!
//! * [`TcpBootstrap`] — one process per rank. Rank 0 serves a small TCP rendezvous at
//!   `MASTER_ADDR:MASTER_PORT`; the others connect to it. [`TcpBootstrap::from_env`] reads the
//!   torchrun variables (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `MASTER_ADDR`,
//!   `MASTER_PORT`), so processes started by `torchrun`, mpirun wrappers or `detcoll-run` join.
//! * [`LocalBootstrap`] — one thread per rank inside one process.
//! * Your own: implement [`Bootstrap`] over the process group your engine already has.
//!
//! The TCP rendezvous admits only ranks of the same job: they prove a job token
//! (`DETCOLL_JOB_TOKEN`, or one derived from the torchrun/launcher variables; see
//! [`env`](mod@crate::env)) without sending it, and rank 0 silently drops every other connection.
//!
//! Groups inside a job (tensor-, data-parallel...): [`split`] makes one bootstrap per group from
//! any bootstrap, like `ncclCommSplit`; groups then run independently of each other.
//!
//! Every operation is bounded in time, by a timeout of at most [`MAX_BOOTSTRAP_TIMEOUT`] (one
//! day). When a peer does not contribute, or dies, every rank
//! gets an error that names the culprit ([`BootstrapError::culprit`]) instead of hanging.
//! After a failed exchange a bootstrap is poisoned: later calls return
//! [`BootstrapError::Closed`] with the first failure as the reason.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The README's example, compiled as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;

mod deadline;
pub mod env;
mod fds;
mod host;
mod local;
mod split;
mod tcp;
mod token;
mod wire;

pub use deadline::MAX_BOOTSTRAP_TIMEOUT;
pub use env::TorchrunEnv;
pub use fds::reserve_descriptors;
pub use host::{HOST_ID_ENV, host_identity, machine_identity};
pub use local::LocalBootstrap;
pub use split::{GroupTransport, SplitEntry, SplitOptions, SubBootstrap, group_members, split, split_with};
pub use tcp::{HANDSHAKE_TIMEOUT, LATE_RANKS_GRACE, MAX_PENDING_HANDSHAKES, TcpBootstrap, TcpConfig};
pub use token::MAX_TOKEN_LEN;

/// Default time a non-zero rank keeps retrying to reach rank 0 (and rank 0 waits for everyone
/// to connect): 60 s. Overridden by `DETCOLL_BOOTSTRAP_TIMEOUT_MS`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default time one exchange waits for every rank to contribute: 30 s. Overridden by
/// `DETCOLL_BOOTSTRAP_TIMEOUT_MS`.
pub const DEFAULT_EXCHANGE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default per-exchange timeout of [`LocalBootstrap::group`]: 60 s (threads of one process
/// may start with a large skew, e.g. while each creates its device context).
pub const DEFAULT_LOCAL_TIMEOUT: Duration = Duration::from_secs(60);

/// Rank rendezvous: the out-of-band channel collectives use at construction (exchange IPC
/// handles, NCCL ids, host identity) and to notice dead peers.
pub trait Bootstrap: Send + Sync + fmt::Debug {
    /// This rank, in `0..world_size()`.
    fn rank(&self) -> usize;
    /// Number of ranks in the group.
    fn world_size(&self) -> usize;
    /// Ranks on this host and this rank's index among them (torchrun
    /// `LOCAL_RANK`/`LOCAL_WORLD_SIZE`; in-process: = rank/world).
    fn local_rank(&self) -> usize;
    /// Number of ranks on this host (see [`Bootstrap::local_rank`]).
    fn local_world_size(&self) -> usize;
    /// Collective: every rank passes its bytes (lengths may differ); returns every rank's
    /// bytes in rank order. Fails with a [`BootstrapError`] naming the absent/dead rank when a
    /// peer does not contribute within the timeout.
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError>;
    /// Collective barrier (default: `all_gather_bytes` of nothing).
    fn barrier(&self) -> Result<(), BootstrapError> {
        self.all_gather_bytes(&[]).map(|_| ())
    }
    /// `(connect, exchange)` timeouts of this bootstrap, if it has them: [`split`] gives its
    /// groups the same bounds. Default `None` ([`DEFAULT_CONNECT_TIMEOUT`],
    /// [`DEFAULT_EXCHANGE_TIMEOUT`]).
    fn timeouts(&self) -> Option<(Duration, Duration)> {
        None
    }
    /// A host name or IP at which the other ranks of the job can reach a TCP listener of this
    /// process, if known. [`split`] needs it only for a group that spans hosts: the group's
    /// first member listens there. [`TcpBootstrap`] knows it (rank 0: `MASTER_ADDR`; the others:
    /// their address on the connection to rank 0). Default `None`.
    fn reachable_host(&self) -> Option<String> {
        None
    }
}

impl<B: Bootstrap + ?Sized> Bootstrap for Arc<B> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn local_rank(&self) -> usize {
        (**self).local_rank()
    }
    fn local_world_size(&self) -> usize {
        (**self).local_world_size()
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        (**self).all_gather_bytes(mine)
    }
    fn barrier(&self) -> Result<(), BootstrapError> {
        (**self).barrier()
    }
    fn timeouts(&self) -> Option<(Duration, Duration)> {
        (**self).timeouts()
    }
    fn reachable_host(&self) -> Option<String> {
        (**self).reachable_host()
    }
}

impl<B: Bootstrap + ?Sized> Bootstrap for Box<B> {
    fn rank(&self) -> usize {
        (**self).rank()
    }
    fn world_size(&self) -> usize {
        (**self).world_size()
    }
    fn local_rank(&self) -> usize {
        (**self).local_rank()
    }
    fn local_world_size(&self) -> usize {
        (**self).local_world_size()
    }
    fn all_gather_bytes(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>, BootstrapError> {
        (**self).all_gather_bytes(mine)
    }
    fn barrier(&self) -> Result<(), BootstrapError> {
        (**self).barrier()
    }
    fn timeouts(&self) -> Option<(Duration, Duration)> {
        (**self).timeouts()
    }
    fn reachable_host(&self) -> Option<String> {
        (**self).reachable_host()
    }
}

/// Why a rendezvous failed. Errors caused by one peer name it (see [`BootstrapError::culprit`]);
/// in a TCP group rank 0 forwards its diagnosis to every other rank, so all ranks report the
/// same culprit.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// A peer did not do `what` in time.
    #[error("bootstrap: rank {rank} did not {what} within {waited:?}")]
    PeerTimeout {
        /// The rank that did not show up.
        rank: usize,
        /// How long we waited.
        waited: Duration,
        /// What it did not do, e.g. "contribute to all_gather_bytes".
        what: &'static str,
    },
    /// Rank 0's rendezvous ended at its connect timeout with these ranks not connected (every
    /// one of them, in rank order; [`BootstrapError::culprit`] is the first).
    #[error(
        "bootstrap: rank(s) {ranks:?} did not connect to rank 0's rendezvous within {waited:?} (not \
         started, wrong MASTER_ADDR/MASTER_PORT, or a different DETCOLL_JOB_TOKEN?)"
    )]
    MissingRanks {
        /// The ranks that did not connect, ascending.
        ranks: Vec<usize>,
        /// How long rank 0 waited.
        waited: Duration,
    },
    /// A peer's connection closed or reset, or an in-process peer was dropped.
    #[error("bootstrap: rank {rank} is gone: {detail}")]
    PeerGone {
        /// The rank that went away.
        rank: usize,
        /// What was observed.
        detail: String,
    },
    /// A peer is at a different exchange than the rest of the group (a rank skipped or repeated
    /// a collective call).
    #[error(
        "bootstrap: rank {rank} sent exchange #{got} while the group is at exchange #{expected} \
         (ranks made different numbers of collective bootstrap calls)"
    )]
    SequenceMismatch {
        /// The out-of-step rank.
        rank: usize,
        /// The exchange number the group is at.
        expected: u64,
        /// The exchange number the rank sent.
        got: u64,
    },
    /// Ranks were started with different world sizes.
    #[error("bootstrap: rank {rank} has world size {theirs}, but this rank has world size {ours}")]
    WorldSizeMismatch {
        /// The rank whose world size differs (seen from rank 0: the client; seen from a client:
        /// rank 0).
        rank: usize,
        /// This side's world size.
        ours: usize,
        /// The other side's world size.
        theirs: usize,
    },
    /// Two processes claim the same rank.
    #[error("bootstrap: two processes claim rank {rank}")]
    DuplicateRank {
        /// The rank claimed twice.
        rank: usize,
    },
    /// A rank outside `0..world`.
    #[error("bootstrap: rank {rank} is out of range for world size {world}")]
    RankOutOfRange {
        /// The offending rank.
        rank: usize,
        /// The world size.
        world: usize,
    },
    /// A required launcher variable is not set.
    #[error(
        "bootstrap: environment variable {var} is not set (start ranks with torchrun, detcoll-run \
         or set RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT)"
    )]
    MissingEnv {
        /// The variable.
        var: &'static str,
    },
    /// A launcher variable has an invalid value.
    #[error("bootstrap: environment variable {var}={value:?} is invalid: expected {expected}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What was expected.
        expected: &'static str,
    },
    /// A [`TcpConfig`] that cannot work (world size 0, port 0, local rank out of range...).
    #[error("bootstrap: invalid configuration: {detail}")]
    InvalidConfig {
        /// What is wrong.
        detail: String,
    },
    /// A non-zero rank could not reach rank 0's rendezvous in time.
    #[error(
        "bootstrap: could not connect to rank 0's rendezvous at {addr} within {waited:?} \
         (is rank 0 running, and MASTER_ADDR/MASTER_PORT right?): {last_error}"
    )]
    ConnectTimeout {
        /// The address tried.
        addr: String,
        /// How long we retried.
        waited: Duration,
        /// The last connection error.
        #[source]
        last_error: std::io::Error,
    },
    /// An I/O error, with context (which address, which operation).
    #[error("bootstrap: {context}: {source}")]
    Io {
        /// What we were doing, including the address.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A peer sent something that is not the detcoll bootstrap protocol.
    #[error("bootstrap protocol error: {0}")]
    Protocol(String),
    /// [`split`]: rank `rank` (of the parent) could not take part in forming its group (its
    /// host identity is invalid, or, as the group's first member, it could not listen).
    #[error("bootstrap split: rank {rank} could not set up its group: {detail}")]
    GroupSetup {
        /// The parent rank at fault.
        rank: usize,
        /// What went wrong.
        detail: String,
    },
    /// The bootstrap is unusable because an earlier exchange failed.
    #[error("bootstrap is closed after an earlier failure: {reason}")]
    Closed {
        /// The first failure.
        reason: String,
    },
}

impl BootstrapError {
    /// The rank this error blames, if any.
    pub fn culprit(&self) -> Option<usize> {
        match self {
            Self::PeerTimeout { rank, .. }
            | Self::PeerGone { rank, .. }
            | Self::SequenceMismatch { rank, .. }
            | Self::WorldSizeMismatch { rank, .. }
            | Self::DuplicateRank { rank }
            | Self::RankOutOfRange { rank, .. }
            | Self::GroupSetup { rank, .. } => Some(*rank),
            Self::MissingRanks { ranks, .. } => ranks.first().copied(),
            Self::ConnectTimeout { .. } => Some(0),
            _ => None,
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io { context: context.into(), source }
    }

    /// The error with every rank it names renamed by `rank`: for a group's error seen from a
    /// larger world (a [`split`] group inside a job), `rank` maps a rank of the group to the
    /// job's, so the message names the process the user started. Ranks that are not the
    /// group's (a world size, [`BootstrapError::RankOutOfRange`]'s claimed rank, a
    /// [`BootstrapError::GroupSetup`]'s parent rank) and the text of earlier failures
    /// ([`BootstrapError::Closed`]) are left as they are.
    pub fn map_ranks(self, rank: impl Fn(usize) -> usize) -> Self {
        match self {
            Self::PeerTimeout { rank: r, waited, what } => Self::PeerTimeout { rank: rank(r), waited, what },
            Self::PeerGone { rank: r, detail } => Self::PeerGone { rank: rank(r), detail },
            Self::SequenceMismatch { rank: r, expected, got } => {
                Self::SequenceMismatch { rank: rank(r), expected, got }
            }
            Self::WorldSizeMismatch { rank: r, ours, theirs } => {
                Self::WorldSizeMismatch { rank: rank(r), ours, theirs }
            }
            Self::DuplicateRank { rank: r } => Self::DuplicateRank { rank: rank(r) },
            Self::MissingRanks { ranks, waited } => {
                Self::MissingRanks { ranks: ranks.into_iter().map(&rank).collect(), waited }
            }
            other => other,
        }
    }
}

/// Checks the rank layout shared by every bootstrap.
pub(crate) fn validate_layout(
    rank: usize,
    world_size: usize,
    local_rank: usize,
    local_world_size: usize,
) -> Result<(), BootstrapError> {
    if world_size == 0 {
        return Err(BootstrapError::InvalidConfig { detail: "world size is 0".into() });
    }
    if rank >= world_size {
        return Err(BootstrapError::RankOutOfRange { rank, world: world_size });
    }
    if local_world_size == 0 || local_world_size > world_size {
        return Err(BootstrapError::InvalidConfig {
            detail: format!("local world size {local_world_size} is not in 1..={world_size}"),
        });
    }
    if local_rank >= local_world_size {
        return Err(BootstrapError::InvalidConfig {
            detail: format!("local rank {local_rank} is out of range for local world size {local_world_size}"),
        });
    }
    Ok(())
}
