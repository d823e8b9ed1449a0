//! The reference of the fused `all_reduce + residual + RMSNorm`: the bits every kernel of it
//! must produce.
//!
//! For row-major `[rows, hidden]` tensors of one dtype `T`, W rank inputs `x_0 .. x_{W-1}`, a
//! `residual`, a `weight` of `hidden` elements and an `eps`, every row `i` is evaluated as
//! follows, and nothing else (not the row index, the number of rows, the route of the
//! all_reduce, a block count) enters the result; only `hidden` and the values do:
//!
//! 1. `s_j = tree(x_0[i,j], …, x_{W-1}[i,j])`: the canonical rank tree, exactly
//!    [`crate::reduce`] ([`crate::tree_sum`] per element), in `T`.
//! 2. `h_j = residual[i,j] + s_j`: one add in `T` ([`Element::add`], one rounding).
//! 3. `q`, the sum of the squares of `f32(h_j)` in `f32`, in the order of [`sum_of_squares`]:
//!    [`RMSNORM_LANES`] = 256 lane partials `p_t`, element `j` belonging to lane
//!    `(j / RMSNORM_VECTOR) % RMSNORM_LANES` with [`RMSNORM_VECTOR`] = 8. Each lane starts at
//!    `+0.0` and, for its elements in increasing `j`, does `sq = f32(h_j) * f32(h_j)` (rounded
//!    to `f32`) then `p_t = p_t + sq` (rounded to `f32`), never a fused multiply-add. Then the
//!    lanes are combined by halving: `p_t = p_t + p_{t+s}` for `s = 128, 64, …, 1` and `t < s`;
//!    `q = p_0`.
//! 4. `mean = q / f32(hidden)`, `r = mean + eps`, `inv = 1 / sqrt(r)`: each in `f32`, each
//!    correctly rounded (an IEEE square root and an IEEE division, not an approximate `rsqrt`).
//!    `hidden <= 2^24` ([`RMSNORM_MAX_HIDDEN`]), so `f32(hidden)` is exact.
//! 5. `y_j = T(f32(h_j) * inv * f32(weight_j))`: `n_j = f32(h_j) * inv` rounded to `f32`, then
//!    `n_j * f32(weight_j)` rounded to `f32`, then rounded once to `T` ([`Element::from_f32_rounded`],
//!    nearest even; no second rounding for `T = f32`).
//!
//! Outputs: `h` (the residual stream for the next layer: the all_reduce's bits plus one add)
//! and `y` (the normalised activations), both `[rows, hidden]` of `T`.
//!
//! # Why this summation order
//!
//! A float sum's bits depend on its order, so the order is part of the contract, and it is the
//! order a fast GPU kernel evaluates anyway: one block of 256 threads per row; thread `t` loads
//! 8 contiguous elements (one 16-byte vector of f16/bf16) from each chunk of
//! `256 * 8 = 2048` elements, at `chunk * 2048 + 8t .. chunk * 2048 + 8t + 8`, and accumulates
//! their squares, in element order, into its own `f32` register (its lane); then the block
//! reduces the 256 partials by halving in shared memory and, once 32 are left, with warp
//! shuffles (`shfl_down` by 16, 8, 4, 2, 1 gives thread `t < s` exactly `p_t + p_{t+s}`, the
//! halving tree's next level). For `hidden = 4096`, lane `t` holds elements `8t .. 8t+7` and `2048+8t .. 2048+8t+7`.
//! Lanes that get no element (`hidden < 2048`) stay `+0.0`, which the halving adds exactly.
//! Nothing in the order depends on the number of rows or of blocks, so the bits do not either.
//!
//! Rust does not contract `a * b + c` into a fused multiply-add (no fast-math flags reach
//! LLVM), so the code below is the evaluation written in the steps; a GPU kernel must disable
//! contraction for these lines (`__fmul_rn` / `__fadd_rn`, or `-fmad=false`) to match it. (For
//! f16 every square is exact in `f32`, 22 significant bits at most, so contraction cannot
//! change the sum; for bf16 only squares below `2^-126`, in f32's subnormal range, can round;
//! for f32 any can. The contract forbids it for all three; `tests/rmsnorm.rs` shows that a
//! contracted f32 sum gives other bits.)
//!
//! # Specials
//!
//! Everything follows IEEE 754 from the steps above. The cases worth naming, by `n_j`; then
//! `y_j = T(n_j * w_j)`, and for a finite nonzero weight a zero, infinite or NaN `n_j` stays
//! one (the sign of the product):
//!
//! * An all-zero row with `eps > 0` gives `n_j = ±0` (`inv` is finite), so `y_j = ±0`; with
//!   `eps = 0` it gives NaN: `q = 0`, `r = 0`, `inv = 1/0 = ∞`, `0 * ∞ = NaN`.
//! * A NaN anywhere in a row's `h` makes `q`, `inv` and so every `y_j` of that row NaN.
//! * An infinite `h_j` (an infinite input, or an f16/bf16 add that overflows) makes `q = ∞`,
//!   `inv = 1/∞ = +0`: `n_j` is NaN where `h_j` is infinite (`∞ * 0`) and `±0` elsewhere. The
//!   same `inv = +0` (so `n_j = ±0` for finite `h_j`) follows when finite squares, or their
//!   sum, overflow `f32`.
//! * Subnormal `h_j` are kept (no flush to zero); their squares may underflow to `+0`. With
//!   `eps = 0`, a row whose squares all underflow (f32 subnormals) has `q = 0`, `inv = ∞`:
//!   `n_j = ±∞` for nonzero `h_j` and NaN for zero ones.
use crate::ops::tree_into;
use crate::tree::check_world;
use crate::{Element, Error};

