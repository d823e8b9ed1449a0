//! [`ShmCollective`]: the CPU twin — the engine (`ipc_engine::IpcCollective`) on the host
//! device ([`crate::HostDevice`]), built from a [`ShmConfig`]. Every call takes the engine's
//! one per-call path; the protocol runs in the host executor of the kernel ABI.
use crate::config::ShmConfig;
use crate::device::HostDevice;
use collective_core::bootstrap::Bootstrap;
use collective_core::{Capabilities, Collective, Error, Io, IpcRoute, Op, Route, RouteSelect};
use ipc_engine::IpcCollective;

/// A deterministic collective over host memory (stream type `()`: calls complete before they
/// return, and a failed call returns its error).
#[derive(Debug)]
pub struct ShmCollective {
    inner: IpcCollective<HostDevice>,
}

impl ShmCollective {
    /// One process per rank: this rank's staging is a shared-memory object in `/dev/shm` that
    /// peers open through the handle `boot` carries; every rank maps every peer's. Collective:
    /// every rank of `boot` must call it with the same `config`, or all fail with
    /// [`Error::ConfigMismatch`]. A failure on one rank (a full `/dev/shm`: [`Error::OutOfMemory`];
    /// a truncated peer object: [`Error::ConfigMismatch`]; a capacity below
    /// [`detcoll_protocol::MIN_CAPACITY`]: [`Error::InvalidConfig`]) is sent to the
    /// others in its place in the exchange, so every rank returns an error at once.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use collective_core::bootstrap::TcpBootstrap;
    /// use shm_ipc::{ShmCollective, ShmConfig};
    /// // In each process started by `detcoll-run --nproc 4 -- ...` or torchrun:
    /// let comm = ShmCollective::new(&TcpBootstrap::from_env()?, ShmConfig::new(1 << 20))?;
    /// # let _ = comm; Ok(()) }
    /// ```
    pub fn new(boot: &dyn Bootstrap, config: ShmConfig) -> Result<Self, Error> {
        IpcCollective::connect(boot, HostDevice::process(), &config).map(|inner| ShmCollective { inner })
    }

    /// A world of `world` ranks as threads of this process: staging is heap memory that every
    /// rank reads directly. Hand one handle to each thread.
    ///
    /// ```
    /// use collective_core::{Collective, Io};
    /// use shm_ipc::{ShmCollective, ShmConfig};
    /// let ranks = ShmCollective::group(2, ShmConfig::new(1 << 16)).unwrap();
    /// std::thread::scope(|s| for comm in &ranks { s.spawn(move || {
    ///     let mut out = [0f32; 4];
    ///     comm.all_reduce(Io::host(&[comm.rank() as f32 + 0.5; 4], &mut out), &()).unwrap();
    ///     assert_eq!(out[0].to_bits(), (0.5f32 + 1.5).to_bits());
    /// }); });
    /// ```
    pub fn group(world: usize, config: ShmConfig) -> Result<Vec<ShmCollective>, Error> {
        let devices: Vec<HostDevice> = (0..world).map(|_| HostDevice::threads()).collect();
        let ranks = IpcCollective::group(&devices, &config)?;
        Ok(ranks.into_iter().map(|inner| ShmCollective { inner }).collect())
    }

    /// [`ShmCollective::group`] in the state reached after `start` one-shot calls (test
    /// support for generation wrap-around; see the engine's `start_generation_for_test`).
    #[doc(hidden)]
    pub fn group_at_generation(world: usize, config: ShmConfig, start: u32) -> Result<Vec<ShmCollective>, Error> {
        let ranks = Self::group(world, config)?;
        for r in &ranks {
            r.inner.start_generation_for_test(start)?;
        }
        Ok(ranks)
    }

    /// Bytes of staging and control this rank keeps for its lifetime.
    pub fn workspace_bytes(&self) -> usize {
        self.inner.workspace_bytes()
    }

    /// The engine this collective is.
    pub fn engine(&self) -> &IpcCollective<HostDevice> {
        &self.inner
    }
}

impl RouteSelect for ShmCollective {
    fn route_taken(&self, op: Op, bytes: usize, route: IpcRoute) -> Route {
        self.inner.route_taken(op, bytes, route)
    }
    fn call_on_route_as_part(&self, op: Op, io: Io<'_>, route: IpcRoute, part: u32, stream: &()) -> Result<(), Error> {
        self.inner.call_on_route_as_part(op, io, route, part, stream)
    }
    fn reduce_scatter_many_on_route_as_part(
        &self,
        lanes: &[Io<'_>],
        route: IpcRoute,
        part: u32,
        stream: &(),
    ) -> Result<(), Error> {
        self.inner.reduce_scatter_many_on_route_as_part(lanes, route, part, stream)
    }
}

impl Collective for ShmCollective {
    type Stream = ();

    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world_size(&self) -> usize {
        self.inner.world_size()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }
    fn route(&self, op: Op, bytes: usize) -> Route {
        self.inner.route(op, bytes)
    }
    fn host_memory(&self) -> bool {
        true
    }
    fn call_as_part(&self, op: Op, io: Io<'_>, part: u32, stream: &()) -> Result<(), Error> {
        self.inner.call_as_part(op, io, part, stream)
    }
    fn all_reduce(&self, io: Io<'_>, stream: &()) -> Result<(), Error> {
        self.inner.all_reduce(io, stream)
    }
    fn all_gather(&self, io: Io<'_>, stream: &()) -> Result<(), Error> {
        self.inner.all_gather(io, stream)
    }
    fn reduce_scatter(&self, io: Io<'_>, stream: &()) -> Result<(), Error> {
        self.inner.reduce_scatter(io, stream)
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], stream: &()) -> Result<(), Error> {
        self.inner.reduce_scatter_many(lanes, stream)
    }
    /// The engine's, which signs `part` (the trait's default would drop it).
    fn reduce_scatter_many_as_part(&self, lanes: &[Io<'_>], part: u32, stream: &()) -> Result<(), Error> {
        self.inner.reduce_scatter_many_as_part(lanes, part, stream)
    }
    fn check(&self) -> Result<(), Error> {
        Collective::check(&self.inner)
    }
    fn synchronize(&self, stream: &()) -> Result<(), Error> {
        self.inner.synchronize(stream)
    }
    /// The engine's: poisons this rank and tells its peers at once.
    fn abandon(&self, cause: &str) {
        self.inner.abandon(cause)
    }
    fn close(&self) -> Result<(), Error> {
        self.inner.close()
    }
}
