//! The conformance suite on the CPU twin with ranks as threads of one process.
use collective_core::Collective;
use collective_core::conformance::{HostRank, TestBackend, run_owned};
use shm_ipc::{ShmCollective, ShmConfig};

/// Worlds of [`ShmCollective::group`]; a small RS+AG threshold so both all_reduce routes run.
struct Threads;

impl TestBackend for Threads {
    type Rank = HostRank<ShmCollective>;
    fn name(&self) -> String {
        "shm-ipc (threads)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let mut config = ShmConfig::new(capacity).with_timeouts(collective_core::Timeouts {
            peer: std::time::Duration::from_secs(20),
            ..Default::default()
        });
        config.routes = collective_core::RouteTable::ipc_default(4096);
        let comms = ShmCollective::group(world, config).map_err(|e| e.to_string())?;
        let ranks = comms.into_iter().map(|comm| HostRank { comm }).collect();
        run_owned(ranks, case, |rank| rank.comm.close().map_err(|e| e.to_string()))
    }
}

collective_core::conformance_suite!(super::Threads);
