//! The NVIDIA platform: the CUDA IPC twin for IPC routes and NCCL as the transport, composed
//! by the agreed routing (feature `cuda`).
//!
//! Status: agrees like the CPU platform (same `Facts`/`decide`, plus each rank's GPU UUID so
//! ranks sharing a GPU are routed without NCCL). Run on H200s: world 1 (`tests/nvidia.rs`) and
//! world 2 on two GPUs with every route forced in turn, bit-exact (`tests/nvidia_routes.rs`);
//! worlds 4 and 8 need more GPUs than were lent.
use crate::{Facts, Platform, Routed, Routing};
use ccl_transport::{TransportCollective, TransportConfig};
use collective_core::bootstrap::Bootstrap;
use collective_core::protocol::Timeouts;
use collective_core::{Error, Op, Route, host_identity};
use cuda_ipc::{CudaDevice, CudaIpcCollective, CudaIpcConfig};
use std::sync::Arc;

/// The NVIDIA platform's collective.
pub type NvidiaCollective = Routed<CudaIpcCollective, TransportCollective<CudaDevice>>;

/// What every rank passes to [`nvidia_collective`] (checked equal where it matters).
#[derive(Debug, Clone)]
pub struct NvidiaConfig {
    /// Staging bytes per rank (the most one rank contributes to one call).
    pub capacity: usize,
    /// Replaces the table (default: `DETCOLL_ROUTING_TABLE`, else the built-in NVIDIA table).
    pub routing: Option<Routing>,
    /// Bounds on waits (`None`: `DETCOLL_TIMEOUT_MS`, else the defaults; read at construction).
    pub timeouts: Option<Timeouts>,
}

impl NvidiaConfig {
    /// `capacity` bytes of staging, default routing and timeouts.
    pub fn new(capacity: usize) -> Self {
        NvidiaConfig { capacity, routing: None, timeouts: None }
    }
}

/// Whether this process can drive an NVIDIA GPU (libcuda loadable, a device present).
pub(crate) fn present() -> bool {
    cuda_ipc::driver::driver_present() && cuda_ipc::driver::device_count().is_ok_and(|n| n > 0)
}

/// Builds the NVIDIA collective on GPU `local_rank % device count` for every rank of `boot`.
/// Collective: every rank calls it; every rank gets the same decision or the same error.
pub fn nvidia_collective(boot: Arc<dyn Bootstrap>, config: &NvidiaConfig) -> Result<NvidiaCollective, Error> {
    let mut errors = Vec::new();
    let routing = match &config.routing {
        Some(r) => r.clone(),
        None => Facts::local(&mut errors, Routing::from_env_for_world(Platform::Nvidia, boot.world_size()), || {
            Routing::default_for_world(Platform::Nvidia, boot.world_size())
        }),
    };
    let platform = Facts::local(&mut errors, Platform::detect(), || Platform::Nvidia);
    let host = Facts::local(&mut errors, host_identity(), String::new);
    if let Err(e) = Timeouts::resolve(config.timeouts) {
        errors.push(e.to_string());
    }
    // The device first: its UUID tells the agreement which ranks share a GPU. A rank that
    // cannot open it still takes part in the agreement (reporting no IPC) and fails after it.
    let ctx =
        cuda_ipc::driver::device_count().and_then(|n| cuda_ipc::driver::open_device(boot.local_rank() % n.max(1)));
    let device = ctx.as_ref().ok().and_then(|c| cuda_ipc::driver::uuid(c).ok()).map(hex).unwrap_or_default();
    let nccl = ccl_transport::load(Some(ccl_transport::Vendor::Nvidia)).ok();
    let version = nccl.as_ref().and_then(|l| l.version().ok()).map(|v| format!("nccl={v}"));
    let facts = Facts {
        platform: platform.name().to_string(),
        host,
        ipc: ctx.is_ok(),
        transport: nccl.is_some(),
        versions: version.into_iter().collect(),
        capacity: config.capacity,
        routing: routing.canonical_json(),
        device,
        errors,
    };
    let d = facts.agree(&*boot)?;
    if d.platform != Platform::Nvidia {
        return Err(Error::InvalidConfig {
            detail: format!("every rank reports platform {}, not nvidia", d.platform.name()),
        });
    }
    // One device for both backends: they share the context and the loaded kernels.
    let device = CudaDevice::new(&ctx?)?;
    let world = boot.world_size();
    let ipc = if d.ipc || world == 1 {
        // The routing table decides every call's route (`Routed`); the threshold only serves
        // direct users of the IPC collective's own `route()`.
        let threshold = d.routing.first_bytes(Op::AllReduce, Route::IpcReduceScatterAllGather).unwrap_or(usize::MAX);
        let c = CudaIpcConfig::new(config.capacity).with_rsag_threshold(threshold);
        let c = CudaIpcConfig { timeouts: config.timeouts, ..c };
        Some(CudaIpcCollective::new(Box::new(boot.clone()), device.clone(), &c)?)
    } else {
        None
    };
    let transport = if d.transport {
        let t = TransportConfig { timeouts: config.timeouts, ..TransportConfig::new(config.capacity) };
        Some(TransportCollective::with_device(|| Ok(device.clone()), &*boot, &t)?)
    } else {
        None
    };
    Routed::new(boot.rank(), world, config.capacity, d.routing, ipc, transport)
}

fn hex(bytes: [u8; 16]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
