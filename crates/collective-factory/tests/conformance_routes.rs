//! The conformance suite through the factory's routing, with a table that sends each op through
//! every route at some size: IPC one-shot, IPC RS+AG, transport, and the IPC RS + transport AG
//! hybrid must all give the reference's bits.
use collective_core::bootstrap::LocalBootstrap;
use collective_core::conformance::memory::{Flaw, MemoryCollective};
use collective_core::conformance::{HostRank, TestBackend, run_threads};
use collective_core::{Collective, Error};
use collective_factory::{Routed, Routing, cpu_with_transport};
use shm_ipc::ShmCollective;
use std::sync::{Arc, Mutex};

/// Every route in one table (byte ranges are per-rank input sizes).
pub const EVERY_ROUTE: &str = r#"{"platform":"cpu","source":"test: every route","rules":[
  {"op":"all_reduce","min_bytes":0,"max_bytes":4096,"route":"ipc_one_shot"},
  {"op":"all_reduce","min_bytes":4096,"max_bytes":16384,"route":"transport"},
  {"op":"all_reduce","min_bytes":16384,"max_bytes":65536,"route":"ipc_rs_ag"},
  {"op":"all_reduce","min_bytes":65536,"max_bytes":null,"route":"ipc_rs_transport_ag"},
  {"op":"all_gather","min_bytes":0,"max_bytes":1024,"route":"ipc_one_shot"},
  {"op":"all_gather","min_bytes":1024,"max_bytes":null,"route":"transport"},
  {"op":"reduce_scatter","min_bytes":0,"max_bytes":8192,"route":"ipc_one_shot"},
  {"op":"reduce_scatter","min_bytes":8192,"max_bytes":null,"route":"transport"},
  {"op":"reduce_scatter_many","min_bytes":0,"max_bytes":8192,"route":"ipc_one_shot"},
  {"op":"reduce_scatter_many","min_bytes":8192,"max_bytes":null,"route":"transport"}]}"#;

type Composed = Routed<ShmCollective, MemoryCollective>;

struct EveryRoute;

impl TestBackend for EveryRoute {
    type Rank = HostRank<Composed>;
    fn name(&self) -> String {
        "factory routing (every route, threads)".into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let boots = Mutex::new(LocalBootstrap::group(world).into_iter().map(|b| Some(Arc::new(b))).collect::<Vec<_>>());
        run_threads(world, |r| {
            let boot = boots.lock().map_err(|e| e.to_string())?[r].take().ok_or("taken")?;
            let routing = Routing::from_json(EVERY_ROUTE).map_err(|e| e.to_string())?;
            let transport_boot = boot.clone();
            let comm = cpu_with_transport(
                &*boot,
                capacity,
                Some(routing),
                Some(move || Ok::<_, Error>(MemoryCollective::new(transport_boot, capacity, Flaw::None))),
            )
            .map_err(|e| e.to_string())?;
            let mut rank = HostRank { comm };
            let result = case(&mut rank);
            rank.comm.close().map_err(|e| e.to_string())?;
            result
        })
    }
}

collective_core::conformance_suite!(super::EveryRoute);
