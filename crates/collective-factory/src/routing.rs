//! Routing tables: data, not code. `op × per-rank input bytes → route`, per platform.
//!
//! The ops are the four collectives and, optionally, `all_reduce_residual_rmsnorm`: the fused
//! call's all_reduce, where the norm makes another route the faster one (without such rules it
//! takes the all_reduce's route).
//!
//! The defaults are the JSON files in `tables/` (compiled in); `DETCOLL_ROUTING_TABLE=path.json`
//! replaces the platform's table. Every rank must use the same table: its digest is part of what
//! ranks agree on at construction.
//!
//! A table is refused (`InvalidConfig`) when it is not exactly the schema (unknown fields
//! included), names an unknown op, route or platform, leaves gaps or overlaps; and, when a
//! collective is built with it ([`Routing::check_for`]), when it was written for another
//! platform or takes a route the world cannot (`local` above one rank).
use crate::Platform;
use collective_core::{Error, FUSED_NORM_OP, Op, Route, RouteTable};
use serde::{Deserialize, Serialize};

/// One rule: calls of `op` whose per-rank input is in `min_bytes..max_bytes` take `route`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub op: String,
    pub min_bytes: u64,
    /// Exclusive upper bound; `None` (JSON `null`) is unbounded. The field must be present:
    /// a rule that leaves it out is refused, as a misspelt one is, rather than read as
    /// unbounded.
    #[serde(deserialize_with = "present")]
    pub max_bytes: Option<u64>,
    pub route: String,
}

/// `max_bytes` as given, `null` included: with a `deserialize_with`, serde refuses a missing
/// field instead of reading it as `None`.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Option::<u64>::deserialize(d)
}

/// A routing table as stored in JSON (no other field is accepted: a misspelt one is an error,
/// not ignored).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoutingTable {
    /// `nvidia`, `rocm` or `cpu`.
    pub platform: String,
    /// Which machine and run the crossovers were measured on.
    pub source: String,
    pub rules: Vec<Rule>,
}

/// A checked table: for every op, rules that tile `0..∞` without gaps or overlaps. What it
/// decides is a [`RouteTable`], the policy the backends are built with: the table is the only
/// route policy (a backend looks it up, it has no thresholds of its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routing {
    table: RoutingTable,
    routes: RouteTable,
}

const NVIDIA: &str = include_str!("../tables/nvidia-default.json");
const NVIDIA_2GPU: &str = include_str!("../tables/nvidia-2gpu.json");
const ROCM: &str = include_str!("../tables/rocm-mi300x.json");
const CPU: &str = include_str!("../tables/cpu.json");

impl Routing {
    /// The variable naming a routing table file that replaces the platform's default.
    pub const ENV: &str = "DETCOLL_ROUTING_TABLE";
    /// The largest table file [`Routing::ENV`] may name: 1 MiB (the built-in tables are under
    /// 2 KiB).
    pub const MAX_FILE_BYTES: usize = 1 << 20;

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

    /// `DETCOLL_ROUTING_TABLE` if set, else the default of `platform` for `world` ranks. The
    /// table of the variable is checked as [`Routing::from_env`] checks it, and for `world`
    /// ([`Routing::check_for`]).
    pub fn from_env_for_world(platform: Platform, world: usize) -> Result<Routing, Error> {
        match Routing::from_env_var(platform)? {
            Some((r, from)) => {
                r.check_for(platform, world).map_err(|e| in_env_table(e, &from))?;
                Ok(r)
            }
            None => Ok(Routing::default_for_world(platform, world)),
        }
    }

    /// `DETCOLL_ROUTING_TABLE` if set, else the default of `platform`.
    ///
    /// The variable must name a regular file of at most [`Routing::MAX_FILE_BYTES`], read
    /// without blocking and bounded (a FIFO, `/dev/zero` or a directory is refused at once), that
    /// holds a valid table for `platform`. Every failure is `InvalidConfig` naming the variable.
    pub fn from_env(platform: Platform) -> Result<Routing, Error> {
        Ok(Routing::from_env_var(platform)?.map_or_else(|| Routing::default_for(platform), |(r, _)| r))
    }

