//! The sequence-parallel FFN on the GPU: [`CudaFfnShard`] holds one rank's leaves of `W1` and
//! `W2` on the device, [`FfnWorkspace`] every buffer a forward needs.
//!
//! The TP-invariant forward is [`crate::ffn`]'s, stage by stage:
//! `AllGather(x)` → `Gemm1` (one `S × H × F/8` GEMM per leaf of the rank) → `Activation`
//! (SiLU in f32 over every leaf's activations) → `Gemm2` (one `S × F/8 × H` GEMM per leaf, the
//! leaf product `P_l`) → `LeafFold` (the balanced tree over the rank's `8/tp` products, in `T`:
//! 2 = `P0+P1`, 4 = `(P0+P1)+(P2+P3)`; one leaf, at TP = 8, is its own partial sum: GEMM 2
//! writes it there and there is no fold stage) → `ReduceScatter` (the balanced tree over the
//! ranks, the top levels of the same 8-leaf tree).
//!
//! # Layout: the same GEMM at every TP
//!
//! cuBLAS may pick its kernel by `m`, `n`, `k`, the leading dimensions and the pointers'
//! alignment, so every GEMM that feeds the output is given the same ones at every TP: each
//! leaf's `W1` block (`H × F/8`), `W2` block (`F/8 × H`), activations (`S × F/8`) and product
//! (`S × H`) is its own contiguous row-major matrix, and consecutive blocks start
//! [`ALIGN_BYTES`] apart at least (each block is padded to a multiple of it), so a leaf's block
//! has the same alignment whichever position it has in a rank's buffer. Leaf `l`'s GEMMs are
//! then the same calls on the same bits at TP = 1, 2, 4 and 8.
//!
//! The naive layer ([`CudaFfnShard::forward_naive`]) keeps its own row-major copies of the
//! rank's shards (`H × F/tp` and `F/tp × H`): one GEMM1 over the whole shard, SiLU, one GEMM2
//! `S × F/tp × H` into the partial sums, the reduce_scatter. Its bits change with TP.
//!
//! The gated FFN (SwiGLU, [`CudaFfnShard::from_full_gated`]; [`crate::ffn`]'s module docs) packs
//! its up projection `W3` as `W1` is packed; `Gemm1` then makes each leaf's up GEMM after its
//! gate GEMM (the same shape and layout), and `Activation` is SiLU of the gate times up, in
//! place over the gate's activations (`silu_mul`).
use super::kernels::elementwise;
use super::{CudaGemm, CudaKernels, CudaScalar, Stage, StageHook};
use crate::error::{before_calls, product, require};
use crate::{Error, FfnShape, LEAVES};
use collective_factory::NvidiaCollective;
use cudarc::driver::{CudaSlice, CudaStream, PushKernelArg};
use std::ops::Range;
use std::sync::Arc;

/// Every leaf block (weights, activations, products) starts at a multiple of this many bytes
/// from its buffer's start (cudarc's allocations are at least this aligned).
pub const ALIGN_BYTES: usize = 256;

/// `len` elements of `T` rounded up to a multiple of [`ALIGN_BYTES`].
fn padded<T>(what: &str, len: usize) -> Result<usize, Error> {
    let per = (ALIGN_BYTES / size_of::<T>()).max(1);
    len.checked_next_multiple_of(per).ok_or_else(|| Error::Shape(format!("{what}: {len} elements overflow usize")))
}

/// The sizes of one rank's buffers, all checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    shape: FfnShape,
    tp: usize,
    /// Leaves of the rank (`8 / tp`).
    leaves: usize,
    /// `F / 8`.
    width: usize,
    /// Distance in elements between consecutive `W1` leaf blocks (`H × F/8`, padded).
    w1_stride: usize,
    /// Between `W2` leaf blocks (`F/8 × H`, padded).
    w2_stride: usize,
    /// Between activation blocks (`S × F/8`, padded).
    act_stride: usize,
    /// Between leaf products (`S × H`, padded).
    prod_stride: usize,
    /// The gated FFN (SwiGLU): a `W3` packed like `W1`, up activations like the gate's.
    gated: bool,
}

impl Layout {
    fn new<T>(shape: FfnShape, tp: usize, gated: bool) -> Result<Self, Error> {
        shape.check(tp)?;
        let (s, h, f) = (shape.tokens, shape.hidden, shape.ffn);
        require(s > 0 && h > 0 && f > 0, || format!("every FFN dimension must be at least 1: {shape:?}"))?;
        require(s % tp == 0, || format!("{s} tokens do not split over {tp} ranks"))?;
        // cuBLAS takes `int` dimensions: checked here, so no GEMM of a forward can refuse them
        // after the forward's first collective was enqueued.
        require([s, h, f].iter().all(|&d| i32::try_from(d).is_ok()), || {
            format!("FFN dimensions {shape:?} must each fit cuBLAS's int")
        })?;
        let width = f / LEAVES;
        let leaves = LEAVES / tp;
        let layout = Layout {
            shape,
            tp,
            leaves,
            width,
            w1_stride: padded::<T>("W1 leaf", product("hidden x ffn/8", &[h, width])?)?,
            w2_stride: padded::<T>("W2 leaf", product("ffn/8 x hidden", &[width, h])?)?,
            act_stride: padded::<T>("activation leaf", product("tokens x ffn/8", &[s, width])?)?,
            prod_stride: padded::<T>("leaf product", product("tokens x hidden", &[s, h])?)?,
            gated,
        };
        // Every buffer's total length, checked once here so later products cannot overflow.
        for (what, stride) in [
            ("W1 leaves", layout.w1_stride),
            ("W2 leaves", layout.w2_stride),
            ("activations", layout.act_stride),
            ("leaf products", layout.prod_stride),
        ] {
            product(what, &[stride, leaves])?;
        }
        Ok(layout)
    }
}

