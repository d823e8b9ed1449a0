//! The residual add + RMSNorm that follows an all_reduce, as a device operation: the second step
//! of the fused `all_reduce + residual + RMSNorm` (docs/contract.md, "Fused all_reduce + residual
//! + RMSNorm").
//!
//! `NormDevice` (its own file) is what a runtime implements (CUDA and HIP launch `detcoll_residual_rmsnorm`
//! of `kernels/detcoll_norm.h`; the host device runs `fixed_tree`'s reference); [`NormArgs`] is
//! one call's tensors; [`NormParams`] is the kernel's parameter struct (`DcNormParams` of
//! `kernels/detcoll_protocol.h`) and [`NormParams::pack`] the checks every implementation makes
//! before touching memory, so every device accepts and refuses the same calls.
//!
//! The bits are `fixed_tree::residual_rmsnorm`'s steps 2-5, for every row alone: nothing but
//! `hidden` and the values enters them (not the row index, the number of rows, the grid).
use collective_core::{DType, Error, Op};

/// Threads of one block of the kernel, one lane of the sum of squares each
/// (`fixed_tree::RMSNORM_LANES`, `DC_NORM_THREADS`).
pub const NORM_THREADS: u32 = 256;

/// Contiguous elements a lane takes per chunk (`fixed_tree::RMSNORM_VECTOR`, `DC_NORM_VECTOR`).
pub const NORM_VECTOR: usize = 8;

/// The largest `hidden`, `2^24` (`fixed_tree::RMSNORM_MAX_HIDDEN`): `f32(hidden)` is exact up
/// to it.
pub const NORM_MAX_HIDDEN: usize = 1 << 24;

/// Most blocks of one launch: the kernel strides over the rows, so the grid never changes the
/// bits. 65535 fits every runtime's grid limit (HIP's total of `2^32` work-items included).
pub const NORM_MAX_GRID: u32 = 65_535;

/// The operation named in errors: the norm is the tail of the fused all_reduce.
const OP: Op = Op::AllReduce;

/// One call of `NormDevice::residual_rmsnorm`: device addresses of row-major `[rows, hidden]`
/// tensors of `dtype` (and `weight`, `[hidden]`), and the scalars.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NormArgs {
    /// The all_reduce's output (`s` of the contract's step 1), `[rows, hidden]`, read.
    pub sum: u64,
    /// The residual stream, `[rows, hidden]`, read.
    pub residual: u64,
    /// The norm's scale, `[hidden]` (one row, shared by every row), read. Overlaps neither `h`
    /// nor `y`.
    pub weight: u64,
    /// Output: `residual + sum` in `dtype` (the next layer's residual), `[rows, hidden]`. May be
    /// exactly `sum` or exactly `residual` (same address); otherwise overlaps no tensor.
    pub h: u64,
    /// Output: `rmsnorm(h) * weight`, `[rows, hidden]`. May be exactly `sum` or exactly
    /// `residual`; never overlaps `h` or `weight`.
    pub y: u64,
    /// Number of rows (tokens); 0 enqueues nothing.
    pub rows: usize,
    /// Elements per row, normalised together: `1..=`[`NORM_MAX_HIDDEN`].
    pub hidden: usize,
    /// Added to the mean of the squares: finite and `>= 0` (`-0.0` acts as `+0.0`).
    pub eps: f32,
    /// The element type of every tensor: f32, f16 or bf16.
    pub dtype: DType,
}

impl NormArgs {
    /// The same norm restricted to `rows` rows from row `first` (`sum`, `residual`, `h` and `y`
    /// moved to that row; `weight`, `hidden`, `eps`, `dtype` kept): what one launch of a fused
    /// call in chunks of whole rows normalises. `None` when those rows are not all in `self`.
    pub fn rows_from(&self, first: usize, rows: usize) -> Option<NormArgs> {
        if first.checked_add(rows)? > self.rows {
            return None;
        }
        let off = u64::try_from(first.checked_mul(self.hidden)?.checked_mul(self.dtype.size())?).ok()?;
        Some(NormArgs {
            sum: self.sum.checked_add(off)?,
            residual: self.residual.checked_add(off)?,
            h: self.h.checked_add(off)?,
            y: self.y.checked_add(off)?,
            rows,
            ..*self
        })
    }
}

/// `DcNormParams` of `kernels/detcoll_protocol.h`: the kernel's one parameter.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct NormParams {
    pub sum: u64,
    pub residual: u64,
    pub weight: u64,
    pub h: u64,
    pub y: u64,
    pub rows: u64,
    pub hidden: u32,
    /// `DType as u32`.
    pub dtype: u32,
    pub eps: f32,
    pub pad: u32,
}

const _: () = assert!(size_of::<NormParams>() == 64);

