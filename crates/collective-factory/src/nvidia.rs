//! The NVIDIA platform (feature `cuda`): the CUDA IPC twin for IPC routes and NCCL as the
//! transport, composed by the agreed routing.
//!
//! Three ways in, one configuration ([`Config`]):
//! * [`from_bootstrap`] — one process per rank (torchrun, `detcoll-run`, your launcher), on
//!   GPU `LOCAL_RANK % count` or the one [`Config::with_device`] names;
//! * [`from_context`] — one process per rank, on the engine's own `CudaContext` (share its
//!   context with your GEMMs);
//! * [`thread_group`] — ranks as threads of this process, rank `r` on GPU `r % count`; NCCL is
//!   built where every rank has a GPU of its own.
//!
//! Agreement: every rank reports its facts (platform, host, libraries, GPU UUID) and every rank
//! takes the same decision or returns the same error; ranks sharing a GPU are routed without
//! NCCL (it refuses them). Run on H200s: worlds 1 and 2 (one process per GPU, every route
//! forced); worlds 4 and 8 need more GPUs than were lent.
//!
//! Errors, the same on every entry point: no CUDA driver (or another library a rank needs
//! before the agreement) is `LibraryMissing` — with [`from_bootstrap`] on every rank, naming
//! the ranks that lack it, since a rank that failed still takes part in the agreement; any
//! other local failure (a device that does not open, a `DETCOLL_*` variable that does not
//! parse, an invalid [`Config`]) is `InvalidConfig` on every rank, naming the ranks; a world of
//! 0 ranks is `InvalidConfig`.
use crate::compose::{ThreadIpc, ipc_config, nodes, thread_ranks, transport, world_blocks};
use crate::gpu_transport::GpuTransport;
use crate::nodes::NodeLayout;
use crate::{Config, DeviceSelect, Facts, Platform, Routed, Routing};
use collective_core::Timeouts;
use collective_core::bootstrap::Bootstrap;
use collective_core::{Error, host_identity};
use cuda_ipc::cudarc::driver::CudaContext;
use cuda_ipc::{CudaDevice, CudaIpcCollective};
use std::sync::Arc;

/// The NVIDIA platform's collective: typed entry points for cudarc buffers are in
/// [`crate::cuda_api`], raw ones (`u64` device pointers and a `CUstream`) beside them.
pub type NvidiaCollective = Routed<CudaIpcCollective, GpuTransport<CudaDevice>>;

/// Whether this process can drive an NVIDIA GPU (libcuda loadable, a device present).
pub(crate) fn present() -> bool {
    // `device_count` checks the driver first (`LibraryMissing`, never a panic).
    cuda_ipc::driver::device_count().is_ok_and(|n| n > 0)
}

/// This rank of the NVIDIA collective of every rank of `boot`, on the GPU `config` selects
/// ([`DeviceSelect::LocalRank`]: `LOCAL_RANK % device count`). Collective: every rank calls
/// it; every rank gets the same decision or the same error.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use collective_factory::bootstrap::TcpBootstrap;
/// use collective_factory::{Config, nvidia};
/// use std::sync::Arc;
/// // In each process started by torchrun or `detcoll-run --nproc 8 -- ...`:
/// let comm = nvidia::from_bootstrap(Arc::new(TcpBootstrap::from_env()?), &Config::new())?;
/// # let _ = comm; Ok(()) }
/// ```
pub fn from_bootstrap(boot: Arc<dyn Bootstrap>, config: &Config) -> Result<NvidiaCollective, Error> {
    // A rank that cannot open its device (no driver: `LibraryMissing`) still takes part in the
    // agreement and fails after it, so its peers get the same error instead of waiting.
    let ctx = cuda_ipc::driver::device_count().and_then(|n| {
        let ordinal = match config.device() {
            DeviceSelect::Ordinal(o) => o,
            _ => boot.local_rank() % n.max(1),
        };
        cuda_ipc::driver::open_device(ordinal)
    });
    build(boot, ctx.and_then(|c| CudaDevice::new(&c)), config)
}

