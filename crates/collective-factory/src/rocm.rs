//! The ROCm platform: the HIP IPC twin for IPC routes and RCCL as the transport, composed by
//! the agreed routing (feature `rocm`) — the same composition as the NVIDIA platform.
//!
//! Agreement as on NVIDIA: each rank reports whether it can drive its GPU (IPC), whether
//! `librccl` loads (transport) and its GPU's PCI bus id, so ranks sharing a GPU are routed
//! without RCCL (which refuses two ranks on one GPU). Routing: `DETCOLL_ROUTING_TABLE`, else
//! the seeds' MI300X table; ranges a backend nobody has would take are remapped by agreement
//! (same bits either way). Nothing here has run: no AMD GPU was available (docs/rocm.md).
use crate::{Config, DeviceSelect, Facts, Platform, Routed, Routing};
use ccl_transport::{TransportCollective, TransportConfig, Vendor};
use collective_core::bootstrap::Bootstrap;
use collective_core::protocol::Timeouts;
use collective_core::{Error, Op, Route, host_identity};
use hip_ipc::{HipDevice, HipIpcCollective, HipIpcConfig};
use std::sync::Arc;

/// The ROCm platform's collective.
pub type RocmCollective = Routed<HipIpcCollective, TransportCollective<HipDevice>>;

/// Whether this process can drive an AMD GPU (libamdhip64 loadable, a device present).
pub(crate) fn present() -> bool {
    hip_ipc::runtime::device_count().is_ok_and(|n| n > 0)
}

/// The GPU of the rank with local rank `local_rank`: `local_rank % device count`.
fn ordinal(local_rank: usize) -> Result<usize, Error> {
    match hip_ipc::runtime::device_count()? {
        0 => Err(Error::InvalidConfig { detail: "no HIP device is visible to this process".into() }),
        n => Ok(local_rank % n),
    }
}

/// This rank of the ROCm collective of every rank of `boot`, on the GPU `config` selects
/// ([`DeviceSelect::LocalRank`]: `LOCAL_RANK % device count`), routed by `DETCOLL_ROUTING_TABLE`
/// or the seeds' MI300X table unless `config` has one. Collective: every rank calls it; every
/// rank gets the same decision or the same error.
pub fn from_bootstrap(boot: Arc<dyn Bootstrap>, config: &Config) -> Result<RocmCollective, Error> {
    let ordinal = match config.device() {
        DeviceSelect::Ordinal(o) => Ok(o),
        _ => ordinal(boot.local_rank()),
    };
    build(boot, config, ordinal)
}

/// This rank of the ROCm collective on `device`, the caller's own HIP device (the engine's
/// ordinal; the collective loads its kernels on it). Collective over `boot`, like
/// [`from_bootstrap`].
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use collective_core::bootstrap::TcpBootstrap;
/// use collective_factory::{Config, rocm};
/// use std::sync::Arc;
/// let device = hip_ipc::HipDevice::open(0)?;
/// let comm = rocm::from_device(Arc::new(TcpBootstrap::from_env()?), &device, &Config::new())?;
/// # let _ = comm; Ok(()) }
/// ```
pub fn from_device(boot: Arc<dyn Bootstrap>, device: &HipDevice, config: &Config) -> Result<RocmCollective, Error> {
    build(boot, config, Ok(device.ordinal()))
}

/// `world` ranks as threads of this process, rank `r` on GPU `r % device count`, on the HIP
/// IPC twin alone (peer pointers; RCCL is not built for thread ranks). Hand one handle to each
/// thread; give each its own stream.
pub fn thread_group(world: usize, config: &Config) -> Result<Vec<HipIpcCollective>, Error> {
    let count = hip_ipc::runtime::device_count()?;
    if count == 0 {
        return Err(Error::InvalidConfig { detail: "no HIP device is visible to this process".into() });
    }
    let routing = match config.routing() {
        Some(r) => r.clone(),
        None => Routing::from_env(Platform::Rocm)?,
    };
    let threshold = routing.first_bytes(Op::AllReduce, Route::IpcReduceScatterAllGather).unwrap_or(usize::MAX);
    let mut c = HipIpcConfig::new(config.capacity()).with_ll_capacity(routing.ll_capacity(config.ll_capacity()));
    c.timeouts = config.timeouts();
    c.max_blocks = config.max_blocks();
    let ordinals: Vec<usize> = (0..world).map(|r| r % count).collect();
    hip_ipc::group(&ordinals, &c.with_rsag_threshold(threshold))
}

fn build(boot: Arc<dyn Bootstrap>, config: &Config, ordinal: Result<usize, Error>) -> Result<RocmCollective, Error> {
    let (capacity, routing, timeouts) = (config.capacity(), config.routing().cloned(), config.timeouts());
    let max_blocks = config.max_blocks();
    let mut errors = Vec::new();
    let routing = match routing {
        Some(r) => r,
        None => Facts::local(&mut errors, Routing::from_env(Platform::Rocm), || Routing::default_for(Platform::Rocm)),
    };
    let platform = Facts::local(&mut errors, Platform::detect(), || Platform::Rocm);
    let host = Facts::local(&mut errors, host_identity(), String::new);
    if let Err(e) = Timeouts::resolve(timeouts) {
        errors.push(e.to_string());
    }
    // The device first: its PCI bus id tells the agreement which ranks share a GPU. A rank that
    // cannot use it still takes part in the agreement (reporting no IPC) and fails after it.
    let device = ordinal.as_ref().ok().and_then(|&o| hip_ipc::runtime::pci_bus_id(o).ok()).unwrap_or_default();
    let rccl = ccl_transport::load(Some(Vendor::Amd)).ok();
    let hip = hip_ipc::runtime::versions().ok().map(|(r, d)| format!("hip-runtime={r},hip-driver={d}"));
    let rccl_version = rccl.as_ref().and_then(|l| l.version().ok()).map(|v| format!("rccl={v}"));
    let facts = Facts {
        platform: platform.name().to_string(),
        host,
        ipc: ordinal.is_ok(),
        transport: rccl.is_some(),
        versions: hip.into_iter().chain(rccl_version).collect(),
        capacity,
        routing: routing.canonical_json(),
        device,
        errors,
    };
    let d = facts.agree(&*boot)?;
    if d.platform != Platform::Rocm {
        return Err(Error::InvalidConfig {
            detail: format!("every rank reports platform {}, not rocm", d.platform.name()),
        });
    }
    // One device for both backends: they share the loaded code object.
    let device = HipDevice::open(ordinal?)?;
    let world = boot.world_size();
    let ipc = if d.ipc || world == 1 {
        let threshold = d.routing.first_bytes(Op::AllReduce, Route::IpcReduceScatterAllGather).unwrap_or(usize::MAX);
        let ll = d.routing.ll_capacity(config.ll_capacity());
        let config = HipIpcConfig::new(capacity).with_rsag_threshold(threshold).with_ll_capacity(ll);
        let mut config = config;
        config.timeouts = timeouts;
        config.max_blocks = max_blocks;
        // hip_ipc::new_on: ranks sharing a GPU are refused unless DETCOLL_HIP_ALLOW_SHARED_GPU=1.
        Some(hip_ipc::new_on(Box::new(boot.clone()), device.clone(), &config)?)
    } else {
        None
    };
    let transport = if d.transport {
        let mut t = TransportConfig::new(capacity);
        t.timeouts = timeouts;
        Some(TransportCollective::with_device(|| Ok(device.clone()), &*boot, &t)?)
    } else {
        None
    };
    Routed::new(boot.rank(), world, capacity, d.routing, ipc, transport)
}
