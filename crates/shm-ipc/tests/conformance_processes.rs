//! The conformance suite on the CPU twin with every rank a real process (shared memory through
//! `/dev/shm`, names exchanged over the TCP bootstrap).
use collective_core::Collective;
use collective_core::conformance::{HostRank, TestBackend, run_processes};
use shm_ipc::{ShmCollective, ShmConfig};

struct Processes;

impl TestBackend for Processes {
    type Rank = HostRank<ShmCollective>;
    fn name(&self) -> String {
        "shm-ipc (processes)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let mut config = ShmConfig::new(capacity);
        config.routes = collective_core::RouteTable::ipc_default(4096);
        config.timeouts =
            Some(collective_core::Timeouts { peer: std::time::Duration::from_secs(30), ..Default::default() });
        run_processes(
            world,
            test,
            |boot| ShmCollective::new(&*boot, config).map(|comm| HostRank { comm }).map_err(|e| e.to_string()),
            case,
            |rank| rank.comm.close().map_err(|e| e.to_string()),
        )
    }
}

collective_core::conformance_suite!(super::Processes);