/// How a rank's weights are given: the full matrices ([`CudaFfnShard::from_full`]), or the
/// rank's own shards as a per-rank checkpoint holds them ([`CudaFfnShard::from_shards`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Given {
    Full,
    Shard,
}

impl Given {
    /// Columns of the given `W1`/`W3` (rows of `W2`), and this rank's first of them.
    fn span(self, layout: Layout, rank: usize) -> (usize, usize) {
        let per = layout.shape.ffn / layout.tp;
        match self {
            Given::Full => (layout.shape.ffn, rank * per),
            Given::Shard => (per, 0),
        }
    }

    /// The argument names errors use: `w1`, `w3`, `w2` or `w1_shard`, ...
    fn name(self, w: &str) -> String {
        match self {
            Given::Full => w.to_owned(),
            Given::Shard => format!("{w}_shard"),
        }
    }
}

/// One rank's weights in the device layout, on the host (what [`CudaFfnShard::from_full`]
/// and [`CudaFfnShard::from_shards`] upload).
#[derive(Debug)]
struct HostWeights<T> {
    w1: Vec<T>,
    w2: Vec<T>,
    w1_naive: Vec<T>,
    w2_naive: Vec<T>,
    /// The gated FFN's `W3`, packed as `W1` (leaves, then the naive shard).
    w3: Option<(Vec<T>, Vec<T>)>,
}

impl<T: crate::Scalar> HostWeights<T> {
    /// Rank `rank`'s leaves of `w1` (`H × n`, row-major), `w3` (the gated FFN, as `w1`) and `w2`
    /// (`n × H`), each leaf block at `j * stride` (padding zero), and its row-major shards for
    /// the naive layer; `n` is `F` for the full matrices, `F/tp` for the rank's shards
    /// ([`Given`]).
    fn pack(layout: Layout, given: Given, w1: &[T], w3: Option<&[T]>, w2: &[T], rank: usize) -> Result<Self, Error> {
        let tp = layout.tp;
        require(rank < tp, || format!("rank {rank} is outside a TP group of {tp}"))?;
        require(w3.is_some() == layout.gated, || "W3 given to a layout of the other FFN kind".into())?;
        let (h, w, per) = (layout.shape.hidden, layout.width, layout.shape.ffn / tp);
        let (n, first) = given.span(layout, rank);
        let len = product("hidden x ffn", &[h, n])?;
        let what = if given == Given::Full { "" } else { " (hidden x ffn/tp)" };
        for (name, m) in [("w1", Some(w1)), ("w3", w3)] {
            let Some(m) = m else { continue };
            let name = given.name(name);
            require(m.len() == len, || format!("{name} has {} elements, expected {h} x {n}{what}", m.len()))?;
        }
        let what = if given == Given::Full { "" } else { " (ffn/tp x hidden)" };
        let name = given.name("w2");
        require(w2.len() == len, || format!("{name} has {} elements, expected {n} x {h}{what}", w2.len()))?;
        let mut w2_leaves = vec![T::from_f32(0.0); layout.w2_stride * layout.leaves];
        for j in 0..layout.leaves {
            let r0 = first + j * w;
            w2_leaves[j * layout.w2_stride..][..w * h].copy_from_slice(&w2[r0 * h..(r0 + w) * h]);
        }
        let (w1, w1_naive) = Self::columns(layout, w1, n, first);
        Ok(HostWeights {
            w1,
            w2: w2_leaves,
            w1_naive,
            w2_naive: w2[first * h..(first + per) * h].to_vec(),
            w3: w3.map(|w3| Self::columns(layout, w3, n, first)),
        })
    }

    /// The rank's columns `first .. first + F/tp` of a column-parallel `H × n` weight (`W1`,
    /// `W3`): its leaf blocks, `w1_stride` apart (padding zero), and its row-major `H × F/tp`
    /// shard.
    fn columns(layout: Layout, m: &[T], n: usize, first: usize) -> (Vec<T>, Vec<T>) {
        let (h, w, per) = (layout.shape.hidden, layout.width, layout.shape.ffn / layout.tp);
        let mut leaves = vec![T::from_f32(0.0); layout.w1_stride * layout.leaves];
        for j in 0..layout.leaves {
            let c0 = first + j * w;
            let block = &mut leaves[j * layout.w1_stride..][..h * w];
            for (dst, row) in block.chunks_exact_mut(w).zip(m.chunks_exact(n)) {
                dst.copy_from_slice(&row[c0..c0 + w]);
            }
        }
        (leaves, m.chunks_exact(n).flat_map(|row| &row[first..first + per]).copied().collect())
    }
}