/// The number of lane partials of the sum of squares: the threads of the one block a GPU kernel
/// runs per row. Lane `t` sums the squares of elements `j` with `(j / RMSNORM_VECTOR) %
/// RMSNORM_LANES == t`, and the lanes are combined by halving (see [`sum_of_squares`]).
pub const RMSNORM_LANES: usize = 256;

/// The number of contiguous elements a lane takes at a time: one 16-byte load of 8 f16/bf16
/// values per thread. A chunk of `RMSNORM_LANES * RMSNORM_VECTOR = 2048` elements is one load
/// by every thread of the block.
pub const RMSNORM_VECTOR: usize = 8;

/// The largest `hidden` the RMSNorm reference takes, `2^24`: every integer up to it converts to
/// `f32` exactly, so the mean divides by `hidden` itself, not by a rounded stand-in.
pub const RMSNORM_MAX_HIDDEN: usize = 1 << 24;

/// The shape of the row-major `[rows, hidden]` tensors of [`residual_rmsnorm`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RmsNormShape {
    /// Number of rows (tokens). Any number, 0 included; no row's bits depend on it.
    pub rows: usize,
    /// Elements per row, normalised together: `1..=RMSNORM_MAX_HIDDEN`.
    pub hidden: usize,
}

impl RmsNormShape {
    /// `rows * hidden`, the length of every `[rows, hidden]` tensor, after checking `hidden`.
    ///
    /// [`Error::UnsupportedHidden`] for `hidden` 0 or above [`RMSNORM_MAX_HIDDEN`],
    /// [`Error::ShapeOverflow`] when the product does not fit in `usize`.
    pub fn elements(self) -> Result<usize, Error> {
        check_hidden(self.hidden)?;
        self.rows.checked_mul(self.hidden).ok_or(Error::ShapeOverflow { rows: self.rows, hidden: self.hidden })
    }
}

fn check_hidden(hidden: usize) -> Result<(), Error> {
    if (1..=RMSNORM_MAX_HIDDEN).contains(&hidden) { Ok(()) } else { Err(Error::UnsupportedHidden { hidden }) }
}

/// `eps` must be a finite, non-negative `f32`. `-0.0` passes: `mean` is `+0` or above (or NaN),
/// and `mean + (-0) = mean`, so it acts as `+0`.
fn check_eps(eps: f32) -> Result<(), Error> {
    if eps.is_finite() && eps >= 0.0 { Ok(()) } else { Err(Error::InvalidEps { bits: eps.to_bits() }) }
}

fn check_len(argument: &'static str, expected: usize, got: usize) -> Result<(), Error> {
    if expected == got { Ok(()) } else { Err(Error::LengthMismatch { argument, expected, got }) }
}