/// This rank of the NVIDIA collective on `ctx`, the caller's own context (and device).
/// Collective over `boot`, like [`from_bootstrap`].
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use collective_factory::bootstrap::TcpBootstrap;
/// use collective_factory::{Config, nvidia};
/// use collective_factory::cudarc::driver::CudaContext;
/// use std::sync::Arc;
/// let ctx = CudaContext::new(0)?; // the engine's context
/// let comm = nvidia::from_context(Arc::new(TcpBootstrap::from_env()?), &ctx, &Config::new())?;
/// # let _ = comm; Ok(()) }
/// ```
pub fn from_context(
    boot: Arc<dyn Bootstrap>,
    ctx: &Arc<CudaContext>,
    config: &Config,
) -> Result<NvidiaCollective, Error> {
    build(boot, CudaDevice::new(ctx), config)
}

/// `world` ranks as threads of this process, rank `r` on GPU `r % device count`: the IPC
/// routes use peers' pointers directly (no IPC handles); NCCL is built when every rank has a
/// GPU of its own. Hand one handle to each thread; give each its own stream.
///
/// Ranks sharing one GPU must enqueue in call order (see
/// `IpcCollective::group` of the ipc-engine crate).
///
/// `world` 0 or an invalid `config` ([`Config::validate`]) is `InvalidConfig`; no CUDA
/// driver is `LibraryMissing`.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use collective_factory::{Config, nvidia};
/// let ranks = nvidia::thread_group(2, &Config::new().with_capacity(1 << 20))?;
/// assert_eq!(ranks.len(), 2);
/// # Ok(()) }
/// ```
pub fn thread_group(world: usize, config: &Config) -> Result<Vec<NvidiaCollective>, Error> {
    config.validate_world(world)?;
    let count = cuda_ipc::driver::device_count()?;
    if count == 0 {
        return Err(Error::InvalidConfig { detail: "no CUDA device is visible".into() });
    }
    let mut devices: Vec<CudaDevice> = Vec::with_capacity(world);
    for r in 0..world {
        let d = match devices.get(r % count) {
            Some(d) if r >= count => d.clone(),
            _ => CudaDevice::open(r % count)?,
        };
        devices.push(d);
    }
    let routing = local_routing(config, world)?;
    routing.check_for(Platform::Nvidia, world)?;
    let ipc_config = ipc_config(config, &routing);
    // More ranks than one IPC world holds: one IPC collective per node of the one-host layout
    // (the agreement takes the same layout), the hierarchical route across them.
    let ipc = match NodeLayout::of_one_host(world) {
        Some(layout) => {
            let node_config = world_blocks(&devices, ipc_config.clone())?;
            let mut local = Vec::with_capacity(world);
            for node in devices.chunks(layout.local) {
                local.extend(CudaIpcCollective::group(node, &node_config)?);
            }
            ThreadIpc::Nodes(local)
        }
        None => ThreadIpc::World(CudaIpcCollective::group(&devices, &ipc_config)?),
    };
    // NCCL refuses two ranks of one process on one GPU; the agreement compares the devices of
    // every group that would use it (GPU UUIDs) and stages through the host where one is shared.
    let nccl = crate::compose::transport_library(ccl_transport::Vendor::Nvidia)?.is_some();
    thread_ranks(&devices, ipc, &routing, config, |device, routing| facts(device, routing, config, nccl))
}

/// The routing this rank asks for: the config's, `DETCOLL_ROUTING_TABLE`, else the built-in
/// table for `world` ranks.
fn local_routing(config: &Config, world: usize) -> Result<Routing, Error> {
    match config.routing() {
        Some(r) => Ok(r.clone()),
        None => Routing::from_env_for_world(Platform::Nvidia, world),
    }
}

