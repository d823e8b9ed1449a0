//! The conformance suite on the CPU twin with ranks as threads of one process.
use collective_core::conformance::{HostRank, TestBackend, run_threads};
use shm_ipc::{ShmCollective, ShmConfig};
use std::sync::Mutex;

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
        let mut config = ShmConfig::new(capacity);
        config.rs_ag_threshold = 4096;
        config.timeouts.peer = std::time::Duration::from_secs(20);
        let comms = ShmCollective::group(world, config).map_err(|e| e.to_string())?;
        let slots = Mutex::new(comms.into_iter().map(Some).collect::<Vec<_>>());
        run_threads(world, |r| {
            let comm = slots.lock().map_err(|e| e.to_string())?[r].take().ok_or("taken")?;
            let mut rank = HostRank { comm };
            let result = case(&mut rank);
            use collective_core::Collective;
            rank.comm.close().map_err(|e| e.to_string())?;
            result
        })
    }
}

collective_core::conformance_suite!(super::Threads);