    /// The table `DETCOLL_ROUTING_TABLE` names, checked for `platform`, with how errors name
    /// its origin (`DETCOLL_ROUTING_TABLE="path"`); `None` when the variable is unset.
    fn from_env_var(platform: Platform) -> Result<Option<(Routing, String)>, Error> {
        let Some(path) = std::env::var_os(Self::ENV) else { return Ok(None) };
        let path = std::path::Path::new(&path);
        let bytes = collective_core::env::read_regular_file(Self::ENV, path, Self::MAX_FILE_BYTES)?;
        let from = format!("environment variable {}={path:?}", Self::ENV);
        let named = |e: Error| in_env_table(e, &from);
        let json = String::from_utf8(bytes)
            .map_err(|e| named(Error::InvalidConfig { detail: format!("routing table: not UTF-8 ({e})") }))?;
        let routing = Routing::from_json(&json).map_err(named)?;
        routing.check_platform(platform).map_err(named)?;
        Ok(Some((routing, from)))
    }

    /// Parses and checks a table.
    pub fn from_json(json: &str) -> Result<Routing, Error> {
        let table: RoutingTable =
            serde_json::from_str(json).map_err(|e| Error::InvalidConfig { detail: format!("routing table: {e}") })?;
        Routing::new(table)
    }

    /// Checks `table`: a known platform, known ops and routes, and per op a tiling of `0..∞`.
    pub fn new(table: RoutingTable) -> Result<Routing, Error> {
        let bad = |detail: String| Error::InvalidConfig { detail: format!("routing table: {detail}") };
        if Platform::parse(&table.platform).is_none() {
            return Err(bad(format!("unknown platform `{}` (expected nvidia, rocm or cpu)", table.platform)));
        }
        let (mut rules, mut fused) = (Vec::with_capacity(table.rules.len()), Vec::new());
        for r in &table.rules {
            let route = Route::parse(&r.route).ok_or_else(|| bad(format!("unknown route `{}`", r.route)))?;
            if r.op == FUSED_NORM_OP {
                fused.push((r.min_bytes, r.max_bytes, route));
                continue;
            }
            let op = Op::parse(&r.op).ok_or_else(|| {
                bad(format!(
                    "unknown op `{}` (expected all_reduce, all_gather, reduce_scatter, reduce_scatter_many or \
                     {FUSED_NORM_OP})",
                    r.op
                ))
            })?;
            rules.push((op, r.min_bytes, r.max_bytes, route));
        }
        let mut routes = RouteTable::new(rules)?;
        if !fused.is_empty() {
            routes = routes.with_fused_norm(fused)?;
        }
        Ok(Routing { table, routes })
    }

