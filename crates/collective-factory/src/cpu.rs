//! The CPU platform: the CPU twin for IPC routes, and an optional caller-supplied transport.
use crate::Config;
use crate::{Facts, Platform, Routed, Routing};
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::{Collective, Error, host_identity};
use shm_ipc::{ShmCollective, ShmConfig};
use std::sync::Arc;

/// The CPU platform's collective with no transport.
pub type CpuCollective = Routed<ShmCollective, crate::NoTransport<()>>;

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
    with_transport(&*boot, config, None::<fn() -> Result<crate::NoTransport<()>, Error>>)
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
        let hs: Vec<_> = boots
            .iter()
            .map(|b| s.spawn(move || with_transport(b, config, None::<fn() -> Result<crate::NoTransport<()>, Error>>)))
            .collect();
        crate::threads::join_ranks(hs)
    })
}

/// The CPU collective with a transport this rank offers (`transport`, when given: ranks on
/// several hosts then route everything through it). Collective over `boot`.
pub fn with_transport<T: Collective<Stream = ()>>(
    boot: &dyn Bootstrap,
    config: &Config,
    transport: Option<impl FnOnce() -> Result<T, Error>>,
) -> Result<Routed<ShmCollective, T>, Error> {
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
    let host = Facts::local(&mut errors, host_identity(), String::new);
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
    };
    let d = facts.agree(boot)?;
    if d.platform != Platform::Cpu {
        return Err(Error::InvalidConfig {
            detail: format!("every rank reports platform {}, but this build drives only the CPU", d.platform.name()),
        });
    }
    let world = boot.world_size();
    let ipc = if d.ipc || world == 1 {
        let mut shm = ShmConfig::new(capacity)
            .with_ll_capacity(d.routing.ll_capacity(config.ll_capacity()))
            .with_routes(d.routing.route_table().clone());
        shm.timeouts = config.timeouts();
        Some(ShmCollective::new(boot, shm)?)
    } else {
        None
    };
    let transport = match (d.transport, transport) {
        (true, Some(make)) => Some(make()?),
        _ => None,
    };
    Routed::new(boot.rank(), world, capacity, d.routing, ipc, transport)
}
