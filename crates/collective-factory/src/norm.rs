//! The fused all_reduce + residual + RMSNorm at the front door
//! ([`Routed::all_reduce_residual_rmsnorm`]): every argument validated before any device
//! work, the all_reduce by the agreed route (any route: the bits are the tree's), then the
//! residual + RMSNorm kernel of the rank's device on the same stream — the evaluation of
//! `fixed_tree::rmsnorm`, so `y` is bit-identical across batch sizes, routes, TP sizes (with
//! the TP-invariant layer) and runs.
//!
//! Today these are two launches in one call (the norm reads the all_reduce's output back
//! from memory); the one-kernel form on the one-shot and LL push routes is the next step.
use crate::Routed;
use crate::routed::{NoTransport, OnStream};
use crate::scratch::CallStream;
use crate::via::Via;
use collective_core::{Collective, Error, Io, NormCall, Op, RmsNorm, RouteSelect, validate, validate_norm};
use detcoll_protocol::NormDevice;
use detcoll_protocol::norm::{NormArgs, NormParams};

/// A backend that can launch the residual + RMSNorm kernel on its device.
pub trait NormBackend: Collective {
    /// Enqueues the norm of a validated call on `stream`.
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, Self::Stream>) -> Result<(), Error>;
}

/// The norm on `device`, on `stream` as the caller gave it.
pub(crate) fn launch<D: NormDevice>(
    device: &D,
    args: &NormArgs,
    stream: CallStream<'_, D::Stream>,
) -> Result<(), Error> {
    let raw = match stream {
        CallStream::Safe(s) => device.raw_stream(s)?,
        CallStream::Raw(r) => r,
    };
    device.bind()?;
    // SAFETY: `args` was validated against the call's views (front door) and packed
    // (`NormParams::pack`) before the all_reduce; the views outlive the stream's execution
    // (the caller's contract for every enqueue); `raw` is the call's stream, checked to belong
    // to this device or vouched for by a raw entry point's caller.
    unsafe { device.residual_rmsnorm(args, raw) }
}

fn args(c: &NormCall) -> NormArgs {
    NormArgs {
        sum: c.y,
        residual: c.residual,
        weight: c.weight,
        h: c.h,
        y: c.y,
        rows: c.rows,
        hidden: c.hidden,
        eps: c.eps,
        dtype: c.dtype,
    }
}

impl<I, T> Routed<I, T>
where
    I: RouteSelect + NormBackend,
    T: Collective<Stream = I::Stream> + NormBackend,
{
    /// `y = tree(x)`, `h = residual + y`, `y = rmsnorm(h) * weight` on row-major `[rows,
    /// hidden]` tensors (see [`RmsNorm`]): the all_reduce's [`Io`] carries `x` and `y`, `norm`
    /// the residual, `h`, the weight, `hidden` and `eps`. Collective like `all_reduce`; a
    /// refused call (a typed error) writes nothing.
    pub fn all_reduce_residual_rmsnorm(&self, x: Io<'_>, norm: RmsNorm<'_>, stream: &I::Stream) -> Result<(), Error> {
        self.fused_norm(x, norm, &OnStream(stream))
    }

    /// The call through `via` (a safe or a raw stream).
    pub(crate) fn fused_norm(&self, x: Io<'_>, norm: RmsNorm<'_>, via: &impl Via<I, T>) -> Result<(), Error> {
        validate(Op::AllReduce, &x, self.rank(), self.world_size(), usize::MAX)?;
        let call = validate_norm(&x, &norm)?;
        let args = args(&call);
        NormParams::pack(&args)?;
        self.dispatch(Op::AllReduce, x, via)?;
        let stream = via.stream();
        match (self.ipc(), self.nodes(), self.transport()) {
            (Some(i), _, _) => i.residual_rmsnorm(&args, stream),
            (None, Some(n), _) => n.local().residual_rmsnorm(&args, stream),
            (None, None, Some(t)) => t.residual_rmsnorm(&args, stream),
            (None, None, None) => Err(Error::InvalidConfig { detail: "no backend".into() }),
        }
    }
}

impl<S: ?Sized> NormBackend for NoTransport<S> {
    fn residual_rmsnorm(&self, _: &NormArgs, _: CallStream<'_, S>) -> Result<(), Error> {
        match self.0 {}
    }
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
impl<D: detcoll_protocol::IpcDevice + NormDevice> NormBackend for ipc_engine::IpcCollective<D> {
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, D::Stream>) -> Result<(), Error> {
        launch(self.device(), args, stream)
    }
}

#[cfg(any(feature = "cuda", feature = "rocm"))]
impl<D: NormDevice + Clone> NormBackend for crate::GpuTransport<D> {
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, D::Stream>) -> Result<(), Error> {
        launch(self.device(), args, stream)
    }
}

#[cfg(feature = "cpu")]
impl NormBackend for shm_ipc::ShmCollective {
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, ()>) -> Result<(), Error> {
        launch(self.engine().device(), args, stream)
    }
}

#[cfg(feature = "cpu")]
impl NormBackend for detcoll_host_transport::HostTransport {
    /// The host executor of the kernel (the ranks of a flat transport world have no IPC
    /// collective to borrow it from).
    fn residual_rmsnorm(&self, args: &NormArgs, stream: CallStream<'_, ()>) -> Result<(), Error> {
        launch(&shm_ipc::HostDevice::threads(), args, stream)
    }
}
