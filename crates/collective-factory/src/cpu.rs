//! The CPU platform: the CPU twin for IPC routes inside a host, the host transport (over the
//! bootstrap) across hosts — flat, or hierarchical when the ranks' layout allows — or a
//! caller-supplied transport.
use crate::Config;
use crate::nodes::{HostScratch, Nodes, node_groups};
use crate::{Decision, Facts, Platform, Routed, Routing};
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::{Collective, Error, host_identity};
use detcoll_host_transport::HostTransport;
use shm_ipc::{ShmCollective, ShmConfig};
use std::sync::Arc;

/// The CPU platform's collective: the CPU twin inside a host, the host transport across hosts.
pub type CpuCollective = Routed<ShmCollective, HostTransport>;

/// This rank of the CPU-twin collective of every rank of `boot` (one process per rank: host
/// shared memory between the processes of one host). Collective: every rank calls it.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use collective_factory::bootstrap::TcpBootstrap;
/// use collective_factory::{Config, cpu};
/// use std::sync::Arc;
/// // In each process started by torchrun or `detcoll-run --nproc 4 -- ...`:
/// let comm = cpu::from_bootstrap(Arc::new(TcpBootstrap::from_env()?), &Config::new())?;
/// # let _ = comm; Ok(()) }
/// ```
pub fn from_bootstrap(boot: Arc<dyn Bootstrap>, config: &Config) -> Result<CpuCollective, Error> {
    build(boot, config)
}

/// `world` ranks as threads of this process (host memory every rank reads directly). Hand one
/// handle to each thread. The ranks share their staging, freed with the last of them: a rank's
/// close or drop never waits for its peers, so the whole group may be dropped from one thread.
/// `world` 0 or an invalid `config` ([`Config::validate`]) is `InvalidConfig`.
///
/// ```
/// use collective_factory::{Collective, Io};
/// use collective_factory::{Config, cpu};
/// use collective_factory::half::bf16;
///
/// let ranks = cpu::thread_group(4, &Config::new().with_capacity(1 << 20))?;
/// std::thread::scope(|s| {
///     for comm in &ranks {
///         s.spawn(move || {
///             let input = vec![bf16::from_f32(comm.rank() as f32 + 0.1); 1024];
///             let mut out = vec![bf16::ZERO; 1024];
///             comm.all_reduce(Io::host(&input, &mut out), &()).unwrap(); // (r0+r1)+(r2+r3), in bf16
///             let r = |q: f32| bf16::from_f32(q + 0.1);
///             assert_eq!(out[0].to_bits(), ((r(0.0) + r(1.0)) + (r(2.0) + r(3.0))).to_bits());
///         });
///     }
/// });
/// # Ok::<(), collective_factory::Error>(())
/// ```
pub fn thread_group(world: usize, config: &Config) -> Result<Vec<CpuCollective>, Error> {
    config.validate_world(world)?;
    in_process(world, config, |_| None)
}

/// `nodes * local` ranks as threads of this process, on `nodes` simulated hosts of `local`
/// ranks each (node-major: rank `r` on node `r / local`): what [`thread_group`] builds on
/// `nodes` machines, for tests and benchmarks on one. Each rank reports the host identity
/// `virtual-node-<n>` to the agreement — the in-process form of `DETCOLL_HOST_ID`, which
/// processes set instead — so the world routes as it would across hosts: hierarchical
/// (the CPU twin inside each node, the host transport across) when `local` is a power of two
/// from 2 to 8, else the flat transport route; the bits are the same.
pub fn virtual_nodes(nodes: usize, local: usize, config: &Config) -> Result<Vec<CpuCollective>, Error> {
    let world = nodes.checked_mul(local).ok_or(Error::InvalidConfig { detail: "too many ranks".into() })?;
    config.validate_world(world)?;
    in_process(world, config, |r| Some(format!("virtual-node-{}", r / local)))
}

