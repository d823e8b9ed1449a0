//! Constructors in CUDA terms (contexts, ordinals) over the engine's generic ones
//! ([`ipc_engine::IpcCollective::group`], [`ipc_engine::IpcCollective::new`]).
use crate::device::CudaDevice;
use crate::{CudaIpcCollective, CudaIpcConfig, driver};
use collective_core::Error;
use collective_core::bootstrap::Bootstrap;
use cudarc::driver::CudaContext;
use std::sync::Arc;

/// `world` ranks as threads sharing device `ordinal` (its primary context). Returns
/// [`Error::LibraryMissing`] when there is no CUDA driver (instead of panicking). Ranks that
/// are threads sharing one context must enqueue in call order: see
/// [`ipc_engine::IpcCollective::group`].
///
/// ```no_run
/// use collective_core::Collective;
/// let ranks = cuda_ipc::group_on_ordinal(0, 2, &cuda_ipc::CudaIpcConfig::new(1 << 20)).expect("GPU 0");
/// assert_eq!(ranks[1].rank(), 1);
/// ```
pub fn group_on_ordinal(ordinal: usize, world: usize, config: &CudaIpcConfig) -> Result<Vec<CudaIpcCollective>, Error> {
    CudaIpcCollective::group_on(&CudaDevice::open(ordinal)?, world, config)
}

/// `world` ranks as threads sharing `ctx`'s device.
pub fn group_on_device(
    ctx: &Arc<CudaContext>,
    world: usize,
    config: &CudaIpcConfig,
) -> Result<Vec<CudaIpcCollective>, Error> {
    CudaIpcCollective::group_on(&CudaDevice::new(ctx)?, world, config)
}

/// One rank per entry of `ctxs` (rank `r` runs in `ctxs[r]`), all in this process; ranks in
/// one context share its device (and its loaded kernels).
pub fn group(ctxs: &[Arc<CudaContext>], config: &CudaIpcConfig) -> Result<Vec<CudaIpcCollective>, Error> {
    driver::ensure_driver()?;
    let mut devices: Vec<CudaDevice> = Vec::with_capacity(ctxs.len());
    for c in ctxs {
        let d = match devices.iter().find(|d| d.context().cu_ctx() == c.cu_ctx()) {
            Some(d) => d.clone(),
            None => CudaDevice::new(c)?,
        };
        devices.push(d);
    }
    CudaIpcCollective::group(&devices, config)
}

/// One rank of a group with one process per rank, in `ctx` (see
/// [`ipc_engine::IpcCollective::new`]).
///
/// ```no_run
/// use collective_core::bootstrap::TcpBootstrap;
/// let ctx = cuda_ipc::driver::open_device(0).expect("GPU 0");
/// let boot = TcpBootstrap::from_env().expect("rendezvous");
/// let comm = cuda_ipc::new(Box::new(boot), &ctx, &cuda_ipc::CudaIpcConfig::new(1 << 20)).expect("collective");
/// # let _ = comm;
/// ```
pub fn new(
    boot: Box<dyn Bootstrap>,
    ctx: &Arc<CudaContext>,
    config: &CudaIpcConfig,
) -> Result<CudaIpcCollective, Error> {
    CudaIpcCollective::new(boot, CudaDevice::new(ctx)?, config)
}

/// [`new`] on device `ordinal` (its primary context).
pub fn new_on_ordinal(
    boot: Box<dyn Bootstrap>,
    ordinal: usize,
    config: &CudaIpcConfig,
) -> Result<CudaIpcCollective, Error> {
    CudaIpcCollective::new(boot, CudaDevice::open(ordinal)?, config)
}
