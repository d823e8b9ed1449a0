//! The backends of `collective_core::conformance_suite!` for a vendor: ranks as threads of
//! this process (on one GPU or across GPUs) and ranks as processes.
use crate::{GpuRank, TestGpu, checked, gpu, gpu_lock, run_ranks};
use collective_core::conformance::{CHILD_ENV, TestBackend, run_processes, skip};
use collective_core::{Collective, bootstrap::Bootstrap};
use ipc_engine::{Device, IpcCollective};
use std::marker::PhantomData;
use std::time::Duration;

/// The conformance suites' configuration (shared with the host device's suites):
/// [`detcoll_protocol::suite::ipc_suite_config`].
pub use detcoll_protocol::suite::ipc_suite_config as suite_config;

/// Where the ranks of a world of `world` threads run (rank `r` on the `r`-th device; ranks of
/// one GPU share one device value), or `Ok(None)` after printing why such a world cannot run
/// here.
pub type Place<G> = fn(world: usize) -> Result<Option<Vec<<G as TestGpu>::Device>>, String>;

/// Every rank on device 0; `None` (skipped: no device) without one.
pub fn one_gpu<G: TestGpu>(world: usize) -> Result<Option<Vec<G::Device>>, String> {
    Ok(gpu::<G>().map(|d| vec![d; world]))
}

/// Rank `r` on device `r % device_count`, ranks of one device sharing it, peers on other
/// devices reached through peer access; `None` (skipped) with fewer than 2 devices.
pub fn across_gpus<G: TestGpu>(world: usize) -> Result<Option<Vec<G::Device>>, String> {
    let devices = match G::device_count() {
        Ok(n) if n >= 2 => n,
        Ok(n) => {
            skip(&format!("needs 2+ GPUs (the runtime reports {n})"));
            return Ok(None);
        }
        Err(e) => {
            skip(&format!("needs 2+ GPUs (no {} device: {e})", G::RUNTIME));
            return Ok(None);
        }
    };
    let opened = (0..devices.min(world)).map(G::open).collect::<Result<Vec<_>, _>>()?;
    Ok(Some((0..world).map(|r| opened[r % devices].clone()).collect()))
}

/// A conformance backend of ranks as threads of this process, placed by `place` (one GPU or
/// several), one world on the GPUs at a time.
pub struct Threads<G: TestGpu> {
    name: &'static str,
    place: Place<G>,
    _gpu: PhantomData<fn() -> G>,
}

impl<G: TestGpu> std::fmt::Debug for Threads<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Threads").field("name", &self.name).finish_non_exhaustive()
    }
}

impl<G: TestGpu> Threads<G> {
    /// The backend called `name` in failure messages, its ranks placed by `place`
    /// ([`one_gpu`], [`across_gpus`]).
    pub fn new(name: &'static str, place: Place<G>) -> Self {
        Threads { name, place, _gpu: PhantomData }
    }
}

impl<G: TestGpu> TestBackend for Threads<G> {
    type Rank = GpuRank<G>;
    fn name(&self) -> String {
        self.name.into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        _test: &str,
        case: &(dyn Fn(&mut GpuRank<G>) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        let Some(devices) = (self.place)(world)? else { return Ok(()) };
        let _one_world = gpu_lock();
        let config = suite_config(capacity, Duration::from_secs(20));
        let comms = IpcCollective::group(&devices, &config).map_err(|e| e.to_string())?;
        run_ranks::<G, _>(comms, G::REGION_BYTES, |rank| checked(rank, case))
    }
}

/// A conformance backend with every rank its own process on device
/// [`TestGpu::process_ordinal`], allocations exchanged as IPC handles over the TCP bootstrap.
/// Runs only when [`TestGpu::PROCESS_ENV`] is `1` (processes sharing one GPU must run
/// concurrently, which may need set-up such as MPS); otherwise each test prints why it was
/// skipped.
pub struct Processes<G: TestGpu> {
    name: &'static str,
    _gpu: PhantomData<fn() -> G>,
}

impl<G: TestGpu> std::fmt::Debug for Processes<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Processes").field("name", &self.name).finish_non_exhaustive()
    }
}

impl<G: TestGpu> Processes<G> {
    /// The backend called `name` in failure messages.
    pub fn new(name: &'static str) -> Self {
        Processes { name, _gpu: PhantomData }
    }
}

impl<G: TestGpu> TestBackend for Processes<G> {
    type Rank = GpuRank<G>;
    fn name(&self) -> String {
        self.name.into()
    }
    fn run(
        &self,
        world: usize,
        capacity: usize,
        test: &str,
        case: &(dyn Fn(&mut GpuRank<G>) -> Result<(), String> + Sync),
    ) -> Result<(), String> {
        if std::env::var_os(CHILD_ENV).is_none() {
            let (var, why) = G::PROCESS_ENV;
            if std::env::var(var).as_deref() != Ok("1") {
                skip(&format!("set {var}=1 ({why})"));
                return Ok(());
            }
            // Only the ranks open a device: the parent is not one more context (an MPS client).
            if let Err(e) = G::device_count() {
                skip(&format!("no {} device ({e})", G::RUNTIME));
                return Ok(());
            }
        }
        let _one_world = gpu_lock();
        let config = suite_config(capacity, Duration::from_secs(30));
        run_processes(
            world,
            test,
            |boot: Box<dyn Bootstrap>| {
                let device = G::open(G::process_ordinal(boot.rank())?)?;
                let config = G::process_config(&device, world, config)?;
                // Memory first: no allocation once peers may have kernels in flight.
                let region = device.alloc(G::REGION_BYTES).map_err(|e| e.to_string())?;
                let stream = G::new_stream(&device)?;
                let comm = IpcCollective::new(boot, device, &config).map_err(|e| e.to_string())?;
                Ok(GpuRank::<G>::owning(comm, stream, region))
            },
            &|rank: &mut GpuRank<G>| checked(rank, case),
            |rank| rank.comm.close().map_err(|e| e.to_string()),
        )
    }
}
