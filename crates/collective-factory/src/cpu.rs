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
/// use collective_core::bootstrap::TcpBootstrap;
/// use collective_factory::{Config, cpu};
/// use std::sync::Arc;
/// // In each process started by torchrun or `detcoll-run --nproc 4 -- ...`:
/// let comm = cpu::from_bootstrap(Arc::new(TcpBootstrap::from_env()?), &Config::new())?;
/// # let _ = comm; Ok(()) }
/// ```
pub fn from_bootstrap(boot: Arc<dyn Bootstrap>, config: &Config) -> Result<CpuCollective, Error> {
    build(boot, config, None)
}

/// `world` ranks as threads of this process (host memory every rank reads directly). Hand one
/// handle to each thread. `world` 0 or an invalid `config` ([`Config::validate`]) is
/// `InvalidConfig`.
///
/// ```
/// use collective_core::{Collective, Io};
/// use collective_factory::{Config, cpu};
/// use half::bf16;
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
/// # Ok::<(), collective_core::Error>(())
/// ```
pub fn thread_group(world: usize, config: &Config) -> Result<Vec<CpuCollective>, Error> {
    config.validate_world(world)?;
    let boots = LocalBootstrap::group(world);
    std::thread::scope(|s| {
        let hs: Vec<_> = boots.into_iter().map(|b| s.spawn(move || build(Arc::new(b), config, None))).collect();
        crate::threads::join_ranks(hs)
    })
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
    let boots = LocalBootstrap::group(world);
    std::thread::scope(|s| {
        let hs: Vec<_> = boots
            .into_iter()
            .enumerate()
            .map(|(r, b)| s.spawn(move || build(Arc::new(b), config, Some(format!("virtual-node-{}", r / local)))))
            .collect();
        crate::threads::join_ranks(hs)
    })
}

/// This rank of the CPU platform over `boot`, the host transport offered for every route
/// that needs one. `host`: the identity this rank reports instead of its host's
/// ([`virtual_nodes`]).
fn build(boot: Arc<dyn Bootstrap>, config: &Config, host: Option<String>) -> Result<CpuCollective, Error> {
    let flat = {
        let boot = boot.clone();
        move || HostTransport::new(boot)
    };
    let (d, ipc, transport) = agree_and_build(&*boot, config, host, true, Some(flat))?;
    let world = boot.world_size();
    let routed = Routed::new(boot.rank(), world, config.capacity(), d.routing.clone(), ipc, transport)?;
    let Some(layout) = d.nodes else { return Ok(routed) };
    let rank = boot.rank();
    let (node_boot, cross_boot) = node_groups(&*boot, layout)?;
    let local = ShmCollective::new(&*node_boot, shm_config(config, &d.routing))?;
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
    let (d, ipc, transport) = agree_and_build(boot, config, None, false, transport)?;
    Routed::new(boot.rank(), boot.world_size(), config.capacity(), d.routing, ipc, transport)
}

/// The agreement of the CPU platform's ranks, then the CPU twin and the flat transport where
/// the decision takes them. `nodes`: whether this rank offers the hierarchical route.
#[allow(clippy::type_complexity)]
fn agree_and_build<T: Collective<Stream = ()>>(
    boot: &dyn Bootstrap,
    config: &Config,
    host: Option<String>,
    nodes: bool,
    transport: Option<impl FnOnce() -> Result<T, Error>>,
) -> Result<(Decision, Option<ShmCollective>, Option<T>), Error> {
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
    if let Err(e) = collective_core::Timeouts::resolve(config.timeouts()) {
        errors.push(e.to_string());
    }
    let facts = Facts {
        // The stack this builder drives, not the host's GPUs: the CPU twin runs on any host,
        // also one with GPUs and a GPU-enabled build. A rank that built another platform's
        // stack (or was told it is on one: `DETCOLL_PLATFORM`) reports that platform, and the
        // agreement refuses the mix.
        platform: platform.name().to_string(),
        host,
        ipc: true,
        transport: transport.is_some(),
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
    let world = boot.world_size();
    let ipc = if d.ipc || world == 1 { Some(ShmCollective::new(boot, shm_config(config, &d.routing))?) } else { None };
    let transport = match (d.transport, transport) {
        (true, Some(make)) => Some(make()?),
        _ => None,
    };
    Ok((d, ipc, transport))
}
