//! The end of a tensor-parallel decoder layer: the row-parallel FFN's partial sums all-reduced
//! together with the residual add and the next layer's RMSNorm, in one fused call
//! ([`ResidualRmsNorm`]), with bits that do not depend on TP.
//!
//! Every rank holds all `S` tokens `x` (`S × hidden`, tensor parallelism without sequence
//! sharding: the decode step of an inference engine). Rank `r` of a TP=k group computes the
//! balanced tree over its `8/k` leaf products, exactly as [`FfnShard::forward`] does
//! ([`crate::ffn`]: the TP=8 tree's lower levels), and the fused call evaluates the tree's top
//! levels over the ranks (`sum = tree8(P_0..P_7)` at every TP), then `h = residual + sum` in the
//! dtype and `y = rmsnorm(h) * weight` in the fixed order of `fixed_tree::residual_rmsnorm`,
//! which depends only on `hidden`. So `h` (the next residual) and `y` (the next layer's input)
//! are the same bits at TP = 1, 2, 4 and 8, in any batch, on any backend and route;
//! [`reference_residual_rmsnorm`] computes them in one process.
//!
//! The engines that fuse this step (TensorRT-LLM, FlashInfer, vLLM's fusion pass) turn the
//! fusion off when bits must be stable; here it is the same call either way.
use crate::error::{Error, before_calls, product, require};
use crate::{FfnShape, FfnShard, Gemm, Scalar, ffn};
use collective_core::{Io, RawRef, ResidualRmsNorm, RmsNorm};
use fixed_tree::RmsNormShape;

/// The next layer's input RMSNorm: its weight (`hidden` elements) and epsilon.
#[derive(Debug, Clone, Copy)]
pub struct NextNorm<'a, T> {
    /// One scale per column.
    pub weight: &'a [T],
    /// Added to the mean square before the square root: finite, at least 0.
    pub eps: f32,
}

impl<T: Scalar> FfnShard<T> {
    /// The TP-invariant FFN of all tokens `x` (`tokens × hidden`) with its all_reduce fused
    /// with the residual add and the next RMSNorm: `residual` becomes `h = residual + FFN(x)`,
    /// `y` receives `rmsnorm(h) * norm.weight` (module docs). Collective: every rank of `comm`
    /// calls it with the same `x`, `residual` and norm, and gets the same `h` and `y`, whose
    /// bits are the same at every TP. Shapes and the norm's arguments (`hidden`, its weight,
    /// `eps`) are checked before any work: a typed [`Error::Shape`].
    pub fn forward_residual_rmsnorm<C, G>(
        &self,
        comm: &C,
        gemm: &G,
        x: &[T],
        residual: &mut [T],
        norm: NextNorm<'_, T>,
        y: &mut [T],
    ) -> Result<(), Error>
    where
        C: ResidualRmsNorm<Stream = ()>,
        G: Gemm<T> + ?Sized,
    {
        let shape = self.shape();
        // One collective call follows (the fused all_reduce): refused here, it counts as refused.
        let partial = before_calls(comm, 1, || {
            self.check_member(comm)?;
            let n = product("tokens x hidden", &[shape.tokens, shape.hidden])?;
            for (name, len) in [("x", x.len()), ("residual", residual.len()), ("y", y.len())] {
                require(len == n, || {
                    format!("{name} has {len} elements, expected {} x {}", shape.tokens, shape.hidden)
                })?;
            }
            check_norm(shape.hidden, norm.weight.len(), norm.eps)?;
            self.leaf_tree(gemm, x)
        })?;
        let rms = RmsNorm {
            residual: Io::host_in_place(residual),
            weight: RawRef::host(norm.weight),
            hidden: shape.hidden,
            eps: norm.eps,
        };
        comm.all_reduce_residual_rmsnorm(Io::host(&partial, y), rms, &())?;
        Ok(())
    }
}

/// The norm's arguments of a decoder tail, checked before any work (the GEMMs run before the
/// fused call, whose own check would come after them): `hidden` 1 to
/// [`fixed_tree::RMSNORM_MAX_HIDDEN`], a weight of `hidden` elements, `eps` finite and at
/// least 0. Shared by the host and GPU layers.
pub(crate) fn check_norm(hidden: usize, weight: usize, eps: f32) -> Result<(), Error> {
    let max = fixed_tree::RMSNORM_MAX_HIDDEN;
    require((1..=max).contains(&hidden), || format!("hidden {hidden} cannot be normalised: expected 1 to {max}"))?;
    require(weight == hidden, || format!("the norm weight has {weight} elements, expected {hidden}"))?;
    require(eps.is_finite() && eps >= 0.0, || format!("the norm's eps is {eps}; expected a finite value, 0 or more"))
}

/// `(h, y)` of [`FfnShard::forward_residual_rmsnorm`] over all tokens, in one process with no
/// collective: the FFN's output [`ffn::reference`] (the tree over the 8 leaf products), then
/// `fixed_tree::residual_rmsnorm` of it as the one contribution.
pub fn reference_residual_rmsnorm<T: Scalar, G: Gemm<T> + ?Sized>(
    gemm: &G,
    shape: FfnShape,
    x: &[T],
    w: (&[T], &[T]),
    residual: &[T],
    norm: NextNorm<'_, T>,
) -> Result<(Vec<T>, Vec<T>), Error> {
    let sum = ffn::reference(gemm, shape, x, w.0, w.1)?;
    normed(shape, &sum, residual, norm)
}

/// [`reference_residual_rmsnorm`] of the gated FFN (SwiGLU, [`crate::ffn`]'s module docs):
/// `w` is `(W1, W3, W2)`, the gate, up and down projections as in
/// [`FfnShard::from_full_gated`]. What a decoder tail of such shards returns at every TP.
pub fn reference_residual_rmsnorm_gated<T: Scalar, G: Gemm<T> + ?Sized>(
    gemm: &G,
    shape: FfnShape,
    x: &[T],
    w: (&[T], &[T], &[T]),
    residual: &[T],
    norm: NextNorm<'_, T>,
) -> Result<(Vec<T>, Vec<T>), Error> {
    let sum = ffn::reference_gated(gemm, shape, x, w.0, w.1, w.2)?;
    normed(shape, &sum, residual, norm)
}

/// `(h, y)` of the FFN output `sum` as the one contribution of `fixed_tree::residual_rmsnorm`.
fn normed<T: Scalar>(
    shape: FfnShape,
    sum: &[T],
    residual: &[T],
    norm: NextNorm<'_, T>,
) -> Result<(Vec<T>, Vec<T>), Error> {
    let (mut h, mut y) = (vec![T::from_f32(0.0); sum.len()], vec![T::from_f32(0.0); sum.len()]);
    let rows = RmsNormShape { rows: shape.tokens, hidden: shape.hidden };
    fixed_tree::residual_rmsnorm(&[sum], residual, norm.weight, norm.eps, rows, &mut h, &mut y)?;
    Ok((h, y))
}
