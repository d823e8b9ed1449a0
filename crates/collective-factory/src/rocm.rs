//! The ROCm platform: the HIP IPC twin for IPC routes (feature `rocm`).
//!
//! The RCCL transport has no HIP device side yet (`ccl-transport`'s `Device` trait awaits a HIP
//! implementation), so every rank reports no transport and agreement maps the MI300X table's
//! transport ranges to IPC (same bits). Nothing here has run: no AMD GPU was available
//! (docs/rocm.md).
use crate::{Facts, NoTransport, Platform, Routed, Routing};
use collective_core::bootstrap::Bootstrap;
use collective_core::protocol::Timeouts;
use collective_core::{Error, Op, Route, host_identity};
use hip_ipc::{HipIpcCollective, HipIpcConfig, Stream};
use std::sync::Arc;

/// The ROCm platform's collective.
pub type RocmCollective = Routed<HipIpcCollective, NoTransport<Stream>>;

/// Whether this process can drive an AMD GPU (libamdhip64 loadable, a device present).
pub(crate) fn present() -> bool {
    hip_ipc::runtime::device_count().is_ok_and(|n| n > 0)
}

/// Builds the ROCm collective on GPU `local_rank % device count` for every rank of `boot`, with
/// `capacity` bytes of staging and `routing` (default: `DETCOLL_ROUTING_TABLE`, else the
/// seeds' MI300X table). Collective.
pub fn rocm_collective(
    boot: Arc<dyn Bootstrap>,
    capacity: usize,
    routing: Option<Routing>,
    timeouts: Timeouts,
) -> Result<RocmCollective, Error> {
    let routing = match routing {
        Some(r) => r,
        None => Routing::from_env(Platform::Rocm)?,
    };
    let version = hip_ipc::runtime::versions().ok().map(|(r, d)| format!("hip-runtime={r},hip-driver={d}"));
    let facts = Facts {
        platform: Platform::detect().name().to_string(),
        host: host_identity(),
        ipc: present(),
        transport: false,
        versions: version.into_iter().collect(),
        capacity,
        routing: routing.canonical_json(),
        device: String::new(),
    };
    let d = facts.agree(&*boot)?;
    if d.platform != Platform::Rocm {
        return Err(Error::InvalidConfig {
            detail: format!("every rank reports platform {}, not rocm", d.platform.name()),
        });
    }
    let count = hip_ipc::runtime::device_count()?;
    let threshold = d.routing.first_bytes(Op::AllReduce, Route::IpcReduceScatterAllGather).unwrap_or(usize::MAX);
    let config = HipIpcConfig::new(capacity).with_rsag_threshold(threshold).with_timeouts(timeouts);
    let ipc = HipIpcCollective::new(Box::new(boot.clone()), boot.local_rank() % count.max(1), &config)?;
    Routed::new(boot.rank(), boot.world_size(), capacity, d.routing, Some(ipc), None)
}
