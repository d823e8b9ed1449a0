//! The CPU platform: the CPU twin for IPC routes, and an optional caller-supplied transport.
use crate::{Facts, Platform, Routed, Routing};
use collective_core::bootstrap::Bootstrap;
use collective_core::{Collective, Error, Op, Route, host_identity};
use shm_ipc::{ShmCollective, ShmConfig};

/// The CPU platform's collective with no transport.
pub type CpuCollective = Routed<ShmCollective, crate::NoTransport<()>>;

/// Builds the CPU collective for every rank of `boot` (collective: every rank calls it).
pub fn cpu_collective(boot: &dyn Bootstrap, capacity: usize) -> Result<CpuCollective, Error> {
    cpu_with_transport(boot, capacity, None, None::<fn() -> Result<crate::NoTransport<()>, Error>>)
}

/// Builds a CPU collective. `routing` replaces the table (default: `DETCOLL_ROUTING_TABLE`,
/// else the built-in CPU table); `transport`, when given, builds a transport this rank offers
/// (ranks on several hosts then route everything through it). Collective.
pub fn cpu_with_transport<T: Collective<Stream = ()>>(
    boot: &dyn Bootstrap,
    capacity: usize,
    routing: Option<Routing>,
    transport: Option<impl FnOnce() -> Result<T, Error>>,
) -> Result<Routed<ShmCollective, T>, Error> {
    let mut errors = Vec::new();
    let routing = match routing {
        Some(r) => r,
        None => Facts::local(&mut errors, Routing::from_env(Platform::Cpu), || Routing::default_for(Platform::Cpu)),
    };
    let platform = Facts::local(&mut errors, Platform::from_env(), || None).unwrap_or(Platform::Cpu);
    let host = Facts::local(&mut errors, host_identity(), String::new);
    if let Err(e) = collective_core::protocol::Timeouts::resolve(None) {
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
    };
    let d = facts.agree(boot)?;
    if d.platform != Platform::Cpu {
        return Err(Error::InvalidConfig {
            detail: format!("every rank reports platform {}, but this build drives only the CPU", d.platform.name()),
        });
    }
    let world = boot.world_size();
    let ipc = if d.ipc || world == 1 {
        let mut config = ShmConfig::new(capacity);
        config.rs_ag_threshold =
            d.routing.first_bytes(Op::AllReduce, Route::IpcReduceScatterAllGather).unwrap_or(usize::MAX);
        Some(ShmCollective::new(boot, config)?)
    } else {
        None
    };
    let transport = match (d.transport, transport) {
        (true, Some(make)) => Some(make()?),
        _ => None,
    };
    Routed::new(boot.rank(), world, capacity, d.routing, ipc, transport)
}
