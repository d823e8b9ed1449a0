//! The sequence-parallel FFN, `AllGather(x) → GEMM(W1, column-parallel) → SiLU →
//! GEMM(W2, row-parallel) → ReduceScatter`, with output bits that do not depend on TP.
//!
//! Tokens (rows of `x` and of the output) are sharded in contiguous blocks: rank `r` of a TP=k
//! group holds tokens `r·S/k .. (r+1)·S/k`. Every rank gathers all `S` tokens, multiplies them
//! by its column shard of `W1` (`hidden × ffn`), applies SiLU, multiplies by its row shard of
//! `W2` (`ffn × hidden`) and the ranks reduce-scatter the `S × hidden` partial sums, so each
//! rank ends with its own tokens' output.
//!
//! # Why the bits are the same at TP = 1, 2, 4 and 8
//!
//! The FFN width `F` is cut into [`LEAVES`] = 8 fixed leaves of `F/8` consecutive columns of
//! `W1` (rows of `W2`). A TP=k rank `r` owns the `8/k` consecutive leaves
//! `r·8/k .. (r+1)·8/k`; its shards of `W1` and `W2` are exactly those leaves.
//!
//! 1. **The hidden activations are TP-invariant.** The first GEMM contracts over `hidden`,
//!    which is never split: `h[t, c]` is one f32 sum over `hidden` in a fixed order (see
//!    [`crate::gemm::ReferenceGemm`]), whatever TP, then rounded to `T` and put through SiLU
//!    (elementwise, [`crate::activation`]). So column `c` of `h` has the same bits on whichever
//!    rank owns it.
//! 2. **Each leaf's product is TP-invariant.** For leaf `l`, `P_l = SiLU(h)[:, leaf l] · W2[leaf
//!    l, :]` is computed as its own GEMM of the same shape at every TP (`m = S`, `k = F/8`,
//!    `n = hidden`) from the same bits, so `P_l` is the same at every TP.
//! 3. **The reduction is the TP=8 tree at every TP.** A rank folds its `8/k` leaf products with
//!    [`fixed_tree::reduce`], which for 1, 2 or 4 inputs is the balanced tree over them; the
//!    reduce_scatter over the `k` ranks then evaluates the balanced tree over the ranks' folds.
//!    That is exactly [`fixed_tree::cross_tp_leaves`]: rank `j` of a TP=k group holding the
//!    tree of leaves `[j·8/k, (j+1)·8/k)`, whose reduction over the k ranks equals the tree over
//!    all 8 leaves bit for bit, because the TP=k tree is the top `log2 k` levels of the TP=8
//!    tree: `((P0+P1)+(P2+P3))+((P4+P5)+(P6+P7))`, every add in `T`.
//!
//! So the output is `tree8(P_0..P_7)` at every TP; [`reference()`] computes it in one process.
//!
//! # The gated FFN (SwiGLU)
//!
//! Llama, Mistral and Qwen gate the activation: `W2 · (SiLU(x · W1) ⊙ (x · W3))`, with `W1` the
//! gate and `W3` the up projection (`hidden × ffn` each, column-parallel alike) and `W2` the down
//! projection. [`FfnShard::from_full_gated`] and [`FfnShard::from_shards_gated`] build that
//! layer; a rank's shard of `W3` is the same leaves as its shard of `W1`. The argument above
//! holds unchanged: `x · W3` contracts over `hidden` too, the product is elementwise
//! ([`activation::silu_mul`]: SiLU rounded to `T`, times the up value, rounded to `T`), so the
//! activations, each leaf product and the tree are the same at every TP;
//! [`reference_gated`] computes the output in one process.
//!
//! [`FfnShard::forward_naive`] is the usual layer for comparison: one GEMM over the rank's
//! whole `F/k` shard, then the reduce_scatter. Its f32 accumulation runs over `F/k` terms and
//! rounds once per rank, so its bits change with TP.
use crate::error::{Error, before_calls, product, require};
use crate::{Gemm, Scalar, activation};
use collective_core::{Collective, Io};
use fixed_tree::SUPPORTED_WORLD_SIZES;
use std::ops::Range;

/// The number of fixed leaves the FFN width is cut into: the largest supported TP size.
pub const LEAVES: usize = 8;

