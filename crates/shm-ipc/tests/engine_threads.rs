//! The conformance suite on the CPU twin as a device of the engine: `IpcCollective<HostDevice>`
//! with ranks as threads of one process, every route taken (LL push up to 8 KiB per rank,
//! one-shot above, RS+AG all_reduce from 32 KiB, bulk push from 64 KiB; calls above the staging
//! capacity in chunks), the protocol run by the host executor of the kernel ABI.
use collective_core::Collective;
use collective_core::conformance::{HostRank, TestBackend, run_owned};
use collective_core::protocol::{IpcConfig, Timeouts};
use ipc_engine::IpcCollective;
use shm_ipc::HostDevice;

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
        let mut config = IpcConfig::new(capacity)
            .with_rsag_threshold(32 << 10)
            .with_push_threshold(8 << 10)
            .with_bulk_threshold(64 << 10);
        config.timeouts = Some(Timeouts { peer: std::time::Duration::from_secs(20), ..Default::default() });
        let devices: Vec<HostDevice> = (0..world).map(|_| HostDevice::threads()).collect();
        let comms = IpcCollective::group(&devices, &config).map_err(|e| e.to_string())?;
        let ranks = comms.into_iter().map(|comm| HostRank { comm }).collect();
        run_owned(ranks, case, |rank| rank.comm.close().map_err(|e| e.to_string()))
    }
}

collective_core::conformance_suite!(super::EngineThreads);
