//! The checks of a fused all_reduce + residual + RMSNorm reaching the engine through its own
//! entry ([`IpcCollective::enqueue_all_reduce_norm`](crate::IpcCollective)): the front door's
//! (`collective_core::validate_norm`) on the norm's addresses, and the form every fused
//! launch takes — the norm reads the all_reduce's output and writes `y` over it. The norm
//! kernel alone (`NormParams::pack`) allows more (`h` over the sum, `y` over the residual):
//! in a fused launch the all_reduce writes the sum while some blocks may still read the
//! residual, so those forms would give bits that depend on the route.
use collective_core::{DType, Error, Io, Op, RawMut, RawRef, RmsNorm, validate_norm};
use detcoll_protocol::{NormArgs, NormParams, Plan};

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

/// The rows of `norm` that `plan` (one launch of a fused call's all_reduce) writes, as `(first
/// row, rows)`, when they are whole rows: the range its reduce and gather segments cover,
/// from the norm's `sum` (the all_reduce's output, `check`). `None` when the range starts or
/// ends inside a row or lies outside the sum.
pub(crate) fn plan_rows(norm: &NormParams, plan: &Plan) -> Option<(u64, u64)> {
    let size = if norm.dtype == DType::F32 as u32 { 4 } else { 2 };
    let row = u64::from(norm.hidden).checked_mul(size)?;
    let written = || plan.phase1.as_slice().iter().chain(plan.phase2.as_slice()).filter(|s| s.count > 0);
    let lo = written().map(|s| s.dst).min()?;
    let bytes = written().try_fold(0u64, |b, s| b.checked_add(u64::try_from(s.count).ok()?.checked_mul(size)?))?;
    let off = lo.checked_sub(norm.sum)?;
    if row == 0 || off % row != 0 || bytes % row != 0 {
        return None;
    }
    let (first, rows) = (off / row, bytes / row);
    (first.checked_add(rows)? <= norm.rows).then_some((first, rows))
}
