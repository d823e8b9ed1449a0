//! The conformance suite on the CPU twin as a device of the engine with every rank a real
//! process: `IpcCollective::new` over the TCP bootstrap, staging in `/dev/shm` exchanged as
//! handles, every route taken (see `detcoll_protocol::suite::ipc_suite_config`).
use collective_core::Collective;
use collective_core::conformance::{HostRank, TestBackend, run_processes};
use ipc_engine::IpcCollective;
use shm_ipc::HostDevice;
use std::time::Duration;

struct EngineProcesses;

impl TestBackend for EngineProcesses {
    type Rank = HostRank<IpcCollective<HostDevice>>;
    fn name(&self) -> String {
        "engine on the host device (processes)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let config = detcoll_protocol::suite::ipc_suite_config(capacity, Duration::from_secs(30));
        run_processes(
            world,
            test,
            |boot| {
                IpcCollective::new(boot, HostDevice::process(), &config)
                    .map(|comm| HostRank { comm })
                    .map_err(|e| e.to_string())
            },
            case,
            |rank| rank.comm.close().map_err(|e| e.to_string()),
        )
    }
}

collective_core::conformance_suite!(super::EngineProcesses);