/// The global sizes of one FFN call: `tokens` rows of width `hidden`, FFN width `ffn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FfnShape {
    /// Tokens over all ranks (`S`); each rank holds `S / tp` of them.
    pub tokens: usize,
    /// Model width (`H`): columns of `x` and of the output.
    pub hidden: usize,
    /// FFN width (`F`): columns of `W1`, rows of `W2`. A multiple of [`LEAVES`].
    pub ffn: usize,
}

impl FfnShape {
    /// Columns of one leaf, `ffn / 8`.
    pub fn leaf_width(&self) -> usize {
        self.ffn / LEAVES
    }

    /// Elements of one rank's token block at TP = `tp` (`S/tp × H`), saturating at
    /// `usize::MAX` (the layer refuses such a shape with a typed error).
    ///
    /// # Panics
    ///
    /// If `tp` is 0, like a division by zero (a TP size is 1, 2, 4 or 8).
    pub fn local_len(&self, tp: usize) -> usize {
        assert!(tp != 0, "FfnShape::local_len: the TP size is 0");
        (self.tokens / tp).saturating_mul(self.hidden)
    }

    pub(crate) fn check(&self, tp: usize) -> Result<(), Error> {
        require(SUPPORTED_WORLD_SIZES.contains(&tp), || format!("TP size {tp} is not 1, 2, 4 or 8"))?;
        require(self.ffn.is_multiple_of(LEAVES), || format!("ffn {} is not a multiple of {LEAVES} leaves", self.ffn))?;
        product("tokens x hidden", &[self.tokens, self.hidden])?;
        product("tokens x ffn", &[self.tokens, self.ffn])?;
        product("hidden x ffn", &[self.hidden, self.ffn])?;
        Ok(())
    }
}

/// One rank's weights of a TP=`tp` FFN: its column shard of `W1` (`hidden × ffn/tp`) and row
/// shard of `W2` (`ffn/tp × hidden`), i.e. the leaves [`FfnShard::leaves`]; for the gated FFN
/// (SwiGLU, module docs) also its column shard of `W3`, the same columns as of `W1`.
#[derive(Debug, Clone)]
pub struct FfnShard<T> {
    shape: FfnShape,
    tp: usize,
    rank: usize,
    w1: Vec<T>,
    /// The up projection's shard of the gated FFN (`hidden × ffn/tp`); `None`: SiLU alone.
    w3: Option<Vec<T>>,
    w2: Vec<T>,
}

/// Columns `cols` of the row-major `rows × cols_total` matrix `w`, row-major.
fn columns<T: Copy>(w: &[T], rows: usize, cols_total: usize, cols: Range<usize>) -> Vec<T> {
    w.chunks_exact(cols_total.max(1)).take(rows).flat_map(|row| &row[cols.clone()]).copied().collect()
}

impl<T: Scalar> FfnShard<T> {
    /// Rank `rank`'s shard of the full weights `w1` (`hidden × ffn`, row-major) and `w2`
    /// (`ffn × hidden`, row-major) at TP = `tp`.
    pub fn from_full(shape: FfnShape, w1: &[T], w2: &[T], tp: usize, rank: usize) -> Result<Self, Error> {
        shape.check(tp)?;
        require(rank < tp, || format!("rank {rank} is outside a TP group of {tp}"))?;
        let (h, f) = (shape.hidden, shape.ffn);
        require(w1.len() == h * f, || format!("w1 has {} elements, expected {h} x {f}", w1.len()))?;
        require(w2.len() == f * h, || format!("w2 has {} elements, expected {f} x {h}", w2.len()))?;
        // `f` is a multiple of 8 leaves and `tp` divides 8, so `f / tp` is exact and neither end
        // exceeds `f` (`rank * f` could overflow for an `f` that `h = 0` lets through).
        let cols = rank * (f / tp)..(rank + 1) * (f / tp);
        let w2 = w2[cols.start * h..cols.end * h].to_vec();
        Ok(FfnShard { shape, tp, rank, w1: columns(w1, h, f, cols), w3: None, w2 })
    }

