//! What the GPU platforms (`nvidia`, `rocm`) build the same way from one [`Config`]: the IPC
//! engine's configuration and the NCCL/RCCL transport where the agreement chose it.
use crate::{Config, Decision, Facts, Routed, Routing};
use ccl_transport::{Device, TransportCollective, TransportConfig};
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::{Error, RouteSelect};
use detcoll_protocol::IpcConfig;
use std::sync::Arc;

/// The IPC engine's configuration: the agreed routing table is its route policy (`Routed`
/// decides every call's route by it; the engine's own `route()` looks up the same table).
pub(crate) fn ipc_config(config: &Config, routing: &Routing) -> IpcConfig {
    let mut c = IpcConfig::new(config.capacity())
        .with_routes(routing.route_table().clone())
        .with_ll_capacity(routing.ll_capacity(config.ll_capacity()));
    c.timeouts = config.timeouts();
    c.max_blocks = config.max_blocks();
    c.lockstep = config.lockstep();
    c
}

/// The transport on `device` when the agreement chose one (collective: every rank calls it).
pub(crate) fn transport<D: Device + Clone>(
    d: &Decision,
    device: &D,
    boot: &dyn Bootstrap,
    config: &Config,
) -> Result<Option<TransportCollective<D>>, Error> {
    if !d.transport {
        return Ok(None);
    }
    // The agreement compared every rank's library version and transport configuration.
    TransportCollective::with_agreed_device(|| Ok(device.clone()), boot, &transport_config(config)).map(Some)
}

/// The transport's configuration from `config`.
pub(crate) fn transport_config(config: &Config) -> TransportConfig {
    let mut t = TransportConfig::new(config.capacity());
    t.timeouts = config.timeouts();
    t
}

/// What a rank with a transport reports to the agreement about its configuration (its
/// failure to resolve it goes to `errors`).
pub(crate) fn transport_facts(config: &Config, errors: &mut Vec<String>) -> Vec<String> {
    Facts::local(errors, transport_config(config).agreement(), Vec::new)
}

/// Ranks as threads: `ipc[r]` on `devices[r]`, each rank agreeing (with the facts `facts`
/// reports for its device and the routing it asks for) and building its transport on its own
/// thread, since NCCL's and RCCL's init is collective.
pub(crate) fn thread_ranks<D, I>(
    devices: &[D],
    ipc: Vec<I>,
    routing: &Routing,
    config: &Config,
    facts: impl Fn(&D, Routing) -> Facts + Sync,
) -> Result<Vec<Routed<I, TransportCollective<D>>>, Error>
where
    D: Device + Clone,
    I: RouteSelect<Stream = D::Stream> + Send,
{
    let world = devices.len();
    let mut ipc = ipc.into_iter();
    let facts = &facts;
    std::thread::scope(|s| {
        let handles: Vec<_> = LocalBootstrap::group(world)
            .into_iter()
            .zip(devices.iter().cloned())
            .map(|(boot, device)| {
                let ipc = ipc.next();
                let routing = routing.clone();
                s.spawn(move || {
                    let boot: Arc<dyn Bootstrap> = Arc::new(boot);
                    let d = facts(&device, routing).agree(&*boot)?;
                    let transport = transport(&d, &device, &*boot, config)?;
                    Routed::new(boot.rank(), world, config.capacity(), d.routing, ipc, transport)
                })
            })
            .collect();
        crate::threads::join_ranks(handles)
    })
}
