//! The CPU twin (`shm-ipc`) as a bench backend, routed by a table like every other backend:
//! `collective_factory::Routed` over the twin (no transport), as `collective_factory::cpu`
//! composes it.
use super::backend::{HostBackend, HostCollective};
use super::routes;
use collective_core::Collective;
use collective_core::bootstrap::Bootstrap;
use collective_core::protocol::DEFAULT_LL_CAPACITY;
use collective_factory::{NoTransport, Routed, Routing};
use shm_ipc::{ShmCollective, ShmConfig};

/// `backend` field of reports made with the CPU twin.
pub const NAME: &str = "cpu-twin";

/// The twin as the bench runs it: routed by the run's table.
pub type TwinCollective = Routed<ShmCollective, NoTransport<()>>;

impl HostCollective for TwinCollective {
    fn workspace_bytes(&self) -> usize {
        self.ipc().map_or(0, ShmCollective::workspace_bytes)
    }
}

/// The twin's configuration for `capacity` staging bytes per rank under `routing` (RS+AG
/// threshold and LL push capacity from the table, as the factory sets them; defaults otherwise).
pub fn config(capacity: usize, routing: &Routing) -> ShmConfig {
    let mut c = ShmConfig::new(capacity).with_ll_capacity(routing.ll_capacity(DEFAULT_LL_CAPACITY));
    c.rs_ag_threshold = routing.rsag_threshold();
    c
}

/// What the report records about the configuration.
pub fn config_json(c: &ShmConfig, routing: &Routing) -> serde_json::Value {
    serde_json::json!({
        "capacity_bytes": c.capacity,
        "rs_ag_threshold_bytes": c.rs_ag_threshold,
        "ll_capacity_bytes": c.ll_capacity,
        "routing": serde_json::from_str::<serde_json::Value>(&routing.canonical_json()).unwrap_or_default(),
        "timeouts_ms": super::report::timeouts_ms(c.timeouts),
    })
}

fn backend(comm: ShmCollective, routing: &Routing, c: &ShmConfig) -> anyhow::Result<HostBackend<TwinCollective>> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let routed = Routed::new(rank, world, c.capacity, routing.clone(), Some(comm), None::<NoTransport<()>>)?;
    Ok(HostBackend::new(routed, NAME).with_ll_capacity(c.ll_capacity))
}

/// One rank of a multi-process world (shared memory exchanged through `boot`). Every rank
/// must pass the same `routing` (the twin checks its configuration across ranks).
pub fn process(
    boot: &dyn Bootstrap,
    capacity: usize,
    routing: &Routing,
) -> anyhow::Result<HostBackend<TwinCollective>> {
    routes::check_no_transport(routing, "the CPU twin")?;
    let c = config(capacity, routing);
    backend(ShmCollective::new(boot, c)?, routing, &c)
}

/// A world of `world` ranks as threads of this process.
pub fn group(world: usize, capacity: usize, routing: &Routing) -> anyhow::Result<Vec<HostBackend<TwinCollective>>> {
    routes::check_no_transport(routing, "the CPU twin")?;
    let c = config(capacity, routing);
    ShmCollective::group(world, c)?.into_iter().map(|comm| backend(comm, routing, &c)).collect()
}
