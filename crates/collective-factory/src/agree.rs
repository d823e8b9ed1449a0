//! Collective agreement: every rank decides the same from everyone's facts.
use crate::nodes::NodeLayout;
use crate::{Platform, Routing};
use collective_core::bootstrap::Bootstrap;
use collective_core::{Error, Route};
use serde::{Deserialize, Serialize};

/// What one rank knows about itself, exchanged at construction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Facts {
    /// [`Platform::name`].
    pub platform: String,
    /// [`collective_core::host_identity`]: hostname and boot id.
    pub host: String,
    /// Whether this rank can do same-host IPC (symbols present, peer access).
    pub ipc: bool,
    /// Whether this rank can use the transport (library loaded).
    pub transport: bool,
    /// Versions of the libraries it loaded, `name=version`.
    pub versions: Vec<String>,
    /// Staging capacity in bytes.
    pub capacity: usize,
    /// The routing table it would use, canonically serialised.
    pub routing: String,
    /// Identity of its GPU, unique across machines (NVIDIA: the device UUID; ROCm: the
    /// machine's `hostname/boot-id` and the PCI bus id), empty when unknown. Two ranks with the
    /// same device cannot share a transport communicator (NCCL/RCCL refuse two ranks on one
    /// GPU), so such a group is routed without it (one IPC world) or through the host.
    #[serde(default)]
    pub device: String,
    /// What failed locally before the agreement (an invalid `DETCOLL_*` variable, an unreadable
    /// routing table, a device that did not open): reported through the agreement, so every
    /// rank fails with this rank's reason at once instead of this rank dropping out and its
    /// peers waiting for it.
    #[serde(default)]
    pub errors: Vec<String>,
    /// The libraries this rank needed and could not load before the agreement
    /// ([`Error::LibraryMissing`]: `(library, detail)`), reported like [`Facts::errors`]; the
    /// agreement then fails with `LibraryMissing` on every rank, so that every rank can take
    /// the same next step (another platform) and none waits for a peer that took another.
    #[serde(default)]
    pub missing: Vec<(String, String)>,
    /// Whether this rank can run the hierarchical route (the node's IPC collective and a
    /// transport among the ranks of its local rank): ranks on several hosts then take it when
    /// their layout allows ([`NodeLayout::of_hosts`]), else the flat transport route.
    #[serde(default)]
    pub nodes: bool,
    /// The transport's configuration as this rank resolved it (`name=value`,
    /// `ccl_transport`'s `TransportConfig::agreement`; empty without a transport): compared
    /// here, so the transport's own handshake exchanges readiness and its unique id only.
    #[serde(default)]
    pub transport_config: Vec<String>,
    /// Whether this rank can run a host-staged transport (a GPU rank: device to host, the host
    /// transport over the bootstrap, host to device). Taken only where no IPC collective spans
    /// the world (several hosts, or more ranks than one IPC world holds) and NCCL/RCCL cannot
    /// serve a group: a GPU shared by two of its ranks (they refuse that) or a rank without
    /// the library.
    #[serde(default)]
    pub staged: bool,
}

impl Facts {
    /// `r`'s value, or `fallback` with the error recorded in [`Facts::errors`] (so the
    /// agreement still happens and reports it on every rank).
    pub fn local<T>(errors: &mut Vec<String>, r: Result<T, Error>, fallback: impl FnOnce() -> T) -> T {
        r.unwrap_or_else(|e| {
            errors.push(e.config_reason());
            fallback()
        })
    }

    /// Records a local failure of `what` (e.g. "opening its CUDA device"): a missing library in
    /// [`Facts::missing`], anything else in [`Facts::errors`].
    pub fn fail(&mut self, what: &str, e: Error) {
        match e {
            Error::LibraryMissing { library, detail } => self.missing.push((library, detail)),
            e => self.errors.push(format!("{what}: {}", e.config_reason())),
        }
    }
}

/// What every rank agreed on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    pub platform: Platform,
    /// Build the IPC backend.
    pub ipc: bool,
    /// Build the transport.
    pub transport: bool,
    /// The routing every rank follows (the table, with routes nobody can take replaced).
    pub routing: Routing,
    /// The node layout of the hierarchical route, when the routing takes it (several hosts,
    /// or one host with more ranks than one IPC world holds).
    pub nodes: Option<NodeLayout>,
    /// The flat transport is the host-staged one (NCCL/RCCL cannot serve the world).
    pub staged: bool,
    /// The hierarchical route's transport across nodes is the host-staged one (NCCL/RCCL
    /// cannot serve some group of ranks of one local rank).
    pub cross_staged: bool,
    /// The most ranks of the world on one device (1 when none is shared or none is known):
    /// the IPC collectives of several nodes on one GPU split its multiprocessors among all of
    /// them, so that every rank's kernel is resident at once.
    pub device_sharers: usize,
}

