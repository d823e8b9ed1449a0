//! The arguments of the fused all_reduce + residual + RMSNorm and their validation: every
//! check before any device work, so a refused call writes nothing.
//!
//! The operation, on row-major `[rows, hidden]` tensors of one dtype: `y = tree(x_0..x_{W-1})`
//! (the all_reduce, the canonical tree), `h = residual + y` (the dtype's add), `y =
//! rmsnorm(h) * weight` in `fixed_tree::rmsnorm`'s fixed evaluation (docs/contract.md). The
//! all_reduce's [`Io`] carries `x` and `y` (in place: `y` over `x`); [`RmsNorm::residual`]
//! carries the residual and `h` (in place: `h` over the residual, as vLLM's
//! `fused_add_rms_norm` updates it).
use crate::validate::{check_span, overlaps};
use crate::{Collective, DType, Error, Io, Op, RawRef};

/// The op errors of this call name: it is an all_reduce with an epilogue.
const OP: Op = Op::AllReduce;

/// The largest row the fixed evaluation is defined for (`hidden` converts to f32 exactly).
pub const MAX_HIDDEN: usize = 1 << 24;

/// The residual, weight and shape of a fused all_reduce + residual + RMSNorm.
#[derive(Debug)]
pub struct RmsNorm<'a> {
    /// The residual in, `h` out: `Io::InPlace(residual)` writes `h` over it;
    /// `Io::OutOfPlace { input: residual, output: h }` keeps it.
    pub residual: Io<'a>,
    /// The norm's weight, `hidden` elements of the call's dtype.
    pub weight: RawRef<'a>,
    /// Elements per row (1 to [`MAX_HIDDEN`]); the all_reduce's length is `rows * hidden`.
    pub hidden: usize,
    /// Added to the mean square: finite and not negative.
    pub eps: f32,
}

/// A validated fused call: every address and the shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormCall {
    /// The all_reduce's output, `y` (the tree's sums until the norm overwrites them).
    pub y: u64,
    /// The residual read.
    pub residual: u64,
    /// Where `h` is written (the residual itself when in place).
    pub h: u64,
    /// The weight.
    pub weight: u64,
    /// Rows.
    pub rows: usize,
    /// Elements per row.
    pub hidden: usize,
    /// The epsilon.
    pub eps: f32,
    /// The dtype of every tensor.
    pub dtype: DType,
}

/// A collective that runs the fused all_reduce + residual + RMSNorm of [`RmsNorm`] (the
/// composed collectives of `collective-factory` on every backend): what a layer generic over
/// its collective (`detcoll-layers`' decoder path) calls.
pub trait ResidualRmsNorm: Collective {
    /// `y = tree(x)`, `h = residual + y`, `y = rmsnorm(h) * weight` on row-major
    /// `[rows, hidden]` tensors: `x` carries the all_reduce's input and `y`, `norm` the
    /// residual and `h` (an [`Io`]: `h` over the residual in place, or into its own buffer),
    /// the weight, `hidden` and `eps`. Collective like
    /// `all_reduce`; a refused call (a typed error, [`validate_norm`]) writes nothing.
    fn all_reduce_residual_rmsnorm(&self, x: Io<'_>, norm: RmsNorm<'_>, stream: &Self::Stream) -> Result<(), Error>;
}