/// Fused `all_reduce + residual + RMSNorm` reference (steps 1-5 of the [module docs](self)):
/// for every row, `h = residual + tree(ranks)` in `T`, then `y = rmsnorm(h) * weight`.
///
/// `ranks` holds one `[rows, hidden]` input per rank (1 to [`crate::MAX_WORLD_SIZE`] ranks,
/// each reduced by the canonical tree), `residual`, `h` and `y` are `[rows, hidden]`, `weight`
/// is `[hidden]`. Every check comes before any write: on error `h` and `y` are untouched.
///
/// Errors: [`Error::UnsupportedHidden`] (`hidden` 0 or above [`RMSNORM_MAX_HIDDEN`]),
/// [`Error::ShapeOverflow`] (`rows * hidden` overflows), [`Error::InvalidEps`] (NaN, infinite or
/// negative), [`Error::UnsupportedWorldSize`] (no ranks, or too many), and
/// [`Error::LengthMismatch`] naming `ranks[r]`, `residual`, `weight`, `h` or `y`. `rows = 0`
/// is `Ok` and writes nothing (the other arguments are still checked: `hidden`, `eps`, the
/// world size, and `weight` of `hidden` elements).
///
/// ```
/// use fixed_tree::{RmsNormShape, residual_rmsnorm};
///
/// // Two ranks, one row of 4: h = 0.25 + (0.5 + 0.25) = 1, so mean(h²) = 1 and, with eps = 0,
/// // inv = 1 and y = weight.
/// let x0 = [0.5f32; 4];
/// let x1 = [0.25f32; 4];
/// let residual = [0.25f32; 4];
/// let weight = [1.0f32, -2.0, 0.5, 3.0];
/// let (mut h, mut y) = ([0.0f32; 4], [0.0f32; 4]);
/// let shape = RmsNormShape { rows: 1, hidden: 4 };
/// residual_rmsnorm(&[&x0, &x1], &residual, &weight, 0.0, shape, &mut h, &mut y)?;
/// assert_eq!(h, [1.0; 4]);
/// assert_eq!(y, weight);
/// # Ok::<(), fixed_tree::Error>(())
/// ```
pub fn residual_rmsnorm<T: Element>(
    ranks: &[&[T]],
    residual: &[T],
    weight: &[T],
    eps: f32,
    shape: RmsNormShape,
    h: &mut [T],
    y: &mut [T],
) -> Result<(), Error> {
    let n = shape.elements()?;
    check_eps(eps)?;
    check_world(ranks.len())?;
    for r in ranks {
        check_len("ranks[r]", n, r.len())?;
    }
    check_len("residual", n, residual.len())?;
    check_len("weight", shape.hidden, weight.len())?;
    check_len("h", n, h.len())?;
    check_len("y", n, y.len())?;
    let hidden = shape.hidden;
    for (row, (h_row, y_row)) in h.chunks_exact_mut(hidden).zip(y.chunks_exact_mut(hidden)).enumerate() {
        let start = row * hidden;
        // Step 1: the all_reduce's bits, s_j, straight into h.
        tree_into(ranks, start, h_row);
        // Step 2: one add in T.
        for (hj, &rj) in h_row.iter_mut().zip(&residual[start..start + hidden]) {
            *hj = rj.add(*hj);
        }
        norm_row(h_row, weight, eps, y_row);
    }
    Ok(())
}