/// One rank's weights of a TP=`tp` FFN on the device: its leaves of `W1` and `W2` in the
/// layout of the module docs, and row-major copies of its shards for the naive layer (until
/// [`CudaFfnShard::without_naive`] drops them).
#[derive(Debug)]
pub struct CudaFfnShard<T> {
    layout: Layout,
    rank: usize,
    /// `[leaf][H][F/8]`, leaf blocks `w1_stride` apart.
    w1: CudaSlice<T>,
    /// `[leaf][F/8][H]`, leaf blocks `w2_stride` apart.
    w2: CudaSlice<T>,
    /// The gated FFN's `W3`, leaves as `w1`.
    w3: Option<CudaSlice<T>>,
    /// The naive layer's weights: as much device memory again as the leaves.
    naive: Option<NaiveWeights<T>>,
}

/// The rank's shards row-major, for [`CudaFfnShard::forward_naive`].
#[derive(Debug)]
struct NaiveWeights<T> {
    /// `H × F/tp`.
    w1: CudaSlice<T>,
    /// `F/tp × H`.
    w2: CudaSlice<T>,
    /// The gated FFN's `W3`, `H × F/tp`.
    w3: Option<CudaSlice<T>>,
}

/// Every buffer a forward of one [`CudaFfnShard`] needs, allocated up front
/// ([`CudaFfnShard::workspace`]), so a forward allocates nothing.
#[derive(Debug)]
pub struct FfnWorkspace<T> {
    layout: Layout,
    /// All tokens, `S × H`.
    x: CudaSlice<T>,
    /// `[leaf][S][F/8]` (the naive layer: `S × F/tp` from the start).
    act: CudaSlice<T>,
    /// `[leaf][S][H]`.
    products: CudaSlice<T>,
    /// This rank's partial sums, `S × H`.
    partial: CudaSlice<T>,
    /// The gated FFN's up activations, laid out as `act`.
    up: Option<CudaSlice<T>>,
}

impl<T: CudaScalar> CudaFfnShard<T> {
    /// Rank `rank`'s shard of the full weights `w1` (`hidden × ffn`, row-major) and `w2`
    /// (`ffn × hidden`, row-major) at TP = `tp`, uploaded on `stream`. Allocates: create it
    /// before any peer sharing the GPU has a collective in flight.
    pub fn from_full(
        stream: &Arc<CudaStream>,
        shape: FfnShape,
        w1: &[T],
        w2: &[T],
        tp: usize,
        rank: usize,
    ) -> Result<Self, Error> {
        Self::upload(stream, shape, Given::Full, w1, None, w2, tp, rank)
    }

    /// Rank `rank`'s shard at TP = `tp` from its own weights, as a per-rank checkpoint holds
    /// them (no rank needs the full matrices on the host): `w1_shard` is columns `rank·ffn/tp ..
    /// (rank+1)·ffn/tp` of `W1`, `hidden × ffn/tp` row-major, and `w2_shard` the same rows of
    /// `W2`, `ffn/tp × hidden` row-major — [`crate::FfnShard::from_shards`]'s. The same device
    /// weights as [`CudaFfnShard::from_full`] of the full matrices, so the same bits. Uploaded
    /// on `stream`; allocates: create it before any peer sharing the GPU has a collective in
    /// flight.
    pub fn from_shards(
        stream: &Arc<CudaStream>,
        shape: FfnShape,
        w1_shard: &[T],
        w2_shard: &[T],
        tp: usize,
        rank: usize,
    ) -> Result<Self, Error> {
        Self::upload(stream, shape, Given::Shard, w1_shard, None, w2_shard, tp, rank)
    }

    /// Rank `rank`'s shard of the gated FFN (SwiGLU: `W2 · (SiLU(x · W1) ⊙ (x · W3))`,
    /// [`crate::FfnShard::from_full_gated`]'s) at TP = `tp`: `w1` the gate and `w3` the up
    /// projection (`hidden × ffn`, row-major each), `w2` the down projection (`ffn × hidden`,
    /// row-major), uploaded on `stream`. Allocates: create it before any peer sharing the GPU
    /// has a collective in flight.
    #[allow(clippy::too_many_arguments)]
    pub fn from_full_gated(
        stream: &Arc<CudaStream>,
        shape: FfnShape,
        w1: &[T],
        w3: &[T],
        w2: &[T],
        tp: usize,
        rank: usize,
    ) -> Result<Self, Error> {
        Self::upload(stream, shape, Given::Full, w1, Some(w3), w2, tp, rank)
    }

    /// The gated FFN's shard from a rank's own weights: `w1_shard` and `w3_shard` its columns of
    /// the gate and up projections (`hidden × ffn/tp` row-major each), `w2_shard` the same rows
    /// of the down projection (`ffn/tp × hidden` row-major) — [`crate::FfnShard::from_shards_gated`]'s.
    /// The same device weights as [`CudaFfnShard::from_full_gated`] of the full matrices.
    #[allow(clippy::too_many_arguments)]
    pub fn from_shards_gated(
        stream: &Arc<CudaStream>,
        shape: FfnShape,
        w1_shard: &[T],
        w3_shard: &[T],
        w2_shard: &[T],
        tp: usize,
        rank: usize,
    ) -> Result<Self, Error> {
        Self::upload(stream, shape, Given::Shard, w1_shard, Some(w3_shard), w2_shard, tp, rank)
    }