    /// Rank `rank`'s shard of the gated FFN (SwiGLU: `W2 · (SiLU(x · W1) ⊙ (x · W3))`, module
    /// docs) at TP = `tp`: `w1` the gate and `w3` the up projection (`hidden × ffn` each,
    /// row-major), `w2` the down projection (`ffn × hidden`, row-major). The checkpoint names of
    /// Llama-style models: `gate_proj`, `up_proj`, `down_proj` (stored transposed there:
    /// `[ffn, hidden]` for the first two).
    pub fn from_full_gated(
        shape: FfnShape,
        w1: &[T],
        w3: &[T],
        w2: &[T],
        tp: usize,
        rank: usize,
    ) -> Result<Self, Error> {
        let mut shard = FfnShard::from_full(shape, w1, w2, tp, rank)?;
        let (h, f) = (shape.hidden, shape.ffn);
        require(w3.len() == h * f, || format!("w3 has {} elements, expected {h} x {f}", w3.len()))?;
        shard.w3 = Some(columns(w3, h, f, rank * (f / tp)..(rank + 1) * (f / tp)));
        Ok(shard)
    }

    /// Rank `rank`'s shard at TP = `tp` from its own weights, as a per-rank checkpoint holds
    /// them (no rank needs the full matrices): `w1_shard` is columns `rank·ffn/tp ..
    /// (rank+1)·ffn/tp` of `W1`, `hidden × ffn/tp` row-major, and `w2_shard` the same rows of
    /// `W2`, `ffn/tp × hidden` row-major. Taken as they are (not copied); the same shard as
    /// [`FfnShard::from_full`] of the full weights.
    pub fn from_shards(
        shape: FfnShape,
        w1_shard: Vec<T>,
        w2_shard: Vec<T>,
        tp: usize,
        rank: usize,
    ) -> Result<Self, Error> {
        shape.check(tp)?;
        require(rank < tp, || format!("rank {rank} is outside a TP group of {tp}"))?;
        let (h, fk) = (shape.hidden, shape.ffn / tp);
        let (n1, n2) = (w1_shard.len(), w2_shard.len());
        require(n1 == h * fk, || format!("w1_shard has {n1} elements, expected {h} x {fk} (hidden x ffn/tp)"))?;
        require(n2 == fk * h, || format!("w2_shard has {n2} elements, expected {fk} x {h} (ffn/tp x hidden)"))?;
        Ok(FfnShard { shape, tp, rank, w1: w1_shard, w3: None, w2: w2_shard })
    }

    /// The gated FFN's shard (see [`FfnShard::from_full_gated`]) from a rank's own weights:
    /// `w1_shard` and `w3_shard` are columns `rank·ffn/tp .. (rank+1)·ffn/tp` of the gate and up
    /// projections (`hidden × ffn/tp` row-major each), `w2_shard` the same rows of the down
    /// projection (`ffn/tp × hidden` row-major). Taken as they are.
    pub fn from_shards_gated(
        shape: FfnShape,
        w1_shard: Vec<T>,
        w3_shard: Vec<T>,
        w2_shard: Vec<T>,
        tp: usize,
        rank: usize,
    ) -> Result<Self, Error> {
        let mut shard = FfnShard::from_shards(shape, w1_shard, w2_shard, tp, rank)?;
        let (h, fk, n3) = (shape.hidden, shape.ffn / tp, w3_shard.len());
        require(n3 == h * fk, || format!("w3_shard has {n3} elements, expected {h} x {fk} (hidden x ffn/tp)"))?;
        shard.w3 = Some(w3_shard);
        Ok(shard)
    }

    /// Whether this is the gated FFN (SwiGLU), built with a `W3`.
    pub fn is_gated(&self) -> bool {
        self.w3.is_some()
    }

    /// The global sizes.
    pub fn shape(&self) -> FfnShape {
        self.shape
    }

    /// The TP size this shard belongs to.
    pub fn tp(&self) -> usize {
        self.tp
    }

    /// The rank in the TP group this shard belongs to.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The leaves this rank owns: `rank·8/tp .. (rank+1)·8/tp`.
    pub fn leaves(&self) -> Range<usize> {
        let per = LEAVES / self.tp;
        self.rank * per..(self.rank + 1) * per
    }