/// `world` ranks as threads of this process, each reporting `host(rank)` (or its host's
/// identity) to the agreement: every rank agrees in a thread of its own, as processes do; then
/// the CPU twin's worlds the decision takes (the whole world, or each node's ranks for the
/// hierarchical route) are built as in-process groups — heap staging every rank reads
/// directly, shared and freed with the group's last rank, as GPU thread groups are — so a rank's
/// close or drop never waits for its peers (dropping a whole group from one thread, as a
/// program's `main` does at its end, returns at once); last, each rank's transports in a
/// thread of its own.
fn in_process(
    world: usize,
    config: &Config,
    host: impl Fn(usize) -> Option<String> + Sync,
) -> Result<Vec<CpuCollective>, Error> {
    // The exchange bound of the ranks' rendezvous, and of the host transports over it:
    // `DETCOLL_BOOTSTRAP_TIMEOUT_MS`, as for processes, else `LocalBootstrap`'s default.
    let boots: Vec<Arc<dyn Bootstrap>> =
        LocalBootstrap::group_from_env(world)?.into_iter().map(|b| Arc::new(b) as Arc<dyn Bootstrap>).collect();
    let host = &host;
    let decisions = std::thread::scope(|s| {
        let hs: Vec<_> =
            boots.iter().map(|b| s.spawn(move || agree(&**b, config, host(b.rank()), true, true))).collect();
        crate::threads::join_ranks(hs)
    })?;
    // Every rank decided the same (the agreement's promise); rank 0's decision builds the groups.
    let d = &decisions[0];
    let none = || (0..world).map(|_| None).collect::<Vec<Option<ShmCollective>>>();
    let mut ipc = none();
    if d.ipc || world == 1 {
        ipc = ShmCollective::group(world, shm_config(config, &d.routing))?.into_iter().map(Some).collect();
    }
    let mut local = none();
    if let Some(layout) = d.nodes {
        // Node-major: node n's ranks are n * L .. n * L + L - 1, by local rank.
        for group in local.chunks_mut(layout.local) {
            let ranks = ShmCollective::group(layout.local, shm_config(config, &d.routing))?;
            for (slot, rank) in group.iter_mut().zip(ranks) {
                *slot = Some(rank);
            }
        }
    }
    std::thread::scope(|s| {
        let hs: Vec<_> = boots
            .into_iter()
            .zip(decisions)
            .zip(ipc.into_iter().zip(local))
            .map(|((boot, d), (ipc, local))| s.spawn(move || compose(boot, config, d, ipc, local)))
            .collect();
        crate::threads::join_ranks(hs)
    })
}

/// This rank of the CPU platform over `boot` (one process per rank), the host transport
/// offered for every route that needs one.
fn build(boot: Arc<dyn Bootstrap>, config: &Config) -> Result<CpuCollective, Error> {
    let d = agree(&*boot, config, None, true, true)?;
    let world = boot.world_size();
    let ipc =
        if d.ipc || world == 1 { Some(ShmCollective::new(&*boot, shm_config(config, &d.routing))?) } else { None };
    compose(boot, config, d, ipc, None)
}

/// This rank of the CPU platform from its decision `d` and the CPU twin's worlds built for it
/// (`ipc`: the whole world's, when `d` takes it; `local`: its node's, when `d` takes the
/// hierarchical route — `None`: built here over the node's group, one process per rank): the
/// flat host transport where `d` takes it, and the route across nodes. Collective over `boot`.
fn compose(
    boot: Arc<dyn Bootstrap>,
    config: &Config,
    d: Decision,
    ipc: Option<ShmCollective>,
    local: Option<ShmCollective>,
) -> Result<CpuCollective, Error> {
    let transport = if d.transport { Some(HostTransport::new(boot.clone())?) } else { None };
    let world = boot.world_size();
    let routed = Routed::new(boot.rank(), world, config.capacity(), d.routing.clone(), ipc, transport)?;
    let Some(layout) = d.nodes else { return Ok(routed) };
    let rank = boot.rank();
    let (node_boot, cross_boot) = node_groups(&*boot, layout)?;
    let local = match local {
        Some(group_rank) => group_rank,
        None => ShmCollective::new(&*node_boot, shm_config(config, &d.routing))?,
    };
    let cross = HostTransport::new(cross_boot)?;
    let nodes =
        Nodes::new(layout, rank, local, d.routing.route_table().clone(), cross, Box::new(HostScratch::default()))?;
    Ok(routed.with_nodes(nodes))
}

