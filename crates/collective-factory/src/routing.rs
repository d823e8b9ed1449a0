//! Routing tables: data, not code. `op × per-rank input bytes → route`, per platform.
//!
//! The defaults are the JSON files in `tables/` (compiled in); `DETCOLL_ROUTING_TABLE=path.json`
//! replaces the platform's table. Every rank must use the same table: its digest is part of what
//! ranks agree on at construction.
use crate::Platform;
use collective_core::{Error, Op, Route};
use serde::{Deserialize, Serialize};

/// One rule: calls of `op` whose per-rank input is in `min_bytes..max_bytes` take `route`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub op: String,
    pub min_bytes: u64,
    /// Exclusive upper bound; `None` is unbounded.
    pub max_bytes: Option<u64>,
    pub route: String,
}

/// A routing table as stored in JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoutingTable {
    /// `nvidia`, `rocm` or `cpu`.
    pub platform: String,
    /// Which machine and run the crossovers were measured on.
    pub source: String,
    pub rules: Vec<Rule>,
}

/// A checked table: for every op, rules that tile `0..∞` without gaps or overlaps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    table: RoutingTable,
    /// Per op (in `Op::ALL` order): sorted `(min, max, route)`.
    ranges: Vec<Vec<(u64, Option<u64>, Route)>>,
}

const NVIDIA: &str = include_str!("../tables/nvidia-default.json");
const NVIDIA_2GPU: &str = include_str!("../tables/nvidia-2gpu.json");
const ROCM: &str = include_str!("../tables/rocm-mi300x.json");
const CPU: &str = include_str!("../tables/cpu.json");

impl Routing {
    /// The compiled-in default of `platform`.
    pub fn default_for(platform: Platform) -> Routing {
        let json = match platform {
            Platform::Nvidia => NVIDIA,
            Platform::Rocm => ROCM,
            Platform::Cpu => CPU,
        };
        // The defaults are checked by this crate's tests.
        Routing::from_json(json).unwrap_or_else(|e| panic!("built-in {platform:?} routing table is invalid: {e}"))
    }

    /// The compiled-in default of `platform` for a world of `world` ranks: crossovers depend on
    /// the world size (at world 2 IPC RS+AG moves the same bytes as one-shot and only adds a
    /// phase), so NVIDIA worlds of 1 or 2 take the table measured on 2 H200s.
    pub fn default_for_world(platform: Platform, world: usize) -> Routing {
        match (platform, world) {
            (Platform::Nvidia, 1 | 2) => Routing::from_json(NVIDIA_2GPU)
                .unwrap_or_else(|e| panic!("built-in 2-GPU NVIDIA routing table is invalid: {e}")),
            _ => Routing::default_for(platform),
        }
    }

    /// `DETCOLL_ROUTING_TABLE` if set, else the default of `platform` for `world` ranks.
    pub fn from_env_for_world(platform: Platform, world: usize) -> Result<Routing, Error> {
        match std::env::var_os("DETCOLL_ROUTING_TABLE") {
            Some(_) => Routing::from_env(platform),
            None => Ok(Routing::default_for_world(platform, world)),
        }
    }

    /// `DETCOLL_ROUTING_TABLE` if set, else the default of `platform`.
    pub fn from_env(platform: Platform) -> Result<Routing, Error> {
        match std::env::var_os("DETCOLL_ROUTING_TABLE") {
            Some(path) => {
                let json = std::fs::read_to_string(&path).map_err(|e| Error::InvalidConfig {
                    detail: format!("DETCOLL_ROUTING_TABLE={}: {e}", path.to_string_lossy()),
                })?;
                Routing::from_json(&json)
            }
            None => Ok(Routing::default_for(platform)),
        }
    }

    /// Parses and checks a table.
    pub fn from_json(json: &str) -> Result<Routing, Error> {
        let table: RoutingTable =
            serde_json::from_str(json).map_err(|e| Error::InvalidConfig { detail: format!("routing table: {e}") })?;
        Routing::new(table)
    }

