//! Construction-time configuration. Everything that shapes which NCCL calls a rank makes is
//! checked equal on every rank at construction.
use crate::comm::CommOptions;
use collective_core::Error;
use collective_core::protocol::Timeouts;
use std::time::Duration;

/// Default payload (bytes per rank, all lanes together) up to which `reduce_scatter_many`
/// packs its lanes into one all_gather. A starting point from the seeds' observation that a
/// larger rank-major all_gather can be slower than per-lane calls; `cargo xtask bench`
/// measures the crossover per platform.
pub const DEFAULT_PACK_THRESHOLD: usize = 256 << 10;

/// How a transport collective is built.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    /// Most bytes one rank contributes to one reducing call (all_reduce, reduce_scatter,
    /// reduce_scatter_many: all lanes together). Bounds the workspace, which is at most about
    /// `world * capacity` bytes. all_gather writes straight into the caller's output and is
    /// not bounded by it. Default: unbounded (the workspace grows to what calls need).
    pub capacity: usize,
    /// `reduce_scatter_many` packs its lanes into one all_gather when their payload is at most
    /// this many bytes; above, one all_gather per lane (in one NCCL group).
    pub pack_threshold: usize,
    /// `reduce_scatter` with at least this many input bytes per rank exchanges only the
    /// shards each rank reduces (grouped send/recv, `world` times less traffic) instead of a
    /// rank-ordered all_gather of whole inputs. Same bits either way. Default: never
    /// (`usize::MAX`) until measured.
    pub all_to_all_threshold: usize,
    /// `peer`: bound on any NCCL call staying in progress and the default of
    /// [`crate::TransportCollective::synchronize`]; `close`: bound on close.
    pub timeouts: Timeouts,
    /// Bound on communicator creation (every rank must join within it).
    pub init_timeout: Duration,
    /// NCCL's blocking mode: unbounded waits inside NCCL. Off by default
    /// (`DETCOLL_NCCL_BLOCKING=1` turns it on). Non-blocking calls return `ncclInProgress`
    /// and are polled to completion; measured on 2 H200s that costs tens of microseconds per
    /// call at small sizes, so latency-bound users may prefer blocking mode.
    pub blocking: bool,
    /// An explicit library file, instead of the vendor search (and `$DETCOLL_NCCL_LIBRARY`).
    pub library: Option<String>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        TransportConfig {
            capacity: usize::MAX,
            pack_threshold: DEFAULT_PACK_THRESHOLD,
            all_to_all_threshold: usize::MAX,
            timeouts: Timeouts::from_env(),
            init_timeout: Duration::from_secs(120),
            blocking: std::env::var("DETCOLL_NCCL_BLOCKING").is_ok_and(|v| v == "1"),
            library: None,
        }
    }
}

impl TransportConfig {
    /// Defaults with `capacity` bytes per rank per reducing call.
    pub fn new(capacity: usize) -> Self {
        TransportConfig { capacity, ..Self::default() }
    }

    /// Builder: the packing crossover of `reduce_scatter_many`.
    pub fn with_pack_threshold(mut self, bytes: usize) -> Self {
        self.pack_threshold = bytes;
        self
    }

    /// Builder: the all-to-all crossover of `reduce_scatter`.
    pub fn with_all_to_all_threshold(mut self, bytes: usize) -> Self {
        self.all_to_all_threshold = bytes;
        self
    }

    /// Builder: wait bounds.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    /// Builder: an explicit library file.
    pub fn with_library(mut self, path: impl Into<String>) -> Self {
        self.library = Some(path.into());
        self
    }

    pub(crate) fn check(&self) -> Result<(), Error> {
        if self.timeouts.peer.is_zero() || self.timeouts.close.is_zero() || self.init_timeout.is_zero() {
            return Err(Error::InvalidConfig { detail: "timeouts must be positive".into() });
        }
        Ok(())
    }

    /// Words every rank must share, with their names.
    pub(crate) fn agreement_words(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("capacity", self.capacity as u64),
            ("pack_threshold", self.pack_threshold as u64),
            ("all_to_all_threshold", self.all_to_all_threshold as u64),
            ("blocking", u64::from(self.blocking)),
        ]
    }

    /// The communicator options this configuration implies.
    pub fn comm_options(&self) -> CommOptions {
        CommOptions { blocking: self.blocking, timeout: self.timeouts.peer, init_timeout: self.init_timeout }
    }
}