    #[allow(clippy::too_many_arguments)]
    fn upload(
        stream: &Arc<CudaStream>,
        shape: FfnShape,
        given: Given,
        w1: &[T],
        w3: Option<&[T]>,
        w2: &[T],
        tp: usize,
        rank: usize,
    ) -> Result<Self, Error> {
        let layout = Layout::new::<T>(shape, tp, w3.is_some())?;
        let host = HostWeights::pack(layout, given, w1, w3, w2, rank)?;
        let up = |v: &[T]| stream.clone_htod(v).map_err(super::driver("uploading FFN weights"));
        let (w3, w3_naive) = match &host.w3 {
            Some((leaves, naive)) => (Some(up(leaves)?), Some(up(naive)?)),
            None => (None, None),
        };
        let naive = NaiveWeights { w1: up(&host.w1_naive)?, w2: up(&host.w2_naive)?, w3: w3_naive };
        Ok(CudaFfnShard { layout, rank, w1: up(&host.w1)?, w2: up(&host.w2)?, w3, naive: Some(naive) })
    }

    /// This shard without the naive layer's weights: the row-major copies of the rank's shards
    /// that only [`CudaFfnShard::forward_naive`] reads (a comparison baseline), as much device
    /// memory again as the weights [`CudaFfnShard::forward`] and
    /// [`CudaFfnShard::forward_residual_rmsnorm`] read. Those two are unchanged (the same bits);
    /// `forward_naive` then fails with [`Error::Shape`] before any collective call (counted as
    /// refused on `comm`, as every refused layer call is), and [`CudaFfnShard::warm_up`] warms
    /// the TP-invariant layer's kernels only. The memory is freed when the copies' frees run on
    /// their stream.
    pub fn without_naive(mut self) -> Self {
        self.naive = None;
        self
    }

    /// Whether [`CudaFfnShard::forward_naive`] can run: the naive layer's weights are held
    /// (every constructor uploads them; [`CudaFfnShard::without_naive`] drops them).
    pub fn has_naive(&self) -> bool {
        self.naive.is_some()
    }

    /// Whether this is the gated FFN (SwiGLU), built with a `W3`.
    pub fn is_gated(&self) -> bool {
        self.layout.gated
    }

    /// The global sizes.
    pub fn shape(&self) -> FfnShape {
        self.layout.shape
    }

    /// The TP size this shard belongs to.
    pub fn tp(&self) -> usize {
        self.layout.tp
    }

    /// The rank in the TP group this shard belongs to.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The leaves this rank owns: `rank·8/tp .. (rank+1)·8/tp`.
    pub fn leaves(&self) -> Range<usize> {
        self.rank * self.layout.leaves..(self.rank + 1) * self.layout.leaves
    }

    /// Elements of this rank's token block, `x_local` and `out_local` (`S/tp × H`).
    pub fn local_len(&self) -> usize {
        self.layout.shape.local_len(self.layout.tp)
    }

    /// Every buffer [`CudaFfnShard::forward`] and [`CudaFfnShard::forward_naive`] need,
    /// allocated (zeroed) on `stream`. Allocates: create it before any peer sharing the GPU has
    /// a collective in flight.
    pub fn workspace(&self, stream: &Arc<CudaStream>) -> Result<FfnWorkspace<T>, Error> {
        let l = self.layout;
        let (s, h) = (l.shape.tokens, l.shape.hidden);
        let alloc = |n: usize| stream.alloc_zeros::<T>(n).map_err(super::driver("allocating the FFN workspace"));
        // The naive layer's activations (`S × F/tp`) fit in the leaves' (`leaves × S × F/8`).
        Ok(FfnWorkspace {
            layout: l,
            x: alloc(s * h)?,
            act: alloc(l.act_stride * l.leaves)?,
            products: alloc(l.prod_stride * l.leaves)?,
            partial: alloc(s * h)?,
            up: if l.gated { Some(alloc(l.act_stride * l.leaves)?) } else { None },
        })
    }