    /// Checks `table`: known ops and routes, and per op a tiling of `0..∞`.
    pub fn new(table: RoutingTable) -> Result<Routing, Error> {
        let bad = |detail: String| Error::InvalidConfig { detail: format!("routing table: {detail}") };
        let mut ranges = vec![Vec::new(); Op::ALL.len()];
        for r in &table.rules {
            let op = Op::parse(&r.op).ok_or_else(|| bad(format!("unknown op `{}`", r.op)))?;
            let route = Route::parse(&r.route).ok_or_else(|| bad(format!("unknown route `{}`", r.route)))?;
            if op == Op::AllGather && route.needs_ipc() && route.needs_transport() {
                return Err(bad(format!("all_gather reduces nothing, so it cannot take `{}`", r.route)));
            }
            if r.max_bytes.is_some_and(|m| m <= r.min_bytes) {
                return Err(bad(format!("{} rule {}..{:?} is empty", r.op, r.min_bytes, r.max_bytes)));
            }
            ranges[op_index(op)].push((r.min_bytes, r.max_bytes, route));
        }
        for (op, rs) in Op::ALL.iter().zip(ranges.iter_mut()) {
            rs.sort_by_key(|r| r.0);
            let mut next = Some(0u64);
            for &(min, max, _) in rs.iter() {
                if Some(min) != next {
                    return Err(bad(format!(
                        "{op} rules leave a gap or overlap at {min} bytes (expected a rule from {next:?})"
                    )));
                }
                next = max;
            }
            if next.is_some() {
                return Err(bad(format!("{op} has no rule from {next:?} bytes upwards")));
            }
        }
        Ok(Routing { table, ranges })
    }

    /// The route of a call of `op` with `bytes` of per-rank input.
    pub fn route(&self, op: Op, bytes: usize) -> Route {
        let b = bytes as u64;
        self.ranges[op_index(op)]
            .iter()
            .find(|(min, max, _)| b >= *min && max.is_none_or(|m| b < m))
            .map_or(Route::IpcOneShot, |r| r.2)
    }

    /// Whether any rule needs the transport.
    pub fn uses_transport(&self) -> bool {
        self.ranges.iter().flatten().any(|r| r.2.needs_transport())
    }

    /// Whether any rule needs IPC.
    pub fn uses_ipc(&self) -> bool {
        self.ranges.iter().flatten().any(|r| r.2.needs_ipc())
    }

    /// Every route some rule takes.
    pub fn routes(&self) -> impl Iterator<Item = Route> + '_ {
        self.ranges.iter().flatten().map(|r| r.2)
    }

    /// The same table with every route replaced by `f(op, route)`.
    fn mapped(&self, why: &str, f: impl Fn(Op, Route) -> Route) -> Routing {
        let mut r = self.clone();
        for (op, rs) in Op::ALL.iter().zip(r.ranges.iter_mut()) {
            for x in rs.iter_mut() {
                x.2 = f(*op, x.2);
            }
        }
        for rule in &mut r.table.rules {
            if let (Some(op), Some(route)) = (Op::parse(&rule.op), Route::parse(&rule.route)) {
                rule.route = f(op, route).name().to_string();
            }
        }
        r.table.source = format!("{} ({why})", r.table.source);
        r
    }

    /// For ranks that can all do IPC but not all load the transport: transport ranges become
    /// IPC (one-shot; the hybrid becomes IPC RS+AG). Same bits, possibly slower.
    pub fn without_transport(&self) -> Routing {
        self.mapped("no transport: IPC everywhere", |_, r| match r {
            Route::Transport => Route::IpcOneShot,
            Route::IpcReduceScatterTransportAllGather => Route::IpcReduceScatterAllGather,
            other => other,
        })
    }

    /// For ranks that cannot all do IPC (several hosts): every call takes the transport.
    pub fn transport_only(&self) -> Routing {
        self.mapped("no IPC: transport everywhere", |_, _| Route::Transport)
    }

    /// The LL push capacity a backend needs under this table: `requested` when some rule takes
    /// `ipc_push_ll`, else 0 (no LL receive slots are allocated).
    pub fn ll_capacity(&self, requested: usize) -> usize {
        if self.routes().any(|r| r == Route::IpcPushLl) { requested } else { 0 }
    }

    /// The smallest all_reduce size routed to `route`, if any (IPC backends take their RS+AG
    /// threshold from it).
    pub fn first_bytes(&self, op: Op, route: Route) -> Option<usize> {
        self.ranges[op_index(op)].iter().filter(|r| r.2 == route).map(|r| r.0 as usize).min()
    }

    /// The table as stored.
    pub fn table(&self) -> &RoutingTable {
        &self.table
    }

    /// The table, canonically serialised: what ranks compare at construction.
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(&self.table).unwrap_or_default()
    }
}

fn op_index(op: Op) -> usize {
    Op::ALL.iter().position(|o| *o == op).unwrap_or(0)
}
