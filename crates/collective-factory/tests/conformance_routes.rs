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

/// The factory's routed collective over the CPU twin and a reference transport of the suite's
/// capacity, routed by `table`.
struct OnTable {
    name: &'static str,
    table: fn() -> String,
    /// Whether the handle must promise every call size (`max_call_bytes`).
    every_size: bool,
}

/// Every route at some size.
const EVERY_ROUTE_TABLE: OnTable =
    OnTable { name: "every route", table: || EVERY_ROUTE.to_string(), every_size: false };

/// all_reduce of every size on `route`; the other ops one-shot (no limit: the IPC routes chunk).
fn all_reduce_on(route: &str) -> String {
    format!(
        r#"{{"platform":"cpu","source":"test: all_reduce on {route}","rules":[
  {{"op":"all_reduce","min_bytes":0,"max_bytes":null,"route":"{route}"}},
  {{"op":"all_gather","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}},
  {{"op":"reduce_scatter","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}},
  {{"op":"reduce_scatter_many","min_bytes":0,"max_bytes":null,"route":"ipc_one_shot"}}]}}"#
    )
}

impl TestBackend for OnTable {
    type Rank = HostRank<Composed>;
    fn name(&self) -> String {
        format!("factory routing ({}, threads)", self.name)
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut Self::Rank) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let routing = Routing::from_json(&(self.table)()).map_err(|e| e.to_string())?;
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
        if self.every_size && world > 1 && ranks[0].comm.capabilities().max_call_bytes != usize::MAX {
            return Err(format!("{}: the handle must promise every call size", self.name));
        }
        run_owned(ranks, case, |rank| rank.comm.close().map_err(|e| e.to_string()))
    }
}

collective_core::conformance_suite!(super::EVERY_ROUTE_TABLE);

/// all_reduce on the transport route and on the IPC reduce_scatter + transport all_gather
/// hybrid at every size: a call larger than the transport takes runs as consecutive
/// all_reduces of element ranges (`chunked.rs`), with the reference's bits; the handle then
/// promises every size, so `above_capacity` runs calls of 1 to 3.25 suite capacities through
/// the chunks. Before 2026-12-05 the hybrid refused every all_reduce above the staging
/// capacity, uneven ones included (which take the chunking IPC RS+AG), and the transport route
/// every one above the transport's limit (an outside probe; the ROCm table sends all_reduce
/// from 2.1 MiB to the hybrid).
mod chunked_all_reduce {
    use super::*;
    mod transport {
        use super::*;
        const ON: OnTable =
            OnTable { name: "all_reduce on transport", table: || all_reduce_on("transport"), every_size: true };
        collective_core::conformance_suite!(@cases ON;
            all_reduce, special_values, randomized_sequence, validation, above_capacity);
    }
    mod hybrid {
        use super::*;
        const ON: OnTable = OnTable {
            name: "all_reduce on ipc_rs_transport_ag",
            table: || all_reduce_on("ipc_rs_transport_ag"),
            every_size: true,
        };
        collective_core::conformance_suite!(@cases ON;
            all_reduce, special_values, randomized_sequence, validation, above_capacity);
    }
}