impl NormParams {
    /// [`NormArgs::rows_from`] of the packed form: rows `first .. first + rows` alone.
    pub fn rows_from(&self, first: u64, rows: u64) -> Option<NormParams> {
        if first.checked_add(rows)? > self.rows {
            return None;
        }
        let size = if self.dtype == DType::F32 as u32 { 4 } else { 2 };
        let off = first.checked_mul(u64::from(self.hidden))?.checked_mul(size)?;
        Some(NormParams {
            sum: self.sum.checked_add(off)?,
            residual: self.residual.checked_add(off)?,
            h: self.h.checked_add(off)?,
            y: self.y.checked_add(off)?,
            rows,
            ..*self
        })
    }
}

fn invalid(detail: String) -> Error {
    Error::InvalidConfig { detail: format!("residual_rmsnorm: {detail}") }
}

/// Whether `[a, a + a_len)` and `[b, b + b_len)` share a byte (empty ranges share none).
fn overlaps(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    a_len != 0 && b_len != 0 && a < b + b_len && b < a + a_len
}

impl NormParams {
    /// The kernel parameters of `args`, after the checks every implementation makes (typed
    /// errors, before anything is enqueued):
    ///
    /// * a dtype without an add: [`Error::UnsupportedDtype`];
    /// * `hidden` outside `1..=`[`NORM_MAX_HIDDEN`], `eps` NaN, infinite or negative, or
    ///   `rows * hidden` not fitting the kernel's 64-bit offsets: [`Error::InvalidConfig`];
    /// * a tensor that ends beyond the address space: [`Error::SizeOverflow`];
    /// * an address not aligned to the element size: [`Error::Misaligned`];
    /// * an overlap the kernel does not allow (`h` with `y`, `weight` with an output, an output
    ///   partly over `sum` or `residual`): [`Error::Overlap`].
    pub fn pack(args: &NormArgs) -> Result<NormParams, Error> {
        let dtype = args.dtype;
        if !dtype.is_reducible() {
            return Err(Error::UnsupportedDtype { op: OP, dtype });
        }
        if !(1..=NORM_MAX_HIDDEN).contains(&args.hidden) {
            return Err(invalid(format!("hidden = {} is outside 1..={NORM_MAX_HIDDEN}", args.hidden)));
        }
        if !(args.eps.is_finite() && args.eps >= 0.0) {
            return Err(invalid(format!("eps = {} is not a finite, non-negative f32", args.eps)));
        }
        let size = dtype.size() as u64;
        let hidden = args.hidden as u64;
        let rows = u64::try_from(args.rows).map_err(|_| invalid(format!("rows = {} exceeds 64 bits", args.rows)))?;
        let elements = rows.checked_mul(hidden).filter(|n| n.checked_mul(size).is_some()).ok_or_else(|| {
            invalid(format!("{} rows of {} elements overflow 64-bit offsets", args.rows, args.hidden))
        })?;
        let tensor_bytes = elements * size;
        let tensors = [
            ("sum", args.sum, tensor_bytes),
            ("residual", args.residual, tensor_bytes),
            ("weight", args.weight, hidden * size),
            ("h", args.h, tensor_bytes),
            ("y", args.y, tensor_bytes),
        ];
        for (argument, addr, bytes) in tensors {
            if addr.checked_add(bytes).is_none() {
                let len = (bytes / size) as usize;
                return Err(Error::SizeOverflow { op: OP, argument, len });
            }
            if addr % size != 0 {
                return Err(Error::Misaligned { op: OP, argument, addr, align: dtype.size() });
            }
        }
        let n = tensor_bytes;
        let w = hidden * size;
        // Outputs: exactly an input, or apart from it.
        let partly = |out: u64, input: u64| out != input && overlaps(out, n, input, n);
        if overlaps(args.h, n, args.y, n)
            || overlaps(args.weight, w, args.h, n)
            || overlaps(args.weight, w, args.y, n)
            || partly(args.h, args.sum)
            || partly(args.h, args.residual)
            || partly(args.y, args.sum)
            || partly(args.y, args.residual)
        {
            return Err(Error::Overlap { op: OP });
        }
        Ok(NormParams {
            sum: args.sum,
            residual: args.residual,
            weight: args.weight,
            h: args.h,
            y: args.y,
            rows,
            hidden: args.hidden as u32,
            dtype: dtype as u32,
            eps: args.eps,
            pad: 0,
        })
    }

    /// Whether the kernels take the vector path (`dc_norm_vector_ok`): `hidden` a multiple of
    /// 8 and every address 16-byte aligned.
    pub fn vector_ok(&self) -> bool {
        self.hidden.is_multiple_of(8) && (self.sum | self.residual | self.weight | self.h | self.y).is_multiple_of(16)
    }