/// What this rank reports to the agreement. Local failures travel in `errors`.
fn facts(device: &CudaDevice, routing: Routing, config: &Config, nccl: bool) -> Facts {
    let mut errors = Vec::new();
    let platform = Facts::local(&mut errors, Platform::detect(), || Platform::Nvidia);
    let host = Facts::local(&mut errors, host_identity(), String::new);
    Facts::local(&mut errors, Timeouts::resolve(config.timeouts()).map(drop), || ());
    let uuid = cuda_ipc::driver::uuid(device.context()).map(hex).unwrap_or_default();
    let lib = nccl.then(|| ccl_transport::load(Some(ccl_transport::Vendor::Nvidia)).ok()).flatten();
    let version = lib.as_ref().and_then(|l| l.version().ok()).map(|v| format!("nccl={v}"));
    let transport_config = crate::compose::transport_facts(config, &mut errors);
    Facts {
        platform: platform.name().to_string(),
        host,
        ipc: true,
        transport: lib.is_some(),
        versions: version.into_iter().collect(),
        capacity: config.capacity(),
        routing: routing.canonical_json(),
        device: uuid,
        errors,
        missing: Vec::new(),
        // The node's IPC collective and a transport across nodes (NCCL per rail, or staged).
        nodes: true,
        transport_config,
        staged: true,
    }
}

/// The process-rank composition: agreement (a rank whose device failed still takes part and
/// reports it: a missing library is `LibraryMissing` on every rank, anything else
/// `InvalidConfig`, both naming the failing ranks), then the IPC collective (CUDA IPC
/// handles) and NCCL, sharing one device.
fn build(
    boot: Arc<dyn Bootstrap>,
    device: Result<CudaDevice, Error>,
    config: &Config,
) -> Result<NvidiaCollective, Error> {
    let world = boot.world_size();
    let mut errors = Vec::new();
    Facts::local(&mut errors, config.validate(), || ());
    let routing = match config.routing() {
        Some(r) => r.clone(),
        None => Facts::local(&mut errors, Routing::from_env_for_world(Platform::Nvidia, world), || {
            Routing::default_for_world(Platform::Nvidia, world)
        }),
    };
    Facts::local(&mut errors, routing.check_for(Platform::Nvidia, world), || ());
    let nccl = Facts::local(
        &mut errors,
        crate::compose::transport_library(ccl_transport::Vendor::Nvidia).map(|l| l.is_some()),
        || false,
    );
    let (mut f, device) = match device {
        Ok(dev) => (facts(&dev, routing, config, nccl), Some(dev)),
        Err(e) => {
            // Facts of a device-less rank, its failure reported through the agreement.
            let mut f = Facts {
                platform: Platform::Nvidia.name().into(),
                host: host_identity().unwrap_or_default(),
                ipc: false,
                transport: false,
                versions: Vec::new(),
                capacity: config.capacity(),
                routing: routing.canonical_json(),
                device: String::new(),
                errors: Vec::new(),
                missing: Vec::new(),
                nodes: false,
                transport_config: crate::compose::transport_facts(config, &mut Vec::new()),
                staged: false,
            };
            f.fail("opening its CUDA device", e);
            (f, None)
        }
    };
    f.errors.extend(errors);
    let d = f.agree(&*boot)?;
    if d.platform != Platform::Nvidia {
        return Err(Error::InvalidConfig {
            detail: format!("every rank reports platform {}, not nvidia", d.platform.name()),
        });
    }
    // The agreement fails whenever a rank reported a failure, so the device is here.
    let device = device.ok_or_else(|| Error::InvalidConfig { detail: "no CUDA device was opened".into() })?;
    let ipc = if d.ipc || world == 1 {
        Some(CudaIpcCollective::new(Box::new(boot.clone()), device.clone(), &ipc_config(config, &d.routing))?)
    } else {
        None
    };
    let transport = transport(&d, &device, &boot, config)?;
    let routed = Routed::new(boot.rank(), world, config.capacity(), d.routing.clone(), ipc, transport)?;
    let Some(layout) = d.nodes else { return Ok(routed) };
    let nodes =
        nodes(&d, layout, &device, &boot, config, |node, c| CudaIpcCollective::new(Box::new(node), device.clone(), c))?;
    Ok(routed.with_nodes(nodes))
}

fn hex(bytes: [u8; 16]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