    /// The TP-invariant layer: `x_local` is this rank's token block (`S/tp × hidden`), `out_local`
    /// receives the output of the same tokens. Collective: every rank of `comm` calls it, with
    /// its own shard. The bits are `tree8` of the 8 leaf products (module docs), at every TP.
    pub fn forward<C, G>(&self, comm: &C, gemm: &G, x_local: &[T], out_local: &mut [T]) -> Result<(), Error>
    where
        C: Collective<Stream = ()>,
        G: Gemm<T> + ?Sized,
    {
        before_calls(comm, 2, || self.check_call(comm, x_local, out_local))?;
        let x = self.gather(comm, x_local)?;
        let partial = before_calls(comm, 1, || self.leaf_tree(gemm, &x))?;
        comm.reduce_scatter(Io::host(&partial, out_local), &())?;
        Ok(())
    }

    /// The naive layer, for comparison: one GEMM over the rank's whole `ffn/tp` shard (one f32
    /// accumulation over `ffn/tp` terms, one rounding), then the reduce_scatter. Deterministic
    /// at a given TP, but its bits change with TP.
    pub fn forward_naive<C, G>(&self, comm: &C, gemm: &G, x_local: &[T], out_local: &mut [T]) -> Result<(), Error>
    where
        C: Collective<Stream = ()>,
        G: Gemm<T> + ?Sized,
    {
        before_calls(comm, 2, || self.check_call(comm, x_local, out_local))?;
        let x = self.gather(comm, x_local)?;
        let (s, fk) = (self.shape.tokens, self.shape.ffn / self.tp);
        let mut partial = vec![T::from_f32(0.0); s * self.shape.hidden];
        if !partial.is_empty() {
            // (No output: the activations are not computed, as in `leaf_tree`.)
            before_calls(comm, 1, || {
                let act = self.hidden(gemm, &x)?;
                gemm.gemm(&act, &self.w2, s, fk, self.shape.hidden, &mut partial)
            })?;
        }
        comm.reduce_scatter(Io::host(&partial, out_local), &())?;
        Ok(())
    }

    fn check_call<C: Collective<Stream = ()>>(&self, comm: &C, x_local: &[T], out_local: &[T]) -> Result<(), Error> {
        self.check_member(comm)?;
        let tokens = self.shape.tokens;
        require(tokens.is_multiple_of(self.tp), || format!("{tokens} tokens do not split over {} ranks", self.tp))?;
        let want = self.shape.local_len(self.tp);
        require(x_local.len() == want, || format!("x_local has {} elements, expected {want}", x_local.len()))?;
        require(out_local.len() == want, || format!("out_local has {} elements, expected {want}", out_local.len()))
    }

    /// `comm` is the rank of the TP group this shard belongs to.
    pub(crate) fn check_member<C: Collective>(&self, comm: &C) -> Result<(), Error> {
        require(comm.world_size() == self.tp && comm.rank() == self.rank, || {
            format!(
                "shard of rank {} of TP {} called on rank {} of a world of {}",
                self.rank,
                self.tp,
                comm.rank(),
                comm.world_size()
            )
        })
    }

    /// All tokens, in token order (rank order is token order: the blocks are contiguous).
    fn gather<C: Collective<Stream = ()>>(&self, comm: &C, x_local: &[T]) -> Result<Vec<T>, Error> {
        let mut x = vec![T::from_f32(0.0); self.shape.tokens * self.shape.hidden];
        comm.all_gather(Io::host(x_local, &mut x), &())?;
        Ok(x)
    }

    /// `SiLU(x · W1_shard)`, `S × ffn/tp`, rounded to `T` after the GEMM and after SiLU; gated,
    /// `SiLU(x · W1_shard) ⊙ (x · W3_shard)` ([`activation::silu_mul`] after both GEMMs).
    fn hidden<G: Gemm<T> + ?Sized>(&self, gemm: &G, x: &[T]) -> Result<Vec<T>, Error> {
        let (s, h, fk) = (self.shape.tokens, self.shape.hidden, self.shape.ffn / self.tp);
        let mut act = vec![T::from_f32(0.0); s * fk];
        gemm.gemm(x, &self.w1, s, h, fk, &mut act)?;
        match &self.w3 {
            None => activation::silu_in_place(&mut act),
            Some(w3) => {
                let mut up = vec![T::from_f32(0.0); s * fk];
                gemm.gemm(x, w3, s, h, fk, &mut up)?;
                activation::silu_mul_in_place(&mut act, &up);
            }
        }
        Ok(act)
    }