    /// Blocks of the launch: one per row, at most [`NORM_MAX_GRID`] (the kernel strides over
    /// the rest); 0 for no rows, which launches nothing.
    pub fn grid(&self) -> u32 {
        self.rows.min(u64::from(NORM_MAX_GRID)) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    fn args(dtype: DType) -> NormArgs {
        NormArgs {
            sum: 0x10_0000,
            residual: 0x20_0000,
            weight: 0x30_0000,
            h: 0x40_0000,
            y: 0x50_0000,
            rows: 4,
            hidden: 1000,
            eps: 1e-6,
            dtype,
        }
    }

    #[test]
    fn layout_matches_the_kernel_header() {
        // DcNormParams: five addresses, rows, then hidden, dtype, eps, pad (natural alignment).
        let offsets = [
            offset_of!(NormParams, sum),
            offset_of!(NormParams, residual),
            offset_of!(NormParams, weight),
            offset_of!(NormParams, h),
            offset_of!(NormParams, y),
            offset_of!(NormParams, rows),
            offset_of!(NormParams, hidden),
            offset_of!(NormParams, dtype),
            offset_of!(NormParams, eps),
            offset_of!(NormParams, pad),
        ];
        assert_eq!(offsets, [0, 8, 16, 24, 32, 40, 48, 52, 56, 60]);
        assert_eq!(size_of::<NormParams>(), 64);
    }

    #[test]
    fn packs_and_grids() {
        let p = NormParams::pack(&args(DType::BF16)).unwrap();
        assert_eq!((p.rows, p.hidden, p.dtype, p.eps, p.pad), (4, 1000, DType::BF16 as u32, 1e-6, 0));
        assert_eq!((p.sum, p.residual, p.weight, p.h, p.y), (0x10_0000, 0x20_0000, 0x30_0000, 0x40_0000, 0x50_0000));
        assert_eq!(p.grid(), 4);
        let big = NormParams::pack(&NormArgs { rows: 1 << 17, hidden: 1, ..args(DType::F32) }).unwrap();
        assert_eq!(big.grid(), NORM_MAX_GRID);
        assert_eq!(NormParams::pack(&NormArgs { rows: 0, ..args(DType::F16) }).unwrap().grid(), 0);
        // The contract's bounds of hidden, and eps = -0.0.
        let apart =
            NormArgs { sum: 1 << 30, residual: 2 << 30, weight: 3 << 30, h: 4 << 30, y: 5 << 30, ..args(DType::F32) };
        for hidden in [1, NORM_MAX_HIDDEN] {
            assert!(NormParams::pack(&NormArgs { hidden, rows: 1, ..apart }).is_ok(), "{hidden}");
        }
        assert!(NormParams::pack(&NormArgs { eps: -0.0, ..args(DType::F32) }).is_ok());
    }

    #[test]
    fn exact_aliasing_is_allowed() {
        let a = args(DType::F16);
        for (h, y) in [(a.sum, a.residual), (a.residual, a.sum), (a.sum, a.y), (a.h, a.residual)] {
            assert!(NormParams::pack(&NormArgs { h, y, ..a }).is_ok(), "h {h:#x} y {y:#x}");
        }
    }

    #[test]
    fn refuses_what_the_kernel_cannot_take() {
        let a = args(DType::F32);
        let bad = |b: NormArgs| NormParams::pack(&b).unwrap_err();
        for hidden in [0, NORM_MAX_HIDDEN + 1, usize::MAX] {
            assert!(matches!(bad(NormArgs { hidden, ..a }), Error::InvalidConfig { .. }), "{hidden}");
        }
        for eps in [f32::NAN, f32::INFINITY, -1e-6] {
            assert!(matches!(bad(NormArgs { eps, ..a }), Error::InvalidConfig { .. }), "{eps}");
        }
        assert!(matches!(bad(NormArgs { rows: usize::MAX, ..a }), Error::InvalidConfig { .. }));
        assert!(matches!(bad(NormArgs { rows: 1 << 41, hidden: 1 << 24, ..a }), Error::InvalidConfig { .. }));
        assert!(matches!(bad(NormArgs { y: u64::MAX - 64, ..a }), Error::SizeOverflow { argument: "y", .. }));
        assert!(matches!(
            bad(NormArgs { weight: 0x30_0002, ..a }),
            Error::Misaligned { argument: "weight", addr: 0x30_0002, align: 4, .. }
        ));
        // Two-byte elements need two-byte alignment only.
        assert!(NormParams::pack(&NormArgs { weight: 0x30_0002, ..args(DType::BF16) }).is_ok());
        let overlap = |b: NormArgs| matches!(bad(b), Error::Overlap { .. });
        assert!(overlap(NormArgs { y: a.h, ..a }));
        assert!(overlap(NormArgs { y: a.h + 4, ..a }));
        assert!(overlap(NormArgs { weight: a.h + 8, ..a }));
        assert!(overlap(NormArgs { h: a.sum + 4, ..a }));
        assert!(overlap(NormArgs { y: a.residual - 4, ..a }));
        // Rows = 0: the outputs are empty and overlap nothing.
        assert!(NormParams::pack(&NormArgs { rows: 0, y: a.h, ..a }).is_ok());
    }
}
