//! What the GPU platforms (`nvidia`, `rocm`) build the same way from one [`Config`]: the IPC
//! engine's configuration and the NCCL/RCCL transport where the agreement chose it.
use crate::{Config, Decision, Routing};
use ccl_transport::{Device, TransportCollective, TransportConfig};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;
use collective_core::protocol::IpcConfig;

/// The IPC engine's configuration. The routing table decides every call's route (`Routed`);
/// the RS+AG threshold only serves direct users of the IPC collective's own `route()`.
pub(crate) fn ipc_config(config: &Config, routing: &Routing) -> IpcConfig {
    let threshold = routing.rsag_threshold();
    let mut c = IpcConfig::new(config.capacity())
        .with_rsag_threshold(threshold)
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
    let mut t = TransportConfig::new(config.capacity());
    t.timeouts = config.timeouts();
    TransportCollective::with_device(|| Ok(device.clone()), boot, &t).map(Some)
}
