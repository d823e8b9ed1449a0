//! The conformance suite on the CPU twin as a device of the engine: `IpcCollective<HostDevice>`
//! with ranks as threads of one process, every route taken (see `detcoll_protocol::suite::ipc_suite_config`), the
//! protocol run by the host executor of the kernel ABI.
use collective_core::Collective;
use collective_core::conformance::{HostRank, TestBackend, run_owned};
use ipc_engine::IpcCollective;
use shm_ipc::HostDevice;
use std::time::Duration;

struct EngineThreads;

impl TestBackend for EngineThreads {
    type Rank = HostRank<IpcCollective<HostDevice>>;
    fn name(&self) -> String {
        "engine on the host device (threads)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let config = detcoll_protocol::suite::ipc_suite_config(capacity, Duration::from_secs(20));
        let devices: Vec<HostDevice> = (0..world).map(|_| HostDevice::threads()).collect();
        let comms = IpcCollective::group(&devices, &config).map_err(|e| e.to_string())?;
        let ranks = comms.into_iter().map(|comm| HostRank { comm }).collect();
        run_owned(ranks, case, |rank| rank.comm.close().map_err(|e| e.to_string()))
    }
}

collective_core::conformance_suite!(super::EngineThreads);
