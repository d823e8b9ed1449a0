//! The canonical rank tree and the CPU reference of every detcoll operation.
//!
//! Every reduction in detcoll evaluates, per element, one fixed tree over the ranks in rank
//! order. For 8 ranks it is the balanced tree
//!
//! ```text
//! ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
//! ```
//!
//! (its prefix for 1, 2 or 4 ranks). For any world size `W` from 1 to [`MAX_WORLD_SIZE`]: one
//! rank is the leaf; otherwise, with `m` the largest power of two strictly below `W`, the tree
//! of the first `m` ranks plus the tree of the other `W - m`, so `((r0+r1)+(r2+r3))+(r4+r5)`
//! for 6 ranks ([`tree`] module docs, [`tree_expression`]). Every add is done in the element's
//! own dtype and rounded to nearest even. This crate is the oracle every backend is compared to,
//! bit for bit. It is pure Rust: no unsafe, no GPU.
//!
//! A NaN result is NaN; its payload (sign and quiet bit included) is not part of the contract,
//! so comparisons treat any two NaNs as equal and every other value bit for bit.
//!
//! # Why an f32 add followed by one rounding is exact for f16 and bf16
//!
//! See [`element`]: rounding the exact sum of two f16 (or bf16) values first to f32 and then to
//! f16 (bf16) gives the same bits as rounding it once, because f32's 24 bits are at least
//! 2p + 2 for p = 11 (f16) and p = 8 (bf16), the bound under which double rounding of a sum is
//! innocuous; zeros, subnormals, overflow and NaN are handled there case by case.
//!
//! # Fused all_reduce + residual + RMSNorm
//!
//! [`residual_rmsnorm`] is the reference of the fused op `h = residual + all_reduce(x)`,
//! `y = rmsnorm(h) * weight`: the tree above for the all_reduce, one add in the dtype, then a
//! sum of squares in `f32` in one fixed lane order ([`RMSNORM_LANES`], [`RMSNORM_VECTOR`]), a
//! correctly rounded `1 / sqrt(mean + eps)`, and one rounding to the dtype. The [`rmsnorm`]
//! module states the evaluation step by step and why that order.
#![forbid(unsafe_code)]

pub mod element;
mod error;
mod ops;
pub mod rmsnorm;
pub mod tree;

pub use element::Element;
pub use error::Error;
pub use ops::{all_gather, cross_tp_leaves, reduce, reduce_scatter, reduce_scatter_many};
pub use rmsnorm::{
    RMSNORM_LANES, RMSNORM_MAX_HIDDEN, RMSNORM_VECTOR, RmsNormShape, residual_rmsnorm, rmsnorm_row, sum_of_squares,
};
pub use tree::{MAX_WORLD_SIZE, SUPPORTED_WORLD_SIZES, tree_expression, tree_sum};
