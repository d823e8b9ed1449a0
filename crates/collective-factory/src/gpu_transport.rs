//! The transport of a GPU platform: NCCL/RCCL, or the host-staged transport where they cannot
//! serve a group of ranks (two of its ranks on one GPU, which they refuse; a rank without the
//! library). The agreement picks one per group ([`crate::Decision::staged`],
//! [`crate::Decision::cross_staged`]); both evaluate `fixed-tree`'s tree, so the bits are the
//! same.
use ccl_transport::{Device, TransportCollective};
use collective_core::{Capabilities, Collective, Error, Io, Op, Route};
use detcoll_host_transport::StagedTransport;
use detcoll_protocol::RawStream;

/// A GPU platform's transport (see the module docs).
#[derive(Debug)]
pub enum GpuTransport<D: Device> {
    /// NCCL or RCCL.
    Ccl(TransportCollective<D>),
    /// Device to host, the host transport over the bootstrap, host to device: no graph
    /// capture, host bandwidth. For virtual nodes on one GPU and more ranks than GPUs.
    HostStaged(StagedTransport<D>),
}

impl<D: Device> GpuTransport<D> {
    /// NCCL/RCCL, if that is what runs.
    pub fn ccl(&self) -> Option<&TransportCollective<D>> {
        match self {
            GpuTransport::Ccl(t) => Some(t),
            GpuTransport::HostStaged(_) => None,
        }
    }

    /// Whether this is the host-staged transport.
    pub fn is_host_staged(&self) -> bool {
        matches!(self, GpuTransport::HostStaged(_))
    }

    /// The device it runs on.
    pub fn device(&self) -> &D {
        match self {
            GpuTransport::Ccl(t) => t.device(),
            GpuTransport::HostStaged(t) => t.device(),
        }
    }

    /// Device workspace it keeps between calls (the host-staged one keeps none).
    pub fn workspace_bytes(&self) -> usize {
        self.ccl().map_or(0, TransportCollective::workspace_bytes)
    }

    /// One single-lane call on a raw stream, signed with `part` where the transport signs
    /// calls (`Collective::call_as_part`: host-staged; NCCL/RCCL signs nothing).
    ///
    /// # Safety
    /// As `TransportCollective::enqueue`: the views are device memory of this device, valid
    /// until `stream` has executed the call; `stream` is a live stream of this device.
    pub(crate) unsafe fn enqueue(&self, op: Op, io: Io<'_>, part: u32, stream: RawStream) -> Result<(), Error> {
        match self {
            // SAFETY: forwarded from the caller.
            GpuTransport::Ccl(t) => unsafe { t.enqueue(op, io, stream) },
            // SAFETY: as above.
            GpuTransport::HostStaged(t) => unsafe { t.enqueue_as_part(op, io, part, stream) },
        }
    }

    /// `reduce_scatter_many` on a raw stream, signed with `part` where the transport signs
    /// calls (as [`GpuTransport::enqueue`]).
    ///
    /// # Safety
    /// As [`GpuTransport::enqueue`], for every lane.
    pub(crate) unsafe fn enqueue_many(&self, lanes: &[Io<'_>], part: u32, stream: RawStream) -> Result<(), Error> {
        match self {
            // SAFETY: forwarded from the caller.
            GpuTransport::Ccl(t) => unsafe { t.enqueue_many(lanes, stream) },
            // SAFETY: as above.
            GpuTransport::HostStaged(t) => unsafe { t.enqueue_many_as_part(lanes, part, stream) },
        }
    }

    fn inner(&self) -> &dyn Collective<Stream = D::Stream> {
        match self {
            GpuTransport::Ccl(t) => t,
            GpuTransport::HostStaged(t) => t,
        }
    }
}

impl<D: Device> Collective for GpuTransport<D> {
    type Stream = D::Stream;

    fn rank(&self) -> usize {
        self.inner().rank()
    }
    fn world_size(&self) -> usize {
        self.inner().world_size()
    }
    fn capabilities(&self) -> Capabilities {
        self.inner().capabilities()
    }
    fn route(&self, op: Op, bytes: usize) -> Route {
        self.inner().route(op, bytes)
    }
    fn host_memory(&self) -> bool {
        self.inner().host_memory()
    }
    fn call(&self, op: Op, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.inner().call(op, io, stream)
    }
    fn call_as_part(&self, op: Op, io: Io<'_>, part: u32, stream: &D::Stream) -> Result<(), Error> {
        self.inner().call_as_part(op, io, part, stream)
    }
    fn all_reduce(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.inner().all_reduce(io, stream)
    }
    fn all_gather(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.inner().all_gather(io, stream)
    }
    fn reduce_scatter(&self, io: Io<'_>, stream: &D::Stream) -> Result<(), Error> {
        self.inner().reduce_scatter(io, stream)
    }
    fn reduce_scatter_many(&self, lanes: &[Io<'_>], stream: &D::Stream) -> Result<(), Error> {
        self.inner().reduce_scatter_many(lanes, stream)
    }
    fn reduce_scatter_many_as_part(&self, lanes: &[Io<'_>], part: u32, stream: &D::Stream) -> Result<(), Error> {
        self.inner().reduce_scatter_many_as_part(lanes, part, stream)
    }
    fn check(&self) -> Result<(), Error> {
        self.inner().check()
    }
    fn synchronize(&self, stream: &D::Stream) -> Result<(), Error> {
        self.inner().synchronize(stream)
    }
    fn close(&self) -> Result<(), Error> {
        self.inner().close()
    }
    fn abandon(&self, cause: &str) {
        self.inner().abandon(cause);
    }
}