impl Facts {
    /// Exchanges `self` with every rank through `boot` and decides. Collective.
    pub fn agree(&self, boot: &dyn Bootstrap) -> Result<Decision, Error> {
        let mine = serde_json::to_vec(self).map_err(|e| Error::InvalidConfig { detail: e.to_string() })?;
        let all = boot.all_gather_bytes(&mine)?;
        let facts: Vec<Facts> = all
            .iter()
            .enumerate()
            .map(|(q, b)| {
                serde_json::from_slice(b).map_err(|e| Error::ConfigMismatch {
                    detail: format!("rank {q} sent unreadable facts ({e}): is it a detcoll of another version?"),
                })
            })
            .collect::<Result<_, _>>()?;
        decide(&facts)
    }
}

/// The decision every rank takes from all ranks' facts, or the error every rank returns.
///
/// Pure and deterministic: every rank passes the same slice and gets the same answer.
pub fn decide(facts: &[Facts]) -> Result<Decision, Error> {
    let first = facts.first().ok_or_else(|| Error::InvalidConfig { detail: "no ranks".into() })?;
    if let Some(e) = local_failures(facts) {
        return Err(e);
    }
    let mismatch = |what: &str, q: usize, a: &dyn std::fmt::Display, b: &dyn std::fmt::Display| Error::ConfigMismatch {
        detail: format!("rank 0 has {what} {a} but rank {q} has {b}; every rank must agree"),
    };
    for (q, f) in facts.iter().enumerate().skip(1) {
        if f.platform != first.platform {
            return Err(mismatch("platform", q, &first.platform, &f.platform));
        }
        if f.capacity != first.capacity {
            return Err(mismatch("capacity", q, &first.capacity, &f.capacity));
        }
        // The same rules in another order, or another `source`, route alike: that is agreement.
        if f.routing != first.routing && Routing::same_routes(&f.routing, &first.routing) != Some(true) {
            return Err(mismatch(
                "routing table",
                q,
                &"(from DETCOLL_ROUTING_TABLE, Config::with_routing or the platform's default)",
                &"one that routes some call differently",
            ));
        }
        if f.versions != first.versions {
            return Err(mismatch("libraries", q, &first.versions.join(","), &f.versions.join(",")));
        }
        if f.transport_config != first.transport_config {
            return Err(mismatch(
                "transport configuration",
                q,
                &first.transport_config.join(","),
                &f.transport_config.join(","),
            ));
        }
    }
    let platform = Platform::parse(&first.platform)
        .ok_or_else(|| Error::InvalidConfig { detail: format!("unknown platform {}", first.platform) })?;
    let routing = Routing::from_json(&first.routing)?;
    let same_host = facts.iter().all(|f| f.host == first.host);
    let world = facts.len();
    let every = |f: fn(&Facts) -> bool| facts.iter().all(f);
    // One IPC collective spans the world only on one host and up to its world limit.
    let ipc = same_host && world <= collective_core::MAX_NODE_WORLD_SIZE && every(|f| f.ipc);
    let native = every(|f| f.transport);
    let can_stage = every(|f| f.staged);
    if world == 1 {
        return Ok(Decision {
            platform,
            ipc: false,
            transport: false,
            routing,
            nodes: None,
            staged: false,
            cross_staged: false,
            device_sharers: 1,
        });
    }
    // Several hosts, or one host with more ranks than an IPC world: the hierarchical route
    // where every rank can run it and the layout allows (node-major, the same power-of-two
    // number of ranks on every node).
    let layout = if ipc || !every(|f| f.nodes && f.ipc) {
        None
    } else if same_host {
        NodeLayout::of_one_host(world)
    } else {
        NodeLayout::of_hosts(&facts.iter().map(|f| f.host.as_str()).collect::<Vec<_>>())
    };
    // Which transport each group gets: NCCL/RCCL where every rank has it and no GPU is shared
    // inside the group, else the host-staged one where every rank can run it and no IPC
    // collective spans the world (one host's IPC world never falls back to staging).
    let cross_native = layout.is_some_and(|l| native && cross_shared_device(facts, l).is_none());
    let layout = layout.filter(|_| cross_native || can_stage);
    let flat_native = native && shared_device(facts).is_none();
    let flat_staged = !flat_native && !ipc && can_stage;
    let transport = flat_native || flat_staged;
    let routing = if ipc { routing.on_one_host() } else { routing };
    if let (Some((a, b)), false, false) = (shared_device(facts), ipc, transport || layout.is_some()) {
        return Err(Error::InvalidConfig {
            detail: format!(
                "no route is possible: ranks {a} and {b} share one GPU (the transport needs one GPU per rank) and same-host IPC is not available"
            ),
        });
    }
    let why_no_ipc = if !same_host {
        "the ranks run on more than one host".to_string()
    } else if world > collective_core::MAX_NODE_WORLD_SIZE {
        format!("{world} ranks are more than one IPC world holds ({})", collective_core::MAX_NODE_WORLD_SIZE)
    } else {
        let q = facts.iter().position(|f| !f.ipc).unwrap_or(0);
        format!("rank {q} cannot do same-host IPC")
    };
    let routing = match (ipc, transport, layout) {
        (true, true, _) => routing,
        (true, false, _) => routing.without_transport(),
        (false, _, Some(_)) if flat_native => routing.across_nodes(),
        (false, _, Some(_)) => routing.hierarchical_only(),
        (false, true, None) => routing.transport_only(),
        (false, false, None) => {
            return Err(Error::InvalidConfig {
                detail: format!("no route is possible: {why_no_ipc}, and not every rank has a transport"),
            });
        }
    };
    let uses = |f: fn(Route) -> bool| routing.routes().any(f);
    let nodes = layout.filter(|_| uses(Route::needs_nodes));
    // The flat transport is built only for the ranges that take it (the hierarchical route
    // brings its own transport across nodes).
    let flat = transport && routing.routes().any(|r| r.needs_transport() && !r.needs_nodes());
    Ok(Decision {
        platform,
        ipc: uses(Route::needs_ipc) && ipc,
        transport: flat,
        routing,
        nodes,
        staged: flat && !flat_native,
        cross_staged: nodes.is_some() && !cross_native,
        device_sharers: device_sharers(facts),
    })
}

