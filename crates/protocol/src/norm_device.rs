//! The device side of the residual add + RMSNorm: the trait a runtime implements to run the
//! kernel of `kernels/detcoll_norm.h` (or the host reference). Its own file, so that the norm's
//! parameters ([`crate::norm`]), which the kernel parameter table needs, do not import the
//! device traits.
use crate::device::{Device, RawStream};
use crate::norm::NormArgs;
use collective_core::Error;

/// A device that runs the residual add + RMSNorm after an all_reduce (the kernel of
/// `kernels/detcoll_norm.h`, or the host reference).
pub trait NormDevice: Device {
    /// Enqueues, for each of `rows` rows of `hidden` elements of `dtype`:
    /// `h = residual + sum` (the dtype add of the tree), `y = rmsnorm(h) * weight`, exactly
    /// `fixed_tree::residual_rmsnorm`'s steps 2-5 (the sum is the all_reduce's output).
    ///
    /// Exact aliasing of `h` with `sum` or `residual`, and of `y` with `sum` or `residual`, is
    /// allowed (element `j` is read and written by the same thread); `h` and `y` must not
    /// overlap. The arguments are checked first ([`NormParams::pack`](crate::norm::NormParams::pack): the same typed errors on
    /// every device); `rows = 0` enqueues nothing.
    ///
    /// # Safety
    /// `sum` and `residual` hold `rows * hidden` readable elements, `weight` `hidden` readable
    /// ones and `h`, `y` `rows * hidden` writable ones, all memory of this device valid until
    /// `stream` has executed the kernel and not written by other work meanwhile; `stream` is a
    /// live stream of this device.
    unsafe fn residual_rmsnorm(&self, args: &NormArgs, stream: RawStream) -> Result<(), Error>;
}
