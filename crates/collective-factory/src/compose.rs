//! What the GPU platforms (`nvidia`, `rocm`) build the same way from one [`Config`]: the IPC
//! engine's configuration, the transport where the agreement chose it (NCCL/RCCL or the
//! host-staged one), and the hierarchical route's backends.
use crate::gpu_transport::GpuTransport;
use crate::nodes::{DeviceScratch, NodeLayout, Nodes, node_groups};
use crate::{Config, Decision, Facts, Routed, Routing};
use ccl_transport::{Device, TransportCollective, TransportConfig};
use collective_core::bootstrap::{Bootstrap, LocalBootstrap};
use collective_core::{Error, RouteSelect, Timeouts};
use detcoll_host_transport::StagedTransport;
use detcoll_protocol::{IpcConfig, IpcDevice};
use std::sync::Arc;

/// NCCL/RCCL for `vendor`: `Ok(None)` when it is not installed (the routes without a
/// transport remain). With `DETCOLL_NCCL_LIBRARY` set, the library it names must load: an
/// explicit choice is not dropped without a word ([`Error::InvalidConfig`] naming the variable,
/// its value and why; also for a value that is empty or not UTF-8).
pub(crate) fn transport_library(
    vendor: ccl_transport::Vendor,
) -> Result<Option<Arc<ccl_transport::NcclLibrary>>, Error> {
    library_of(collective_core::env::var(ccl_transport::LIBRARY_ENV)?, || ccl_transport::load(Some(vendor)))
}

/// [`transport_library`] with `DETCOLL_NCCL_LIBRARY` = `explicit` and `load` the loader.
fn library_of<L>(
    explicit: Option<String>,
    load: impl FnOnce() -> Result<L, ccl_transport::NcclError>,
) -> Result<Option<L>, Error> {
    let name = ccl_transport::LIBRARY_ENV;
    if explicit.as_deref() == Some("") {
        return Err(collective_core::env::invalid(
            name,
            "",
            "the path of a NCCL/RCCL library (unset: the loader's search)",
        ));
    }
    match (load(), explicit) {
        (Ok(lib), _) => Ok(Some(lib)),
        (Err(_), None) => Ok(None),
        (Err(e), Some(path)) => Err(Error::InvalidConfig {
            detail: format!("environment variable {name}={path:?} names a library that does not load: {e}"),
        }),
    }
}

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

/// The flat transport on `device` when the agreement chose one (collective: every rank calls
/// it).
pub(crate) fn transport<D: Device + Clone>(
    d: &Decision,
    device: &D,
    boot: &Arc<dyn Bootstrap>,
    config: &Config,
) -> Result<Option<GpuTransport<D>>, Error> {
    if !d.transport {
        return Ok(None);
    }
    make_transport(d.staged, device, boot, config).map(Some)
}

/// NCCL/RCCL over `boot`, or the host-staged transport (`staged`). Collective over `boot`.
fn make_transport<D: Device + Clone>(
    staged: bool,
    device: &D,
    boot: &Arc<dyn Bootstrap>,
    config: &Config,
) -> Result<GpuTransport<D>, Error> {
    if staged {
        return StagedTransport::new(device.clone(), boot.clone()).map(GpuTransport::HostStaged);
    }
    // The agreement compared every rank's library version and transport configuration.
    TransportCollective::with_agreed_device(|| Ok(device.clone()), &**boot, &transport_config(config))
        .map(GpuTransport::Ccl)
}

/// This rank's backends of the hierarchical route (collective over `boot`): the node's IPC
/// collective (`local`, built over the node's group with the configuration given), the
/// transport across nodes among the ranks of this local rank (NCCL/RCCL per rail, or
/// host-staged where the agreement said so), and a device scratch row reserved for calls up to
/// the capacity.
pub(crate) fn nodes<D, I>(
    d: &Decision,
    layout: NodeLayout,
    device: &D,
    boot: &Arc<dyn Bootstrap>,
    config: &Config,
    local: impl FnOnce(Arc<dyn Bootstrap>, &IpcConfig) -> Result<I, Error>,
) -> Result<Nodes<I, GpuTransport<D>>, Error>
where
    D: IpcDevice,
    I: RouteSelect<Stream = D::Stream>,
{
    let (node_boot, cross_boot) = node_groups(&**boot, layout)?;
    let local = local(node_boot, &node_ipc_config(config, &d.routing, device, d.device_sharers)?)?;
    let cross = make_transport(d.cross_staged, device, &cross_boot, config)?;
    let timeout = Timeouts::resolve(config.timeouts())?.peer;
    let scratch = DeviceScratch::new(device.clone(), config.capacity() / layout.local, timeout)?;
    Nodes::new(layout, boot.rank(), local, d.routing.route_table().clone(), cross, Box::new(scratch))
}

