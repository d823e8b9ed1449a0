//! What a rank of a world of 2 or more holds: its kernels, the layout and the constant part of
//! every launch, every rank's memory as this rank addresses it, its error record, and who owns
//! the allocations.
use crate::IpcDevice;
use collective_core::bootstrap::Bootstrap;
use detcoll_protocol::Layout;
use detcoll_protocol::params::{Fixed, RankMemory};
use std::sync::{Arc, Mutex};

/// Who owns the staging allocations a rank reads.
pub(crate) enum Owner<D: IpcDevice> {
    /// In-process ranks (threads) share every allocation; it is freed when the last rank of the
    /// group is dropped, so no rank can free memory another rank's kernel still reads, and
    /// dropping a whole group from one thread never waits.
    Group(#[allow(dead_code)] Arc<Vec<D::Staging>>),
    /// One process per rank: this rank's allocation, and its mappings of the peers'.
    Process {
        own: Mutex<Option<D::Staging>>,
        mappings: Mutex<Vec<D::PeerMapping>>,
        /// Kept so the bootstrap's connections (and a peer's view of this rank as alive) last
        /// as long as the collective (`None`: the caller of `IpcCollective::connect` keeps it).
        #[allow(dead_code)]
        boot: Option<Box<dyn Bootstrap>>,
    },
}

impl<D: IpcDevice> std::fmt::Debug for Owner<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Group(_) => f.write_str("Owner::Group"),
            Owner::Process { .. } => f.write_str("Owner::Process"),
        }
    }
}

/// The protocol state of a rank of a world of 2 or more.
#[derive(Debug)]
pub(crate) struct IpcState<D: IpcDevice> {
    pub(crate) kernels: Arc<D::Kernels>,
    pub(crate) layout: Layout,
    pub(crate) fixed: Fixed,
    /// Every rank's control block and frames, in rank order, as this rank addresses them.
    pub(crate) mems: Vec<RankMemory>,
    pub(crate) err: D::Record,
    pub(crate) owner: Owner<D>,
}