/// Checks the norm's arguments against the all_reduce's `x` (itself validated by the
/// all_reduce): dtypes, lengths, the shape, `eps`, and which buffers may share memory — `h`
/// only exactly the residual (in place); the residual, `h` and the weight nothing of `y`,
/// which the all_reduce writes before the residual is read; the weight nothing of `h`; `h`
/// nothing of an out-of-place `x`, which the all_reduce may still read while `h` is written.
pub fn validate_norm(x: &Io<'_>, norm: &RmsNorm<'_>) -> Result<NormCall, Error> {
    let (y, count, dtype) = match x {
        Io::InPlace(b) => (b.addr(), b.len(), b.dtype()),
        Io::OutOfPlace { output, .. } => (output.addr(), output.len(), output.dtype()),
    };
    let (residual, h, res_len, h_len, res_dtype, h_dtype) = match &norm.residual {
        Io::InPlace(b) => (b.addr(), b.addr(), b.len(), b.len(), b.dtype(), b.dtype()),
        Io::OutOfPlace { input, output } => {
            (input.addr(), output.addr(), input.len(), output.len(), input.dtype(), output.dtype())
        }
    };
    let mismatch = |argument, got| Error::DtypeMismatch { op: OP, argument, got, reference: "y", expected: dtype };
    for (argument, got) in [("residual", res_dtype), ("h", h_dtype), ("weight", norm.weight.dtype())] {
        if got != dtype {
            return Err(mismatch(argument, got));
        }
    }
    if !dtype.is_reducible() {
        return Err(Error::UnsupportedDtype { op: OP, dtype });
    }
    let bad = |argument, detail: String| Error::InvalidArgument { op: OP, argument, detail };
    if !(1..=MAX_HIDDEN).contains(&norm.hidden) {
        return Err(bad("hidden", format!("is {}; expected 1 to {MAX_HIDDEN}", norm.hidden)));
    }
    if !(norm.eps.is_finite() && norm.eps >= 0.0) {
        return Err(bad("eps", format!("is {}; expected a finite value, 0 or more", norm.eps)));
    }
    if count % norm.hidden != 0 {
        return Err(bad(
            "hidden",
            format!("is {}, which does not divide the {count} elements of y into rows", norm.hidden),
        ));
    }
    let why = "the residual and h are [rows, hidden] like y";
    for (argument, len) in [("residual", res_len), ("h", h_len)] {
        if len != count {
            return Err(Error::LengthMismatch { op: OP, argument, expected: count, got: len, why });
        }
    }
    if norm.weight.len() != norm.hidden {
        let why = "the weight has one element per column";
        return Err(Error::LengthMismatch {
            op: OP,
            argument: "weight",
            expected: norm.hidden,
            got: norm.weight.len(),
            why,
        });
    }
    // Every tensor's bytes and end address fit (checked arithmetic), so the sizes and overlap
    // tests below cannot wrap.
    for (argument, addr, len) in
        [("y", y, count), ("residual", residual, res_len), ("h", h, h_len), ("weight", norm.weight.addr(), norm.hidden)]
    {
        check_span(OP, argument, addr, len, dtype.size())?;
    }
    let bytes = count * dtype.size();
    let w_bytes = norm.weight.bytes();
    let pairs = [
        ("y", y, bytes, "residual", residual, bytes),
        ("y", y, bytes, "h", h, bytes),
        ("y", y, bytes, "weight", norm.weight.addr(), w_bytes),
        ("h", h, bytes, "weight", norm.weight.addr(), w_bytes),
    ];
    for (first, a, a_bytes, second, b, b_bytes) in pairs {
        if overlaps(a, a_bytes, b, b_bytes) {
            return Err(Error::ArgumentsOverlap { op: OP, first, second });
        }
    }
    if h != residual && overlaps(h, bytes, residual, bytes) {
        return Err(Error::ArgumentsOverlap { op: OP, first: "h", second: "residual" });
    }
    // x out of place is read by the all_reduce while the one-kernel form already writes h
    // (block by block, rows reduced elsewhere may still be reading theirs): h shares nothing
    // with it. In place, x is y, checked above.
    if let Io::OutOfPlace { input, .. } = x
        && overlaps(input.addr(), input.bytes(), h, bytes)
    {
        return Err(Error::ArgumentsOverlap { op: OP, first: "x", second: "h" });
    }
    Ok(NormCall {
        y,
        residual,
        h,
        weight: norm.weight.addr(),
        rows: count / norm.hidden,
        hidden: norm.hidden,
        eps: norm.eps,
        dtype,
    })
}