/// The IPC configuration of a node's collective: [`ipc_config`], and where more ranks than the
/// node's share one GPU (several virtual nodes, or one host's nodes, on it) and the caller did
/// not set a block count, the GPU's multiprocessors split among all `sharers` of them — each
/// node's engine only counts its own ranks, and two worlds' kernels that together want more
/// than the GPU holds would not all be resident (a ready-flag timeout).
pub(crate) fn node_ipc_config<D: IpcDevice>(
    config: &Config,
    routing: &Routing,
    device: &D,
    sharers: usize,
) -> Result<IpcConfig, Error> {
    let mut c = ipc_config(config, routing);
    if c.max_blocks.is_none() && sharers > 1 {
        c.max_blocks = Some((device.multiprocessors()? / sharers).max(1));
    }
    Ok(c)
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

/// `c` for the node collectives of ranks as threads on `devices` (every rank of the world):
/// without a block count set, each GPU's multiprocessors split among all the world's ranks on
/// it, not only a node's (as [`node_ipc_config`]).
pub(crate) fn world_blocks<D: IpcDevice>(devices: &[D], mut c: IpcConfig) -> Result<IpcConfig, Error> {
    if c.max_blocks.is_none() {
        let mut b = usize::MAX;
        for d in devices {
            let sharing = devices.iter().filter(|o| o.same_device(d)).count();
            b = b.min((d.multiprocessors()? / sharing).max(1));
        }
        c.max_blocks = Some(b);
    }
    Ok(c)
}

/// The IPC collectives of ranks as threads: one spanning the world, or one per node when the
/// world is more than one IPC world holds ([`NodeLayout::of_one_host`]).
pub(crate) enum ThreadIpc<I> {
    /// `ipc[r]`: rank `r` of the world's IPC collective.
    World(Vec<I>),
    /// `local[r]`: rank `r`'s handle in its node's IPC collective.
    Nodes(Vec<I>),
}

/// Ranks as threads: rank `r` on `devices[r]` with its IPC handle from `ipc`, each rank
/// agreeing (with the facts `facts` reports for its device and the routing it asks for) and
/// building its transport on its own thread, since NCCL's and RCCL's init is collective.
pub(crate) fn thread_ranks<D, I>(
    devices: &[D],
    ipc: ThreadIpc<I>,
    routing: &Routing,
    config: &Config,
    facts: impl Fn(&D, Routing) -> Facts + Sync,
) -> Result<Vec<Routed<I, GpuTransport<D>>>, Error>
where
    D: IpcDevice,
    I: RouteSelect<Stream = D::Stream> + Send,
{
    let world = devices.len();
    let (mut world_ipc, mut node_ipc) = match ipc {
        ThreadIpc::World(v) => (v.into_iter().map(Some).collect::<Vec<_>>(), Vec::new()),
        ThreadIpc::Nodes(v) => (Vec::new(), v.into_iter().map(Some).collect::<Vec<_>>()),
    };
    world_ipc.resize_with(world, || None);
    node_ipc.resize_with(world, || None);
    let facts = &facts;
    // The exchange bound of the ranks' rendezvous: `DETCOLL_BOOTSTRAP_TIMEOUT_MS`, as for
    // processes, else `LocalBootstrap`'s default.
    let boots = LocalBootstrap::group_from_env(world)?;
    std::thread::scope(|s| {
        let handles: Vec<_> = boots
            .into_iter()
            .zip(devices.iter().cloned())
            .zip(world_ipc.into_iter().zip(node_ipc))
            .map(|((boot, device), (ipc, local))| {
                let routing = routing.clone();
                s.spawn(move || {
                    let boot: Arc<dyn Bootstrap> = Arc::new(boot);
                    let d = facts(&device, routing).agree(&*boot)?;
                    let transport = transport(&d, &device, &boot, config)?;
                    let routed = Routed::new(boot.rank(), world, config.capacity(), d.routing.clone(), ipc, transport)?;
                    let (Some(layout), Some(local)) = (d.nodes, local) else { return Ok(routed) };
                    let nodes = nodes(&d, layout, &device, &boot, config, |_, _| Ok(local))?;
                    Ok(routed.with_nodes(nodes))
                })
            })
            .collect();
        crate::threads::join_ranks(handles)
    })
}

#[cfg(test)]
mod tests {
    use super::library_of;
    use ccl_transport::NcclError;
    use collective_core::Error;

    fn missing() -> Result<u8, NcclError> {
        Err(NcclError::LibraryMissing { library: "NCCL".into(), detail: "tried /x/libnccl.so: file too short".into() })
    }

    /// An explicit library that does not load, or an empty one, is an error naming the variable
    /// (an outside probe, 2026-12-05: it meant "no NCCL" without a word); none installed and
    /// none named is no transport.
    #[test]
    fn an_explicit_library_must_load() {
        assert!(matches!(library_of(None, missing), Ok(None)));
        assert!(matches!(library_of(Some("/x/libnccl.so".into()), || Ok(7u8)), Ok(Some(7))));
        let e = library_of(Some("/x/libnccl.so".into()), missing).unwrap_err();
        let named = "DETCOLL_NCCL_LIBRARY=\"/x/libnccl.so\"";
        assert!(
            matches!(&e, Error::InvalidConfig { detail } if detail.contains(named) && detail.contains("too short")),
            "{e}"
        );
        let e = library_of(Some(String::new()), || Ok(7u8)).unwrap_err();
        assert!(matches!(&e, Error::InvalidConfig { detail } if detail.contains("DETCOLL_NCCL_LIBRARY")), "{e}");
    }
}