/// The CPU twin's configuration: the agreed table is its route policy.
fn shm_config(config: &Config, routing: &Routing) -> ShmConfig {
    let mut shm = ShmConfig::new(config.capacity())
        .with_ll_capacity(routing.ll_capacity(config.ll_capacity()))
        .with_routes(routing.route_table().clone());
    shm.timeouts = config.timeouts();
    shm
}

/// The CPU collective with a transport this rank offers (`transport`, when given: ranks on
/// several hosts then route everything through it). Collective over `boot`.
pub fn with_transport<T: Collective<Stream = ()>>(
    boot: &dyn Bootstrap,
    config: &Config,
    transport: Option<impl FnOnce() -> Result<T, Error>>,
) -> Result<Routed<ShmCollective, T>, Error> {
    // A caller's transport spans the whole world: no groups to run the hierarchical route on.
    let (d, ipc, transport) = agree_and_build(boot, config, transport)?;
    Routed::new(boot.rank(), boot.world_size(), config.capacity(), d.routing, ipc, transport)
}

/// The agreement of the CPU platform's ranks, then the CPU twin and the caller's transport
/// where the decision takes them.
#[allow(clippy::type_complexity)]
fn agree_and_build<T: Collective<Stream = ()>>(
    boot: &dyn Bootstrap,
    config: &Config,
    transport: Option<impl FnOnce() -> Result<T, Error>>,
) -> Result<(Decision, Option<ShmCollective>, Option<T>), Error> {
    let d = agree(boot, config, None, false, transport.is_some())?;
    let world = boot.world_size();
    let ipc = if d.ipc || world == 1 { Some(ShmCollective::new(boot, shm_config(config, &d.routing))?) } else { None };
    let transport = match (d.transport, transport) {
        (true, Some(make)) => Some(make()?),
        _ => None,
    };
    Ok((d, ipc, transport))
}

/// The agreement of the CPU platform's ranks (collective over `boot`). `host`: the identity
/// this rank reports instead of its host's; `nodes`: whether it offers the hierarchical route;
/// `transport`: whether it offers a flat transport.
fn agree(
    boot: &dyn Bootstrap,
    config: &Config,
    host: Option<String>,
    nodes: bool,
    transport: bool,
) -> Result<Decision, Error> {
    let capacity = config.capacity();
    let routing = config.routing().cloned();
    let mut errors = Vec::new();
    // An invalid config travels through the agreement like every local failure.
    Facts::local(&mut errors, config.validate(), || ());
    let routing = match routing {
        Some(r) => r,
        None => Facts::local(&mut errors, Routing::from_env(Platform::Cpu), || Routing::default_for(Platform::Cpu)),
    };
    Facts::local(&mut errors, routing.check_for(Platform::Cpu, boot.world_size()), || ());
    let platform = Facts::local(&mut errors, Platform::from_env(), || None).unwrap_or(Platform::Cpu);
    let host = match host {
        Some(h) => h,
        None => Facts::local(&mut errors, host_identity(), String::new),
    };
    Facts::local(&mut errors, collective_core::Timeouts::resolve(config.timeouts()).map(drop), || ());
    let facts = Facts {
        // The stack this builder drives, not the host's GPUs: the CPU twin runs on any host,
        // also one with GPUs and a GPU-enabled build. A rank that built another platform's
        // stack (or was told it is on one: `DETCOLL_PLATFORM`) reports that platform, and the
        // agreement refuses the mix.
        platform: platform.name().to_string(),
        host,
        ipc: true,
        transport,
        versions: Vec::new(),
        capacity,
        routing: routing.canonical_json(),
        device: String::new(),
        errors,
        missing: Vec::new(),
        nodes,
        transport_config: Vec::new(),
        staged: false,
    };
    let d = facts.agree(boot)?;
    if d.platform != Platform::Cpu {
        return Err(Error::InvalidConfig {
            detail: format!("every rank reports platform {}, but this build drives only the CPU", d.platform.name()),
        });
    }
    Ok(d)
}
