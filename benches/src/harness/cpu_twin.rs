//! The CPU twin (`shm-ipc`) as a bench backend, built by the factory (`collective_factory::cpu`)
//! as users build it: routed by the run's table, no transport.
use super::backend::{HostBackend, HostCollective};
use super::routes;
use collective_core::bootstrap::Bootstrap;
use collective_core::{Op, Route};
use collective_factory::{Config, CpuCollective, Routing, cpu};
use detcoll_protocol::DEFAULT_LL_CAPACITY;
use shm_ipc::{ShmCollective, ShmConfig};
use std::sync::Arc;

/// `backend` field of reports made with the CPU twin.
pub const NAME: &str = "cpu-twin";

/// The twin as the bench runs it: routed by the run's table (across virtual nodes: the twin
/// inside each, the host transport across).
pub type TwinCollective = CpuCollective;

impl HostCollective for TwinCollective {
    fn workspace_bytes(&self) -> usize {
        self.ipc().map_or(0, ShmCollective::workspace_bytes)
    }
}

/// The twin's configuration for `capacity` staging bytes per rank under `routing` (the table
/// as its route policy and the LL push capacity from it, as the factory sets them): what the
/// report records.
pub fn config(capacity: usize, routing: &Routing) -> ShmConfig {
    ShmConfig::new(capacity)
        .with_ll_capacity(routing.ll_capacity(DEFAULT_LL_CAPACITY))
        .with_routes(routing.route_table().clone())
}

/// What the report records about the configuration.
pub fn config_json(c: &ShmConfig, routing: &Routing) -> serde_json::Value {
    serde_json::json!({
        "capacity_bytes": c.capacity,
        // Where the table starts all_reduce RS+AG (`usize::MAX`: never), as reports always said.
        "rs_ag_threshold_bytes": c.routes.first_bytes(Op::AllReduce, Route::IpcReduceScatterAllGather).unwrap_or(usize::MAX),
        "ll_capacity_bytes": c.ll_capacity,
        "routing": serde_json::from_str::<serde_json::Value>(&routing.canonical_json()).unwrap_or_default(),
        "timeouts_ms": super::report::timeouts_ms(c.timeouts),
    })
}

/// The factory's configuration the bench builds the twin with, as a user would.
fn factory_config(capacity: usize, routing: &Routing) -> Config {
    Config::new().with_capacity(capacity).with_routing(routing.clone())
}

fn backend(routed: TwinCollective, c: &ShmConfig) -> HostBackend<TwinCollective> {
    HostBackend::new(routed, NAME).with_ll_capacity(c.ll_capacity)
}

/// One rank of a multi-process world (shared memory exchanged through `boot`), built by the
/// factory (`collective_factory::cpu`): every rank must pass the same `routing` (the factory's
/// agreement checks it).
pub fn process(
    boot: Arc<dyn Bootstrap>,
    capacity: usize,
    routing: &Routing,
) -> anyhow::Result<HostBackend<TwinCollective>> {
    routes::check_no_transport(routing, "the CPU twin")?;
    let routed = cpu::from_bootstrap(boot, &factory_config(capacity, routing))?;
    Ok(backend(routed, &config(capacity, routing)))
}

/// A world of `world` ranks as threads of this process, built by the factory
/// (`collective_factory::cpu::thread_group`).
pub fn group(world: usize, capacity: usize, routing: &Routing) -> anyhow::Result<Vec<HostBackend<TwinCollective>>> {
    routes::check_no_transport(routing, "the CPU twin")?;
    let c = config(capacity, routing);
    Ok(cpu::thread_group(world, &factory_config(capacity, routing))?.into_iter().map(|r| backend(r, &c)).collect())
}