/// The norm alone on one row (steps 3-5 of the [module docs](self)): `y = T(f32(h) * inv *
/// f32(weight))` with `inv = 1 / sqrt(sum_of_squares(h) / hidden + eps)`, `hidden = h.len()`.
/// For kernels and tests that start from `h`; [`residual_rmsnorm`] calls the same code per row.
///
/// Errors, checked before `y` is written: [`Error::UnsupportedHidden`] (`h` empty or longer
/// than [`RMSNORM_MAX_HIDDEN`]), [`Error::InvalidEps`], [`Error::LengthMismatch`] for `weight`
/// or `y` (each must be as long as `h`).
///
/// ```
/// // q = 9, mean = 9, r = 9, sqrt(r) = 3, inv = f32(1/3), n = f32(3 * f32(1/3)) = 1, y = 2.
/// let mut y = [0.0f32];
/// fixed_tree::rmsnorm_row(&[3.0f32], &[2.0], 0.0, &mut y)?;
/// assert_eq!(y, [2.0]);
/// # Ok::<(), fixed_tree::Error>(())
/// ```
pub fn rmsnorm_row<T: Element>(h: &[T], weight: &[T], eps: f32, y: &mut [T]) -> Result<(), Error> {
    check_hidden(h.len())?;
    check_eps(eps)?;
    check_len("weight", h.len(), weight.len())?;
    check_len("y", h.len(), y.len())?;
    norm_row(h, weight, eps, y);
    Ok(())
}

/// Steps 3-5 on a checked row: `1 <= h.len() <= RMSNORM_MAX_HIDDEN`, `weight` and `y` as long
/// as `h`, `eps` finite and non-negative.
fn norm_row<T: Element>(h: &[T], weight: &[T], eps: f32, y: &mut [T]) {
    let inv = inv_rms(sum_of_squares(h), h.len(), eps);
    for ((yj, &hj), &wj) in y.iter_mut().zip(h).zip(weight) {
        let n = hj.to_f32_exact() * inv;
        *yj = T::from_f32_rounded(n * wj.to_f32_exact());
    }
}

/// Step 4: `1 / sqrt(q / hidden + eps)`, every operation an `f32` one, correctly rounded.
fn inv_rms(q: f32, hidden: usize, eps: f32) -> f32 {
    debug_assert!((1..=RMSNORM_MAX_HIDDEN).contains(&hidden));
    // Exact: hidden <= 2^24.
    let mean = q / hidden as f32;
    let r = mean + eps;
    // `f32::sqrt` is the IEEE 754 square root, correctly rounded; the division is one more
    // rounding. Together they are not an `rsqrt` approximation, whose bits vary by hardware.
    1.0 / r.sqrt()
}

/// Step 3: the sum of the squares of `f32(h_j)`, in `f32`, in the order a 256-thread block
/// evaluates it (module docs, [Why this summation order](self#why-this-summation-order)).
///
/// Lane `t` (of [`RMSNORM_LANES`]) starts at `+0.0` and, for the elements `j` with
/// `(j / RMSNORM_VECTOR) % RMSNORM_LANES == t` in increasing `j`, does `sq = f32(h_j) *
/// f32(h_j)` then `p_t = p_t + sq`, each rounded to `f32` (no fused multiply-add). Then, for
/// `s = 128, 64, …, 1` and `t < s`, `p_t = p_t + p_{t+s}`; the result is `p_0`. Any length,
/// `+0.0` for an empty `h`.
///
/// ```
/// use fixed_tree::sum_of_squares;
///
/// // 4096² = 2^24, and 2^24 + 1 rounds back to 2^24 in f32. In order, every 1 after the first
/// // element is lost; here elements 1..8 (lane 0) are lost but elements 8..16 form lane 1's
/// // exact 8, which the halving adds to lane 0 at the end.
/// let mut h = [1.0f32; 16];
/// h[0] = 4096.0;
/// let sequential = h.iter().fold(0.0f32, |acc, &v| acc + v * v);
/// assert_eq!(sequential, 16_777_216.0);
/// assert_eq!(sum_of_squares(&h), 16_777_224.0);
/// ```
pub fn sum_of_squares<T: Element>(h: &[T]) -> f32 {
    let mut p = [0.0f32; RMSNORM_LANES];
    for (vector, chunk) in h.chunks(RMSNORM_VECTOR).enumerate() {
        let lane = &mut p[vector % RMSNORM_LANES];
        for &v in chunk {
            let x = v.to_f32_exact();
            let sq = x * x;
            *lane += sq;
        }
    }
    let mut s = RMSNORM_LANES / 2;
    while s >= 1 {
        // p_t = p_t + p_{t+s} for t < s.
        let (low, high) = p.split_at_mut(s);
        for (pt, &pts) in low.iter_mut().zip(&high[..s]) {
            *pt += pts;
        }
        s /= 2;
    }
    p[0]
}