    /// The TP-invariant layer (module docs): `x_local` is this rank's token block
    /// (`S/tp × H`), `out_local` receives the output of the same tokens. Collective: every rank
    /// of `comm` calls it with its own shard. Enqueues on `stream` only (no allocation, no
    /// synchronisation: graph capture works); `gemm` must be bound to `stream` and `kernels`
    /// loaded in its context. Shapes are checked before anything is enqueued.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        comm: &NvidiaCollective,
        gemm: &CudaGemm,
        kernels: &CudaKernels,
        ws: &mut FfnWorkspace<T>,
        x_local: &CudaSlice<T>,
        out_local: &mut CudaSlice<T>,
        stream: &Arc<CudaStream>,
        hook: &mut dyn StageHook,
    ) -> Result<(), Error> {
        // Refused before its all_gather and reduce_scatter: both count as refused on `comm`.
        before_calls(comm, 2, || self.check_call(comm, gemm, kernels, ws, x_local, out_local, stream))?;
        gather(comm, x_local, ws, stream, hook)?;
        before_calls(comm, 1, || self.leaf_partial(gemm, kernels, ws, None, stream, hook))?;
        scatter(comm, ws, out_local, stream, hook)
    }

    /// The end of a tensor-parallel decoder layer on the GPU ([`crate::decoder`]'s, with this
    /// rank's leaves): every rank holds all tokens `x` (`S × H`), computes the balanced tree over
    /// its leaf products as [`CudaFfnShard::forward`] does, and the fused call
    /// `all_reduce_residual_rmsnorm` evaluates the tree's top levels over the ranks, then
    /// `residual = h = residual + FFN(x)` in `T` and `y = rmsnorm(h) * weight` in the fixed order
    /// of `fixed_tree::residual_rmsnorm` (one kernel on the IPC routes for decode batches). `h`
    /// and `y` have the same bits at TP = 1, 2, 4 and 8 (the promise of the module, for the GEMMs;
    /// the norm's bits are the reference's for the FFN output the GPU computed).
    ///
    /// Collective: every rank of `comm` calls it with the same `x`, `residual`, `weight` and
    /// `eps`. Enqueues on `stream` only (graph capture works). Shapes (`x`, `residual`, `y`:
    /// `S × H`; `weight`: `H`) and the handles are checked before anything is enqueued; the
    /// norm's own arguments (`eps`, aliasing) by the collective, before any device work.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_residual_rmsnorm(
        &self,
        comm: &NvidiaCollective,
        gemm: &CudaGemm,
        kernels: &CudaKernels,
        ws: &mut FfnWorkspace<T>,
        x: &CudaSlice<T>,
        residual: &mut CudaSlice<T>,
        weight: &CudaSlice<T>,
        eps: f32,
        y: &mut CudaSlice<T>,
        stream: &Arc<CudaStream>,
        hook: &mut dyn StageHook,
    ) -> Result<(), Error> {
        let shape = self.layout.shape;
        // Refused before its fused all_reduce: that call counts as refused on `comm`.
        before_calls(comm, 1, || {
            super::check_member(comm, "FFN shard", "TP", self.layout.tp, self.rank, stream)?;
            self.check_handles(gemm, kernels, ws, stream)?;
            let n = product("tokens x hidden", &[shape.tokens, shape.hidden])?;
            for (name, len) in [("x", x.len()), ("residual", residual.len()), ("y", y.len())] {
                require(len == n, || {
                    format!("{name} has {len} elements, expected {} x {}", shape.tokens, shape.hidden)
                })?;
            }
            crate::decoder::check_norm(shape.hidden, weight.len(), eps)?;
            self.leaf_partial(gemm, kernels, ws, Some(x), stream, hook)?;
            hook.before(Stage::AllReduceNorm, stream)
        })?;
        comm.all_reduce_residual_rmsnorm_into(&ws.partial, y, residual, weight, shape.hidden, eps, stream)?;
        hook.after(Stage::AllReduceNorm, stream)
    }

    /// `ws.partial` = the balanced tree over this rank's leaf products of the tokens `x`
    /// (`None`: the workspace's gathered tokens): `Gemm1`, `Activation`, `Gemm2`, `LeafFold`.
    fn leaf_partial(
        &self,
        gemm: &CudaGemm,
        kernels: &CudaKernels,
        ws: &mut FfnWorkspace<T>,
        x: Option<&CudaSlice<T>>,
        stream: &Arc<CudaStream>,
        hook: &mut dyn StageHook,
    ) -> Result<(), Error> {
        let l = self.layout;
        let (s, h, w) = (l.shape.tokens, l.shape.hidden, l.width);
        let x = x.unwrap_or(&ws.x);

        hook.before(Stage::Gemm1, stream)?;
        for j in 0..l.leaves {
            let b = self.w1.slice(j * l.w1_stride..j * l.w1_stride + h * w);
            let mut c = ws.act.slice_mut(j * l.act_stride..j * l.act_stride + s * w);
            gemm.gemm(x, &b, s, h, w, &mut c)?;
            if let (Some(w3), Some(up)) = (&self.w3, &mut ws.up) {
                let b = w3.slice(j * l.w1_stride..j * l.w1_stride + h * w);
                let mut c = up.slice_mut(j * l.act_stride..j * l.act_stride + s * w);
                gemm.gemm(x, &b, s, h, w, &mut c)?;
            }
        }
        hook.after(Stage::Gemm1, stream)?;

        activate(kernels, &mut ws.act, ws.up.as_ref(), l.act_stride * l.leaves, stream, hook)?;

        hook.before(Stage::Gemm2, stream)?;
        if l.leaves == 1 {
            // One leaf (TP = 8): its product is the rank's partial sum (the tree over one
            // product is the product), so GEMM 2 writes it there and there is no fold. Same
            // shape, leading dimensions and 256-byte alignment as a product slot.
            let a = ws.act.slice(..s * w);
            gemm.gemm(&a, &self.w2.slice(..w * h), s, w, h, &mut ws.partial)?;
            return hook.after(Stage::Gemm2, stream);
        }
        for j in 0..l.leaves {
            let a = ws.act.slice(j * l.act_stride..j * l.act_stride + s * w);
            let b = self.w2.slice(j * l.w2_stride..j * l.w2_stride + w * h);
            let mut c = ws.products.slice_mut(j * l.prod_stride..j * l.prod_stride + s * h);
            gemm.gemm(&a, &b, s, w, h, &mut c)?;
        }
        hook.after(Stage::Gemm2, stream)?;

        hook.before(Stage::LeafFold, stream)?;
        leaf_fold(kernels, ws, stream)?;
        hook.after(Stage::LeafFold, stream)
    }

    /// The naive layer, for comparison: one GEMM1 over the rank's whole `F/tp` shard, SiLU,
    /// one GEMM2 `S × F/tp × H` into the partial sums, the reduce_scatter. Deterministic at a
    /// given TP, but its bits change with TP. Same arguments and rules as
    /// [`CudaFfnShard::forward`] (its stages: no `LeafFold`).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_naive(
        &self,
        comm: &NvidiaCollective,
        gemm: &CudaGemm,
        kernels: &CudaKernels,
        ws: &mut FfnWorkspace<T>,
        x_local: &CudaSlice<T>,
        out_local: &mut CudaSlice<T>,
        stream: &Arc<CudaStream>,
        hook: &mut dyn StageHook,
    ) -> Result<(), Error> {
        before_calls(comm, 2, || {
            self.naive()?;
            self.check_call(comm, gemm, kernels, ws, x_local, out_local, stream)
        })?;
        gather(comm, x_local, ws, stream, hook)?;
        before_calls(comm, 1, || self.naive_gemms(gemm, kernels, ws, stream, hook))?;
        scatter(comm, ws, out_local, stream, hook)
    }

    /// The naive layer's weights, or the error of a shard that dropped them.
    fn naive(&self) -> Result<&NaiveWeights<T>, Error> {
        self.naive.as_ref().ok_or_else(|| {
            Error::Shape("forward_naive: this shard's naive weights were dropped (CudaFfnShard::without_naive)".into())
        })
    }

    /// `SiLU(x · W1_shard) · W2_shard` into `ws.partial` (gated: `(SiLU(x · W1_shard) ⊙ (x ·
    /// W3_shard)) · W2_shard`).
    fn naive_gemms(
        &self,
        gemm: &CudaGemm,
        kernels: &CudaKernels,
        ws: &mut FfnWorkspace<T>,
        stream: &Arc<CudaStream>,
        hook: &mut dyn StageHook,
    ) -> Result<(), Error> {
        let naive = self.naive()?;
        let l = self.layout;
        let (s, h, fk) = (l.shape.tokens, l.shape.hidden, l.shape.ffn / l.tp);
        hook.before(Stage::Gemm1, stream)?;
        gemm.gemm(&ws.x, &naive.w1, s, h, fk, &mut ws.act.slice_mut(..s * fk))?;
        if let (Some(w3), Some(up)) = (&naive.w3, &mut ws.up) {
            gemm.gemm(&ws.x, w3, s, h, fk, &mut up.slice_mut(..s * fk))?;
        }
        hook.after(Stage::Gemm1, stream)?;
        activate(kernels, &mut ws.act, ws.up.as_ref(), s * fk, stream, hook)?;
        hook.before(Stage::Gemm2, stream)?;
        gemm.gemm(&ws.act.slice(..s * fk), &naive.w2, s, fk, h, &mut ws.partial)?;
        hook.after(Stage::Gemm2, stream)
    }

    /// Runs every non-collective kernel of both layers (the naive one's while its weights are
    /// held) once on `ws` (whatever its tokens hold) and waits for them: cuBLAS loads its
    /// kernels lazily on first use, which may wait for the device to go idle, so ranks that are
    /// threads sharing one GPU call this before the first collective of any rank. Synchronises
    /// `stream`.
    pub fn warm_up(
        &self,
        gemm: &CudaGemm,
        kernels: &CudaKernels,
        ws: &mut FfnWorkspace<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        self.check_handles(gemm, kernels, ws, stream)?;
        let l = self.layout;
        let (s, h, w) = (l.shape.tokens, l.shape.hidden, l.width);
        let hook = &mut ();
        if self.naive.is_some() {
            self.naive_gemms(gemm, kernels, ws, stream, hook)?;
        }
        let b = self.w1.slice(..h * w);
        gemm.gemm(&ws.x, &b, s, h, w, &mut ws.act.slice_mut(..s * w))?;
        let b = self.w2.slice(..w * h);
        gemm.gemm(&ws.act.slice(..s * w), &b, s, w, h, &mut ws.products.slice_mut(..s * h))?;
        leaf_fold(kernels, ws, stream)?;
        stream.synchronize().map_err(super::driver("cuStreamSynchronize"))
    }

    fn check_handles(
        &self,
        gemm: &CudaGemm,
        kernels: &CudaKernels,
        ws: &FfnWorkspace<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        require(ws.layout == self.layout, || "the workspace was made for another shard shape or TP".into())?;
        require(gemm.stream().cu_stream() == stream.cu_stream(), || "the CudaGemm is bound to another stream".into())?;
        require(kernels.context().cu_ctx() == stream.context().cu_ctx(), || {
            "the kernels are loaded in another context than the stream's".into()
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn check_call(
        &self,
        comm: &NvidiaCollective,
        gemm: &CudaGemm,
        kernels: &CudaKernels,
        ws: &FfnWorkspace<T>,
        x_local: &CudaSlice<T>,
        out_local: &CudaSlice<T>,
        stream: &Arc<CudaStream>,
    ) -> Result<(), Error> {
        super::check_member(comm, "FFN shard", "TP", self.layout.tp, self.rank, stream)?;
        self.check_handles(gemm, kernels, ws, stream)?;
        let want = self.local_len();
        require(x_local.len() == want, || format!("x_local has {} elements, expected {want}", x_local.len()))?;
        require(out_local.len() == want, || format!("out_local has {} elements, expected {want}", out_local.len()))
    }
}

/// `AllGather(x_local)` into the workspace's tokens (rank order is token order).
fn gather<T: CudaScalar>(
    comm: &NvidiaCollective,
    x_local: &CudaSlice<T>,
    ws: &mut FfnWorkspace<T>,
    stream: &Arc<CudaStream>,
    hook: &mut dyn StageHook,
) -> Result<(), Error> {
    hook.before(Stage::AllGather, stream)?;
    comm.all_gather_into(x_local, &mut ws.x, stream)?;
    hook.after(Stage::AllGather, stream)
}

/// `ReduceScatter` of the workspace's partial sums into this rank's tokens.
fn scatter<T: CudaScalar>(
    comm: &NvidiaCollective,
    ws: &FfnWorkspace<T>,
    out_local: &mut CudaSlice<T>,
    stream: &Arc<CudaStream>,
    hook: &mut dyn StageHook,
) -> Result<(), Error> {
    hook.before(Stage::ReduceScatter, stream)?;
    comm.reduce_scatter_into(&ws.partial, out_local, stream)?;
    hook.after(Stage::ReduceScatter, stream)
}

/// `partial` = the balanced tree over the workspace's leaf products (the `LeafFold` stage).
fn leaf_fold<T: CudaScalar>(
    kernels: &CudaKernels,
    ws: &mut FfnWorkspace<T>,
    stream: &Arc<CudaStream>,
) -> Result<(), Error> {
    let l = ws.layout;
    let n = l.shape.tokens * l.shape.hidden;
    let (leaves, count, stride) = (l.leaves as u32, n as u64, l.prod_stride as u64);
    let mut launch = stream.launch_builder(kernels.leaf_fold::<T>());
    launch.arg(&ws.products).arg(&mut ws.partial).arg(&leaves).arg(&count).arg(&stride);
    // SAFETY: `leaf_fold(p, out, leaves, n, stride)` reads `leaves` products of `n` elements
    // `stride` apart from `products` (`leaves × prod_stride` long, `n <= prod_stride`) and
    // writes `n` elements of `partial` (`S × H` long); the argument types match the kernel's
    // (`T*`, `T*`, `u32`, `u64`, `u64`).
    unsafe { launch.launch(elementwise(n)) }.map(drop).map_err(super::driver("launching leaf_fold"))
}

/// The `Activation` stage over the first `n` elements of `act`: SiLU in place, or with `up`
/// (the gated FFN, laid out as `act`) SiLU times up in place.
fn activate<T: CudaScalar>(
    kernels: &CudaKernels,
    act: &mut CudaSlice<T>,
    up: Option<&CudaSlice<T>>,
    n: usize,
    stream: &Arc<CudaStream>,
    hook: &mut dyn StageHook,
) -> Result<(), Error> {
    hook.before(Stage::Activation, stream)?;
    let count = n as u64;
    match up {
        None => {
            let mut launch = stream.launch_builder(kernels.silu::<T>());
            launch.arg(act).arg(&count);
            // SAFETY: `silu(x, n)` rewrites `n` elements of `x`; `n <= act.len()` (the callers
            // pass the workspace's own sizes) and the argument types match (`T*`, `u64`).
            unsafe { launch.launch(elementwise(n)) }.map(drop).map_err(super::driver("launching silu"))?;
        }
        Some(up) => {
            let mut launch = stream.launch_builder(kernels.silu_mul::<T>());
            launch.arg(act).arg(up).arg(&count);
            // SAFETY: `silu_mul(gate, up, n)` rewrites `n` elements of `gate` from themselves
            // and `n` elements of `up`; both are the workspace's buffers of one length (`up` is
            // allocated as `act`), `n <= act.len()`, and the argument types match (`T*`,
            // `const T*`, `u64`).
            unsafe { launch.launch(elementwise(n)) }.map(drop).map_err(super::driver("launching silu_mul"))?;
        }
    }
    hook.after(Stage::Activation, stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The packed leaves are the CPU shard's columns of `W1` and rows of `W2`, leaf by leaf, at
    /// 256-byte-aligned offsets, at every TP; the naive shards are the row-major shards.
    #[test]
    fn leaves_are_packed_aligned_and_hold_the_shards_columns() {
        let shape = FfnShape { tokens: 8, hidden: 6, ffn: 40 }; // leaf width 5: blocks get padded
        let w1: Vec<f32> = (0..6 * 40).map(|i| i as f32).collect();
        let w2: Vec<f32> = (0..40 * 6).map(|i| -(i as f32)).collect();
        for tp in [1, 2, 4, 8] {
            let l = Layout::new::<f32>(shape, tp, false).unwrap();
            assert_eq!((l.w1_stride * 4) % ALIGN_BYTES, 0);
            assert_eq!((l.act_stride * 4) % ALIGN_BYTES, 0);
            assert_eq!((l.prod_stride * 4) % ALIGN_BYTES, 0);
            for rank in 0..tp {
                let p = HostWeights::pack(l, Given::Full, &w1, None, &w2, rank).unwrap();
                for j in 0..l.leaves {
                    let leaf = rank * l.leaves + j;
                    for r in 0..6 {
                        for c in 0..5 {
                            assert_eq!(p.w1[j * l.w1_stride + r * 5 + c], w1[r * 40 + leaf * 5 + c], "tp {tp}");
                            assert_eq!(p.w2[j * l.w2_stride + c * 6 + r], w2[(leaf * 5 + c) * 6 + r], "tp {tp}");
                        }
                    }
                }
                // The naive shards: columns rank·F/tp.. of W1 (row-major), rows of W2.
                let fk = 40 / tp;
                let want: Vec<f32> =
                    (0..6).flat_map(|r| (0..fk).map(move |c| (r * 40 + rank * fk + c) as f32)).collect();
                assert_eq!(p.w1_naive, want, "tp {tp}");
                assert_eq!(p.w2_naive, w2[rank * fk * 6..(rank + 1) * fk * 6]);
            }
        }
        let l = Layout::new::<f32>(shape, 2, false).unwrap();
        assert!(matches!(HostWeights::pack(l, Given::Full, &w1[1..], None, &w2, 0), Err(Error::Shape(_))));
        assert!(matches!(HostWeights::pack(l, Given::Full, &w1, None, &w2, 2), Err(Error::Shape(_))));
        assert!(matches!(HostWeights::pack(l, Given::Full, &w1, Some(&w1), &w2, 0), Err(Error::Shape(_))));
        assert!(matches!(Layout::new::<f32>(shape, 3, false), Err(Error::Shape(_))));
        assert!(matches!(Layout::new::<f32>(FfnShape { tokens: 7, ..shape }, 2, false), Err(Error::Shape(_))));
    }

    /// A rank's own shards (`Given::Shard`: columns of `W1`/`W3`, rows of `W2`, as the CPU
    /// shard cuts them) pack to exactly what the full matrices pack to, plain and gated, at
    /// every TP; shards of the wrong length are refused naming the argument.
    #[test]
    fn shards_pack_as_the_full_matrices() {
        let shape = FfnShape { tokens: 8, hidden: 6, ffn: 40 };
        let w1: Vec<f32> = (0..6 * 40).map(|i| i as f32).collect();
        let w3: Vec<f32> = (0..6 * 40).map(|i| 1000.0 + i as f32).collect();
        let w2: Vec<f32> = (0..40 * 6).map(|i| -(i as f32)).collect();
        for gated in [false, true] {
            for tp in [1, 2, 4, 8] {
                let l = Layout::new::<f32>(shape, tp, gated).unwrap();
                let fk = 40 / tp;
                for rank in 0..tp {
                    let cols = |m: &[f32]| -> Vec<f32> {
                        m.chunks(40).flat_map(|row| row[rank * fk..(rank + 1) * fk].to_vec()).collect()
                    };
                    let (s1, s3, s2) = (cols(&w1), cols(&w3), w2[rank * fk * 6..(rank + 1) * fk * 6].to_vec());
                    let w3f = gated.then_some(&w3[..]);
                    let full = HostWeights::pack(l, Given::Full, &w1, w3f, &w2, rank).unwrap();
                    let shard = HostWeights::pack(l, Given::Shard, &s1, gated.then_some(&s3[..]), &s2, rank).unwrap();
                    assert_eq!(
                        (&full.w1, &full.w2, &full.w1_naive, &full.w2_naive),
                        (&shard.w1, &shard.w2, &shard.w1_naive, &shard.w2_naive),
                        "tp {tp} rank {rank}"
                    );
                    assert_eq!(full.w3, shard.w3, "tp {tp} rank {rank}");
                }
            }
        }
        let l = Layout::new::<f32>(shape, 2, true).unwrap();
        let (s1, s2) = (vec![0f32; 6 * 20], vec![0f32; 20 * 6]);
        for (a, b, c, name) in [
            (&s1[1..], &s1[..], &s2[..], "w1_shard"),
            (&s1[..], &s1[1..], &s2[..], "w3_shard"),
            (&s1[..], &s1[..], &s2[1..], "w2_shard"),
        ] {
            let e = HostWeights::pack(l, Given::Shard, a, Some(b), c, 1).unwrap_err();
            assert!(matches!(&e, Error::Shape(d) if d.starts_with(name)), "{e}");
        }
    }

    /// The gated FFN's `W3` is packed as `W1` is: the same leaves and naive shard of its own
    /// values (here each `W1` value plus 0.5, padding zero); a `W3` of the wrong length, or
    /// none for a gated layout, is refused.
    #[test]
    fn w3_is_packed_as_w1() {
        let shape = FfnShape { tokens: 8, hidden: 6, ffn: 40 };
        let w1: Vec<f32> = (0..6 * 40).map(|i| i as f32).collect();
        let w3: Vec<f32> = w1.iter().map(|x| x + 0.5).collect();
        let w2: Vec<f32> = (0..40 * 6).map(|i| -(i as f32)).collect();
        for tp in [1, 2, 4, 8] {
            let l = Layout::new::<f32>(shape, tp, true).unwrap();
            for rank in 0..tp {
                let p = HostWeights::pack(l, Given::Full, &w1, Some(&w3), &w2, rank).unwrap();
                let (leaves, naive) = p.w3.expect("a gated pack has W3");
                assert_eq!(leaves.len(), p.w1.len());
                for j in 0..l.leaves {
                    let block = |v: &[f32]| v[j * l.w1_stride..][..6 * 5].to_vec();
                    let want: Vec<f32> = block(&p.w1).iter().map(|x| x + 0.5).collect();
                    assert_eq!(block(&leaves), want, "tp {tp} rank {rank} leaf {j}");
                    assert!(leaves[j * l.w1_stride + 30..(j + 1) * l.w1_stride].iter().all(|v| *v == 0.0));
                }
                assert_eq!(naive, p.w1_naive.iter().map(|x| x + 0.5).collect::<Vec<_>>(), "tp {tp}");
            }
        }
        let l = Layout::new::<f32>(shape, 2, true).unwrap();
        assert!(matches!(HostWeights::pack(l, Given::Full, &w1, Some(&w3[1..]), &w2, 0), Err(Error::Shape(_))));
        assert!(matches!(HostWeights::pack(l, Given::Full, &w1, None, &w2, 0), Err(Error::Shape(_))));
    }
}
