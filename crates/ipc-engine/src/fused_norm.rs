//! The checks of a fused all_reduce + residual + RMSNorm reaching the engine through its own
//! entry ([`IpcCollective::enqueue_all_reduce_norm`](crate::IpcCollective)): the front door's
//! (`collective_core::validate_norm`) on the norm's addresses, and the form every fused
//! launch takes — the norm reads the all_reduce's output and writes `y` over it. The norm
//! kernel alone (`NormParams::pack`) allows more (`h` over the sum, `y` over the residual):
//! in a fused launch the all_reduce writes the sum while some blocks may still read the
//! residual, so those forms would give bits that depend on the route.
use collective_core::{Error, Io, Op, RawMut, RawRef, RmsNorm, validate_norm};
use detcoll_protocol::NormArgs;

/// Checks `norm` against the all_reduce `io` (validated before): typed errors, before any
/// device work.
pub(crate) fn check(io: &Io<'_>, norm: &NormArgs) -> Result<(), Error> {
    let op = Op::AllReduce;
    let n =
        norm.rows.checked_mul(norm.hidden).ok_or(Error::SizeOverflow { op, argument: "residual", len: usize::MAX })?;
    let dtype = norm.dtype;
    // SAFETY: views of the caller's addresses, only compared by `validate_norm`, never
    // dereferenced; they live for this function.
    let views = unsafe {
        let residual = if norm.h == norm.residual {
            Io::InPlace(RawMut::from_raw(norm.h, n, dtype))
        } else {
            Io::OutOfPlace {
                input: RawRef::from_raw(norm.residual, n, dtype),
                output: RawMut::from_raw(norm.h, n, dtype),
            }
        };
        RmsNorm {
            residual,
            weight: RawRef::from_raw(norm.weight, norm.hidden, dtype),
            hidden: norm.hidden,
            eps: norm.eps,
        }
    };
    let call = validate_norm(io, &views)?;
    for (argument, addr) in [("sum", norm.sum), ("y", norm.y)] {
        if addr != call.y {
            let detail = format!(
                "is {addr:#x}; a fused call's norm reads the all_reduce's output and writes y over it, at {:#x}",
                call.y
            );
            return Err(Error::InvalidArgument { op, argument, detail });
        }
    }
    Ok(())
}
