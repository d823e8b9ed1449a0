//! The ROCm platform: the HIP IPC twin for IPC routes and RCCL as the transport, composed by
//! the agreed routing (feature `rocm`) — the same composition as the NVIDIA platform.
//!
//! Agreement as on NVIDIA: each rank reports whether it can drive its GPU (IPC), whether
//! `librccl` loads (transport) and its GPU's PCI bus id, so ranks sharing a GPU are routed
//! without RCCL (which refuses two ranks on one GPU). Routing: `DETCOLL_ROUTING_TABLE`, else
//! the seeds' MI300X table; ranges a backend nobody has would take are remapped by agreement
//! (same bits either way). Nothing here has run: no AMD GPU was available (docs/rocm.md).
//!
//! Errors as on NVIDIA: no HIP runtime is `LibraryMissing` on every entry point (with
//! [`from_bootstrap`] on every rank, naming the ranks that lack it); any other local failure
//! or an invalid [`Config`] is `InvalidConfig` on every rank, naming the ranks; a world of 0
//! ranks is `InvalidConfig`.
use crate::compose::{ThreadIpc, ipc_config, nodes, thread_ranks, transport, world_blocks};
use crate::gpu_transport::GpuTransport;
use crate::nodes::NodeLayout;
use crate::{Config, DeviceSelect, Facts, Platform, Routed, Routing};
use ccl_transport::Vendor;
use collective_core::Timeouts;
use collective_core::bootstrap::Bootstrap;
use collective_core::{Error, host_identity};
use hip_ipc::{HipDevice, HipIpcCollective};
use std::sync::Arc;

/// The ROCm platform's collective.
pub type RocmCollective = Routed<HipIpcCollective, GpuTransport<HipDevice>>;

/// Whether this process can drive an AMD GPU (libamdhip64 loadable, a device present).
pub(crate) fn present() -> bool {
    hip_ipc::runtime::device_count().is_ok_and(|n| n > 0)
}

/// The GPU `select` names for the rank with local rank `local_rank` (by default
/// `local_rank % device count`); `LibraryMissing` without a HIP runtime.
fn ordinal(select: DeviceSelect, local_rank: usize) -> Result<usize, Error> {
    match (hip_ipc::runtime::device_count()?, select) {
        (n, DeviceSelect::Ordinal(o)) if o < n => Ok(o),
        (n, DeviceSelect::Ordinal(o)) => {
            Err(Error::InvalidConfig { detail: format!("HIP device {o} does not exist ({n} are visible)") })
        }
        (0, _) => Err(Error::InvalidConfig { detail: "no HIP device is visible to this process".into() }),
        (n, _) => Ok(local_rank % n),
    }
}

/// This rank of the ROCm collective of every rank of `boot`, on the GPU `config` selects
/// ([`DeviceSelect::LocalRank`]: `LOCAL_RANK % device count`), routed by `DETCOLL_ROUTING_TABLE`
/// or the seeds' MI300X table unless `config` has one. Collective: every rank calls it; every
/// rank gets the same decision or the same error.
pub fn from_bootstrap(boot: Arc<dyn Bootstrap>, config: &Config) -> Result<RocmCollective, Error> {
    let ordinal = ordinal(config.device(), boot.local_rank());
    build(boot, config, ordinal)
}

/// This rank of the ROCm collective on `device`, the caller's own HIP device (the engine's
/// ordinal; the collective loads its kernels on it). Collective over `boot`, like
/// [`from_bootstrap`].
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use collective_factory::bootstrap::TcpBootstrap;
/// use collective_factory::{Config, rocm};
/// use std::sync::Arc;
/// let device = collective_factory::hip::HipDevice::open(0)?;
/// let comm = rocm::from_device(Arc::new(TcpBootstrap::from_env()?), &device, &Config::new())?;
/// # let _ = comm; Ok(()) }
/// ```
pub fn from_device(boot: Arc<dyn Bootstrap>, device: &HipDevice, config: &Config) -> Result<RocmCollective, Error> {
    build(boot, config, Ok(device.ordinal()))
}

/// `world` ranks as threads of this process, rank `r` on GPU `r % device count`: the IPC
/// routes use peers' pointers directly (no IPC handles); RCCL is built when every rank has a
/// GPU of its own (the same composition as `nvidia::thread_group`). Hand one handle to
/// each thread; give each its own stream.
///
/// `world` 0 or an invalid `config` ([`Config::validate`]) is `InvalidConfig`; no HIP runtime
/// is `LibraryMissing`.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use collective_factory::{Config, RocmCollective, rocm};
/// let ranks: Vec<RocmCollective> = rocm::thread_group(2, &Config::new().with_capacity(1 << 20))?;
/// assert_eq!(ranks.len(), 2);
/// # Ok(()) }
/// ```
pub fn thread_group(world: usize, config: &Config) -> Result<Vec<RocmCollective>, Error> {
    config.validate_world(world)?;
    let count = hip_ipc::runtime::device_count()?;
    if count == 0 {
        return Err(Error::InvalidConfig { detail: "no HIP device is visible to this process".into() });
    }
    let ordinals: Vec<usize> = (0..world).map(|r| r % count).collect();
    // One device per GPU, shared by its ranks (they share its code object) and by both backends.
    let mut devices: Vec<HipDevice> = Vec::with_capacity(world);
    for &o in &ordinals {
        let d = match devices.iter().find(|d| d.ordinal() == o) {
            Some(d) => d.clone(),
            None => HipDevice::open(o)?,
        };
        devices.push(d);
    }
    hip_ipc::check_hw_queues(&ordinals, collective_core::env::var(hip_ipc::HW_QUEUES_ENV)?.as_deref())?;
    let routing = match config.routing() {
        Some(r) => r.clone(),
        None => Routing::from_env(Platform::Rocm)?,
    };
    routing.check_for(Platform::Rocm, world)?;
    let ipc_config = ipc_config(config, &routing);
    // More ranks than one IPC world holds: one IPC collective per node of the one-host layout.
    let ipc = match NodeLayout::of_one_host(world) {
        Some(layout) => {
            let node_config = world_blocks(&devices, ipc_config.clone())?;
            let mut local = Vec::with_capacity(world);
            for node in devices.chunks(layout.local) {
                local.extend(HipIpcCollective::group(node, &node_config)?);
            }
            ThreadIpc::Nodes(local)
        }
        None => ThreadIpc::World(HipIpcCollective::group(&devices, &ipc_config)?),
    };
    // RCCL refuses two ranks of one process on one GPU: the agreement compares every group's
    // devices (PCI bus ids) and stages through the host where one is shared.
    thread_ranks(&devices, ipc, &routing, config, |device, routing| facts(Ok(device.ordinal()), routing, config, true))
}