/// The error of a world where some rank failed locally, naming each failing rank: every rank's
/// reasons, ranks with the same reasons together (`ranks 0-7: ...` when every rank of eight
/// lacks the driver). `LibraryMissing` (of the first missing library, in rank order) when
/// some rank lacks a library, else `InvalidConfig`.
fn local_failures(facts: &[Facts]) -> Option<Error> {
    let library = facts.iter().flat_map(|f| &f.missing).map(|(l, _)| l.clone()).next();
    let mut groups: Vec<(Vec<usize>, String)> = Vec::new();
    for (q, f) in facts.iter().enumerate() {
        let reasons: Vec<String> = f
            .missing
            .iter()
            .map(|(l, d)| if Some(l) == library.as_ref() { d.clone() } else { format!("{l} could not be loaded: {d}") })
            .chain(f.errors.iter().cloned())
            .collect();
        if reasons.is_empty() {
            continue;
        }
        let reasons = reasons.join("; ");
        match groups.iter_mut().find(|(_, r)| *r == reasons) {
            Some((ranks, _)) => ranks.push(q),
            None => groups.push((vec![q], reasons)),
        }
    }
    if groups.is_empty() {
        return None;
    }
    let detail = groups.iter().map(|(ranks, r)| format!("{}: {r}", rank_list(ranks))).collect::<Vec<_>>().join("; ");
    Some(match library {
        Some(library) => Error::LibraryMissing { library, detail },
        None => Error::InvalidConfig { detail },
    })
}

/// `rank 3`, `ranks 0-3`, `ranks 0, 2, 5-7` (ascending `ranks`).
fn rank_list(ranks: &[usize]) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for &q in ranks {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == q => *end = q,
            _ => runs.push((q, q)),
        }
    }
    let runs: Vec<String> =
        runs.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect();
    format!("{} {}", if ranks.len() == 1 { "rank" } else { "ranks" }, runs.join(", "))
}

/// Two ranks of one group of the hierarchical route's transport (the ranks of one local
/// rank, one per node) that share a device, if any.
fn cross_shared_device(facts: &[Facts], layout: NodeLayout) -> Option<(usize, usize)> {
    (0..layout.local).find_map(|l| shared_in(facts, (0..layout.nodes).map(|n| n * layout.local + l)))
}

/// The most ranks on one (known) device, at least 1.
fn device_sharers(facts: &[Facts]) -> usize {
    let mut count: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for f in facts.iter().filter(|f| !f.device.is_empty()) {
        *count.entry(f.device.as_str()).or_default() += 1;
    }
    count.into_values().max().unwrap_or(1)
}

/// Two ranks that report the same (known) device, if any: device identities name one physical
/// GPU across machines (NVIDIA: its UUID; ROCm: the machine and the PCI bus id), whatever host
/// identity the ranks report (virtual nodes on one GPU share it).
fn shared_device(facts: &[Facts]) -> Option<(usize, usize)> {
    shared_in(facts, 0..facts.len())
}

/// Two of the ranks `group` (ascending) that report the same (known) device: the first such pair in rank order. Linear in the group (a world of 1024 decides this on every
/// rank).
fn shared_in(facts: &[Facts], group: impl Iterator<Item = usize>) -> Option<(usize, usize)> {
    let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    let mut first: Option<(usize, usize)> = None;
    for q in group {
        let f = &facts[q];
        if f.device.is_empty() {
            continue;
        }
        if let Some(&a) = seen.get(f.device.as_str()) {
            // The pair with the smallest first rank, then the smallest second one.
            if first.is_none_or(|(fa, _)| a < fa) {
                first = Some((a, q));
            }
        } else {
            seen.insert(f.device.as_str(), q);
        }
    }
    first
}