    /// Whether a collective of `world` ranks on `platform` can be built with this table: the
    /// table must be `platform`'s (its `platform` field) and take only routes a world of
    /// `world` ranks has (`local` only at world 1; at world 1 every call is local, whatever
    /// the table says). `InvalidConfig` otherwise: the constructors check this before any
    /// collective work, so such a table fails construction, not every call.
    pub fn check_for(&self, platform: Platform, world: usize) -> Result<(), Error> {
        self.check_platform(platform)?;
        if world > 1 {
            for rule in &self.table.rules {
                if Route::parse(&rule.route) == Some(Route::Local) {
                    return Err(Error::InvalidConfig {
                        detail: format!(
                            "routing table: the {} rule from {} bytes takes route `local`, which only a world of \
                             1 rank has; this world has {world}",
                            rule.op, rule.min_bytes
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    fn check_platform(&self, platform: Platform) -> Result<(), Error> {
        if self.table.platform != platform.name() {
            return Err(Error::InvalidConfig {
                detail: format!(
                    "routing table: written for platform `{}`, but this collective is built on `{}`",
                    self.table.platform,
                    platform.name()
                ),
            });
        }
        Ok(())
    }

    /// The route of a call of `op` with `bytes` of per-rank input.
    pub fn route(&self, op: Op, bytes: usize) -> Route {
        self.routes.route(op, bytes)
    }

    /// The route of a fused all_reduce + residual + RMSNorm's all_reduce with `bytes` of
    /// per-rank input: the table's `all_reduce_residual_rmsnorm` rules, or its all_reduce's
    /// when it has none.
    pub fn fused_norm_route(&self, bytes: usize) -> Route {
        self.routes.fused_norm_route(bytes)
    }

    /// The policy this table decides, as the backends are built with it.
    pub fn route_table(&self) -> &RouteTable {
        &self.routes
    }

    /// Whether any rule needs the transport.
    pub fn uses_transport(&self) -> bool {
        self.routes.routes().any(|r| r.needs_transport())
    }

    /// Whether any rule needs IPC.
    pub fn uses_ipc(&self) -> bool {
        self.routes.routes().any(|r| r.needs_ipc())
    }

    /// Every route some rule takes.
    pub fn routes(&self) -> impl Iterator<Item = Route> + '_ {
        self.routes.routes()
    }

    /// The same table with every route replaced by `f(op, route)`.
    fn mapped(&self, why: &str, f: impl Fn(Op, Route) -> Route) -> Routing {
        let mut r = self.clone();
        r.routes = self.routes.mapped(&f);
        for rule in &mut r.table.rules {
            // The fused call's rules route its all_reduce.
            let op = if rule.op == FUSED_NORM_OP { Some(Op::AllReduce) } else { Op::parse(&rule.op) };
            if let (Some(op), Some(route)) = (op, Route::parse(&rule.route)) {
                rule.route = f(op, route).name().to_string();
            }
        }
        r.table.source = format!("{} ({why})", r.table.source);
        r
    }

    /// For ranks that can all do IPC but not all load the transport: transport ranges become
    /// IPC (one-shot; the hybrid becomes IPC RS+AG). Same bits, possibly slower.
    pub fn without_transport(&self) -> Routing {
        self.mapped("no transport: IPC everywhere", |_, r| r.without_transport())
    }

    /// For ranks that cannot all do IPC (several hosts): every call takes the transport.
    pub fn transport_only(&self) -> Routing {
        self.mapped("no IPC: transport everywhere", |_, _| Route::Transport)
    }

    /// This routing on one host: `hierarchical` ranges become IPC RS+AG (a single node's
    /// reduce_scatter and all_gather). Same bits.
    pub fn on_one_host(&self) -> Routing {
        if !self.routes().any(Route::needs_nodes) {
            return self.clone();
        }
        self.mapped("one host: hierarchical is IPC RS+AG", |_, r| r.on_one_host())
    }

    /// This routing across nodes whose layout allows the hierarchical route: every range that
    /// needs IPC between all ranks becomes `hierarchical`; transport ranges stay. Same bits.
    pub fn across_nodes(&self) -> Routing {
        self.mapped("several nodes: IPC inside each, the transport across", |_, r| r.across_nodes())
    }

    /// This routing across nodes where the flat transport would be the host-staged one: every
    /// range takes the hierarchical route (it moves `1/L` of the bytes through the host that
    /// the flat route would). Same bits.
    pub fn hierarchical_only(&self) -> Routing {
        self.mapped("several nodes, no native transport: hierarchical everywhere", |_, r| match r {
            Route::Local => r,
            _ => Route::Hierarchical,
        })
    }

    /// The LL push capacity a backend needs under this table: `requested` when some rule takes
    /// `ipc_push_ll`, else 0 (no LL receive slots are allocated).
    pub fn ll_capacity(&self, requested: usize) -> usize {
        if self.routes().any(|r| r == Route::IpcPushLl) { requested } else { 0 }
    }

    /// The smallest size of `op` routed to `route`, if any (reports: where RS+AG starts).
    pub fn first_bytes(&self, op: Op, route: Route) -> Option<usize> {
        self.routes.first_bytes(op, route)
    }

    /// The table as stored.
    pub fn table(&self) -> &RoutingTable {
        &self.table
    }

    /// The table, canonically serialised: what ranks exchange at construction.
    pub fn canonical_json(&self) -> String {
        serde_json::to_string(&self.table).unwrap_or_default()
    }

    /// Whether two tables as [`Routing::canonical_json`] writes them route every call alike:
    /// the same platform and rules, in any order, whatever their `source` says (what ranks
    /// compare at construction). `None` when one of them does not parse.
    pub(crate) fn same_routes(a: &str, b: &str) -> Option<bool> {
        let rules = |json: &str| -> Option<(String, Vec<Rule>)> {
            let t: RoutingTable = serde_json::from_str(json).ok()?;
            let mut rules = t.rules;
            rules.sort_by(|x, y| (&x.op, x.min_bytes, x.max_bytes).cmp(&(&y.op, y.min_bytes, y.max_bytes)));
            Some((t.platform, rules))
        };
        Some(rules(a)? == rules(b)?)
    }
}

/// `e` (an `InvalidConfig` about a table) with where the table came from in front.
fn in_env_table(e: Error, from: &str) -> Error {
    match e {
        Error::InvalidConfig { detail } if !detail.contains(from) => {
            Error::InvalidConfig { detail: format!("{from}: {detail}") }
        }
        other => other,
    }
}
