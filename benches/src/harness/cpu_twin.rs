//! The CPU twin (`shm-ipc`) as a bench backend.
use super::backend::{HostBackend, HostCollective};
use collective_core::bootstrap::Bootstrap;
use shm_ipc::{ShmCollective, ShmConfig};

/// `backend` field of reports made with the CPU twin.
pub const NAME: &str = "cpu-twin";

impl HostCollective for ShmCollective {
    fn workspace_bytes(&self) -> usize {
        ShmCollective::workspace_bytes(self)
    }
}

/// The twin's configuration for `capacity` staging bytes per rank (defaults otherwise).
pub fn config(capacity: usize) -> ShmConfig {
    ShmConfig::new(capacity)
}

/// What the report records about the configuration.
pub fn config_json(c: &ShmConfig) -> serde_json::Value {
    serde_json::json!({
        "capacity_bytes": c.capacity,
        "rs_ag_threshold_bytes": c.rs_ag_threshold,
        "timeouts_ms": super::report::timeouts_ms(c.timeouts),
    })
}

/// One rank of a multi-process world (shared memory exchanged through `boot`).
pub fn process(boot: &dyn Bootstrap, capacity: usize) -> anyhow::Result<HostBackend<ShmCollective>> {
    let comm = ShmCollective::new(boot, config(capacity))?;
    Ok(HostBackend::new(comm, NAME))
}

/// A world of `world` ranks as threads of this process.
pub fn group(world: usize, capacity: usize) -> anyhow::Result<Vec<HostBackend<ShmCollective>>> {
    Ok(ShmCollective::group(world, config(capacity))?.into_iter().map(|c| HostBackend::new(c, NAME)).collect())
}
