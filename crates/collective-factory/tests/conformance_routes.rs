//! The conformance suite through the factory's routing, with a table that sends each op through
//! every route at some size: IPC LL push, IPC one-shot, IPC bulk push, IPC RS+AG, transport,
//! and the IPC RS + transport AG hybrid must all give the reference's bits. (reduce_scatter routed to the hybrid takes its IPC
//! half alone; that range is here so a reduce_scatter never runs the hybrid all_reduce again.)
#![cfg(feature = "cpu")]
use collective_core::bootstrap::LocalBootstrap;
use collective_core::conformance::memory::{Flaw, MemoryCollective};
use collective_core::conformance::{HostRank, TestBackend, run_owned};
use collective_core::{Collective, Error};
use collective_factory::{Config, Routed, Routing, cpu};
use shm_ipc::ShmCollective;
use std::sync::Arc;

/// Every route in one table (byte ranges are per-rank input sizes).
pub const EVERY_ROUTE: &str = r#"{"platform":"cpu","source":"test: every route","rules":[
  {"op":"all_reduce","min_bytes":0,"max_bytes":2048,"route":"ipc_push_ll"},
  {"op":"all_reduce","min_bytes":2048,"max_bytes":4096,"route":"ipc_one_shot"},
  {"op":"all_reduce","min_bytes":4096,"max_bytes":16384,"route":"transport"},
  {"op":"all_reduce","min_bytes":16384,"max_bytes":32768,"route":"ipc_push"},
  {"op":"all_reduce","min_bytes":32768,"max_bytes":65536,"route":"ipc_rs_ag"},
  {"op":"all_reduce","min_bytes":65536,"max_bytes":null,"route":"ipc_rs_transport_ag"},
  {"op":"all_gather","min_bytes":0,"max_bytes":512,"route":"ipc_push_ll"},
  {"op":"all_gather","min_bytes":512,"max_bytes":1024,"route":"ipc_one_shot"},
  {"op":"all_gather","min_bytes":1024,"max_bytes":4096,"route":"ipc_push"},
  {"op":"all_gather","min_bytes":4096,"max_bytes":null,"route":"transport"},
  {"op":"reduce_scatter","min_bytes":0,"max_bytes":4096,"route":"ipc_push_ll"},
  {"op":"reduce_scatter","min_bytes":4096,"max_bytes":8192,"route":"ipc_one_shot"},
  {"op":"reduce_scatter","min_bytes":8192,"max_bytes":16384,"route":"ipc_push"},
  {"op":"reduce_scatter","min_bytes":16384,"max_bytes":65536,"route":"transport"},
  {"op":"reduce_scatter","min_bytes":65536,"max_bytes":null,"route":"ipc_rs_transport_ag"},
  {"op":"reduce_scatter_many","min_bytes":0,"max_bytes":4096,"route":"ipc_push_ll"},
  {"op":"reduce_scatter_many","min_bytes":4096,"max_bytes":8192,"route":"ipc_one_shot"},
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
        let routing = Routing::from_json(EVERY_ROUTE).map_err(|e| e.to_string())?;
        let boots: Vec<Arc<LocalBootstrap>> = LocalBootstrap::group(world).into_iter().map(Arc::new).collect();
        // Construction is collective: every rank builds on its own thread.
        let built: Vec<Result<Composed, Error>> = std::thread::scope(|s| {
            let hs: Vec<_> = boots
                .iter()
                .map(|boot| {
                    let routing = routing.clone();
                    s.spawn(move || {
                        let tb = boot.clone();
                        let transport = move || Ok::<_, Error>(MemoryCollective::new(tb, capacity, Flaw::None));
                        cpu::with_transport(
                            &**boot,
                            &Config::new().with_capacity(capacity).with_routing(routing),
                            Some(transport),
                        )
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().expect("construction panicked")).collect()
        });
        let ranks = built
            .into_iter()
            .map(|c| c.map(|comm| HostRank { comm }))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        run_owned(ranks, case, |rank| rank.comm.close().map_err(|e| e.to_string()))
    }
}

collective_core::conformance_suite!(super::EveryRoute);