    /// This rank's part of the tree: the balanced tree over its leaves' products, `S × hidden`.
    pub(crate) fn leaf_tree<G: Gemm<T> + ?Sized>(&self, gemm: &G, x: &[T]) -> Result<Vec<T>, Error> {
        let (s, h, w) = (self.shape.tokens, self.shape.hidden, self.shape.leaf_width());
        if s == 0 || h == 0 {
            // No output: nothing to compute, and the `S × ffn/tp` activations (2^44 elements
            // for 2^20 tokens of width 0 and ffn 2^24) are not allocated.
            return Ok(Vec::new());
        }
        let act = self.hidden(gemm, x)?;
        let fk = self.shape.ffn / self.tp;
        let mut a_leaf = vec![T::from_f32(0.0); s * w];
        let mut products = Vec::with_capacity(self.leaves().len());
        for j in 0..self.leaves().len() {
            // Leaf j's columns of the activations, as their own `S × F/8` matrix: the GEMM then
            // has the same shape at every TP.
            for (dst, src) in a_leaf.chunks_exact_mut(w.max(1)).zip(act.chunks_exact(fk.max(1))) {
                dst.copy_from_slice(&src[j * w..(j + 1) * w]);
            }
            let mut p = vec![T::from_f32(0.0); s * h];
            gemm.gemm(&a_leaf, &self.w2[j * w * h..(j + 1) * w * h], s, w, h, &mut p)?;
            products.push(p);
        }
        let refs: Vec<&[T]> = products.iter().map(Vec::as_slice).collect();
        let mut partial = vec![T::from_f32(0.0); s * h];
        fixed_tree::reduce(&refs, &mut partial)?;
        Ok(partial)
    }
}

/// The output of the TP-invariant layer over all tokens, computed in one process with no
/// collective: the 8 leaf products (each as the TP=8 rank owning it computes it), reduced by
/// [`fixed_tree::reduce`] over the 8 of them. `x` is `tokens × hidden`, the full weights as in
/// [`FfnShard::from_full`]; the result is `tokens × hidden` in token order.
pub fn reference<T: Scalar, G: Gemm<T> + ?Sized>(
    gemm: &G,
    shape: FfnShape,
    x: &[T],
    w1: &[T],
    w2: &[T],
) -> Result<Vec<T>, Error> {
    reference_of(gemm, shape, x, |leaf| FfnShard::from_full(shape, w1, w2, LEAVES, leaf))
}

/// [`reference()`] of the gated FFN (SwiGLU, module docs): `w1` the gate and `w3` the up
/// projection (`hidden × ffn`), `w2` the down projection (`ffn × hidden`), as in
/// [`FfnShard::from_full_gated`]. The output of its TP-invariant layer at every TP.
pub fn reference_gated<T: Scalar, G: Gemm<T> + ?Sized>(
    gemm: &G,
    shape: FfnShape,
    x: &[T],
    w1: &[T],
    w3: &[T],
    w2: &[T],
) -> Result<Vec<T>, Error> {
    reference_of(gemm, shape, x, |leaf| FfnShard::from_full_gated(shape, w1, w3, w2, LEAVES, leaf))
}

/// The tree over the 8 leaf products, leaf `l`'s as the TP=8 shard `shard(l)` computes it.
fn reference_of<T: Scalar, G: Gemm<T> + ?Sized>(
    gemm: &G,
    shape: FfnShape,
    x: &[T],
    shard: impl Fn(usize) -> Result<FfnShard<T>, Error>,
) -> Result<Vec<T>, Error> {
    let n = product("tokens x hidden", &[shape.tokens, shape.hidden])?;
    require(x.len() == n, || format!("x has {} elements, expected {n}", x.len()))?;
    let products = (0..LEAVES).map(|leaf| shard(leaf)?.leaf_tree(gemm, x)).collect::<Result<Vec<_>, Error>>()?;
    let refs: Vec<&[T]> = products.iter().map(Vec::as_slice).collect();
    let mut out = vec![T::from_f32(0.0); n];
    fixed_tree::reduce(&refs, &mut out)?;
    Ok(out)
}