/// What this rank reports to the agreement: on GPU `ordinal` (a failure to find it travels in
/// the facts), RCCL offered when `rccl` and it loads. Local failures travel in `errors` and
/// `missing`.
fn facts(ordinal: Result<usize, Error>, routing: Routing, config: &Config, rccl: bool) -> Facts {
    let mut errors = Vec::new();
    Facts::local(&mut errors, config.validate(), || ());
    let platform = Facts::local(&mut errors, Platform::detect(), || Platform::Rocm);
    let host = Facts::local(&mut errors, host_identity(), String::new);
    Facts::local(&mut errors, Timeouts::resolve(config.timeouts()).map(drop), || ());
    // The device's PCI bus id on this machine tells the agreement which ranks share a GPU
    // (the machine, not `DETCOLL_HOST_ID`: simulated hosts on one machine share its GPUs).
    let device = ordinal
        .as_ref()
        .ok()
        .and_then(|&o| hip_ipc::runtime::pci_bus_id(o).ok())
        .map(|bus| format!("{}/{bus}", collective_core::bootstrap::machine_identity()))
        .unwrap_or_default();
    let lib = match rccl {
        true => Facts::local(&mut errors, crate::compose::transport_library(Vendor::Amd), || None),
        false => None,
    };
    let hip = hip_ipc::runtime::versions().ok().map(|(r, d)| format!("hip-runtime={r},hip-driver={d}"));
    let rccl_version = lib.as_ref().and_then(|l| l.version().ok()).map(|v| format!("rccl={v}"));
    let transport_config = crate::compose::transport_facts(config, &mut errors);
    let mut f = Facts {
        platform: platform.name().to_string(),
        host,
        ipc: ordinal.is_ok(),
        transport: lib.is_some(),
        versions: hip.into_iter().chain(rccl_version).collect(),
        capacity: config.capacity(),
        routing: routing.canonical_json(),
        device,
        errors,
        missing: Vec::new(),
        nodes: true,
        transport_config,
        staged: true,
    };
    if let Err(e) = ordinal {
        // A rank without its GPU reports the platform it was asked to drive; its failure makes
        // the agreement fail on every rank, naming it.
        f.platform = Platform::Rocm.name().into();
        f.fail("finding its HIP device", e);
    }
    f
}

/// The process-rank composition: agreement (a rank whose device failed still takes part and
/// reports it: a missing library is `LibraryMissing` on every rank, anything else
/// `InvalidConfig`, both naming the failing ranks), then the HIP IPC collective and RCCL,
/// sharing one device.
fn build(boot: Arc<dyn Bootstrap>, config: &Config, ordinal: Result<usize, Error>) -> Result<RocmCollective, Error> {
    let mut errors = Vec::new();
    let routing = match config.routing() {
        Some(r) => r.clone(),
        None => Facts::local(&mut errors, Routing::from_env(Platform::Rocm), || Routing::default_for(Platform::Rocm)),
    };
    Facts::local(&mut errors, routing.check_for(Platform::Rocm, boot.world_size()), || ());
    let ok = ordinal.as_ref().ok().copied();
    let mut facts = facts(ordinal, routing, config, true);
    facts.errors.extend(errors);
    let d = facts.agree(&*boot)?;
    if d.platform != Platform::Rocm {
        return Err(Error::InvalidConfig {
            detail: format!("every rank reports platform {}, not rocm", d.platform.name()),
        });
    }
    // The agreement fails whenever a rank reported a failure, so the ordinal is here.
    let ordinal = ok.ok_or_else(|| Error::InvalidConfig { detail: "no HIP device was found".into() })?;
    // One device for both backends: they share the loaded code object.
    let device = HipDevice::open(ordinal)?;
    let world = boot.world_size();
    let ipc = if d.ipc || world == 1 {
        // hip_ipc::new_on: ranks sharing a GPU are refused unless DETCOLL_HIP_ALLOW_SHARED_GPU=1.
        Some(hip_ipc::new_on(Box::new(boot.clone()), device.clone(), &ipc_config(config, &d.routing))?)
    } else {
        None
    };
    let transport = transport(&d, &device, &boot, config)?;
    let routed = Routed::new(boot.rank(), world, config.capacity(), d.routing.clone(), ipc, transport)?;
    let Some(layout) = d.nodes else { return Ok(routed) };
    let nodes =
        nodes(&d, layout, &device, &boot, config, |node, c| hip_ipc::new_on(Box::new(node), device.clone(), c))?;
    Ok(routed.with_nodes(nodes))
}
