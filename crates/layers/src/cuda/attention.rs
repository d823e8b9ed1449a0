//! Causal context-parallel attention on the GPU: [`CudaAttention`] gathers `k`, `v` and the
//! positions, then one kernel computes the rank's own queries over every gathered key.
//!
//! The argument is [`crate::attention`]'s: after the all_gathers every rank holds the same
//! keys, values and positions in global token order at every CP size, and the kernel's order
//! of operations for query `i` (`layers.cu`, one warp per query and head: a fixed shuffle tree
//! for each dot product, an online softmax over the visible keys strictly in key order with
//! f32 `m`, `l` and accumulators) is fixed by the key index alone, so query `i`'s output and
//! log-sum-exp have the same bits on whichever rank of whichever CP size owns it. The order is
//! not the CPU path's (online instead of two-pass softmax): the GPU bits are not the CPU bits.
//!
//! Speed: plain CUDA cores (no tensor cores), one warp per query and head, keys staged 16 at a
//! time in shared memory, key tiles that no query of a block sees skipped; not tuned: on one
//! H200, 32 heads of 128 in bf16, 3.6 ms at 1024 tokens, 53 ms at 4096, 835 ms at 16384 (about
//! 2.6 TFLOP/s; `benches/results/h200-2026-12-01-e2e.md`).
//!
//! Supported: `head_dim` a multiple of 32 from 32 to [`MAX_HEAD_DIM`] (each lane of a warp
//! holds `head_dim / 32` dims), at most 65535 heads, at most `i32::MAX` tokens; anything else
//! is a shape error. Positions are `i32` (query `i` sees key `j` when
//! `positions[j] <= positions[i]`).
use super::kernels::{MAX_HEAD_DIM, attention_grid};
use super::{CudaKernels, CudaScalar, Stage, StageHook};
use crate::error::{product, require};
use crate::{AttentionShape, Error};
use collective_factory::NvidiaCollective;
use cudarc::driver::{CudaSlice, CudaStream, PushKernelArg};
use std::sync::Arc;

/// One rank's buffers of a CP=`cp` causal attention: the gathered keys, values and positions
/// (`tokens × heads × head_dim`, `tokens`), allocated up front, so a forward allocates nothing.
#[derive(Debug)]
pub struct CudaAttention<T> {
    shape: AttentionShape,
    cp: usize,
    rank: usize,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    positions: CudaSlice<i32>,
}

impl<T: CudaScalar> CudaAttention<T> {
    /// Rank `rank`'s workspace for CP = `cp`, allocated (zeroed) on `stream`. Allocates: create
    /// it before any peer sharing the GPU has a collective in flight.
    pub fn new(stream: &Arc<CudaStream>, shape: AttentionShape, cp: usize, rank: usize) -> Result<Self, Error> {
        shape.check(cp)?;
        require(rank < cp, || format!("rank {rank} is outside a CP group of {cp}"))?;
        let d = shape.head_dim;
        require(d.is_multiple_of(32) && (32..=MAX_HEAD_DIM).contains(&d), || {
            format!("head_dim {d} is not a multiple of 32 in 32..={MAX_HEAD_DIM}")
        })?;
        require(shape.heads > 0 && shape.heads <= 65535, || format!("{} heads: 1 to 65535 supported", shape.heads))?;
        require(shape.tokens > 0 && i32::try_from(shape.tokens).is_ok(), || {
            format!("{} tokens: 1 to i32::MAX supported", shape.tokens)
        })?;
        let n = product("tokens x heads x head_dim", &[shape.tokens, shape.heads, d])?;
        attention_grid(shape.tokens / cp, shape.heads)?;
        let alloc = |n: usize| stream.alloc_zeros::<T>(n).map_err(super::driver("allocating the attention workspace"));
        Ok(CudaAttention {
            shape,
            cp,
            rank,
            k: alloc(n)?,
            v: alloc(n)?,
            positions: stream
                .alloc_zeros::<i32>(shape.tokens)
                .map_err(super::driver("allocating the attention workspace"))?,
        })
    }

    /// The global sizes.
    pub fn shape(&self) -> AttentionShape {
        self.shape
    }

    /// The CP size.
    pub fn cp(&self) -> usize {
        self.cp
    }

    /// The rank in the CP group.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The CP-invariant attention of this rank's tokens (module docs).
    ///
    /// `q`, `k`, `v`: this rank's tokens, `(tokens/cp) × heads × head_dim` row-major;
    /// `positions`: their `tokens/cp` positions as `i32`; `out`: same shape as `q`; `lse`:
    /// `(tokens/cp) × heads`, f32 (`m + ln l`; `-inf` and a zero output for a query that sees no
    /// key). Collective: every rank of `comm` calls it with its own block. Enqueues on `stream`
    /// only (no allocation, no synchronisation); `kernels` must be loaded in its context. Sizes
    /// are checked before anything is enqueued.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        comm: &NvidiaCollective,
        kernels: &CudaKernels,
        q: &CudaSlice<T>,
        k: &CudaSlice<T>,
        v: &CudaSlice<T>,
        positions: &CudaSlice<i32>,
        out: &mut CudaSlice<T>,
        lse: &mut CudaSlice<f32>,
        stream: &Arc<CudaStream>,
        hook: &mut dyn StageHook,
    ) -> Result<(), Error> {
        let cp = self.cp;
        let n_q = self.shape.tokens / cp;
        // Refused before its three all_gathers: they count as refused on `comm`.
        let config = crate::error::before_calls(comm, 3, || {
            super::check_member(comm, "attention", "CP", cp, self.rank, stream)?;
            require(kernels.context().cu_ctx() == stream.context().cu_ctx(), || {
                "the kernels are loaded in another context than the stream's".into()
            })?;
            let e = n_q * self.shape.token_len();
            for (what, len, want) in [
                ("q", q.len(), e),
                ("k", k.len(), e),
                ("v", v.len(), e),
                ("positions", positions.len(), n_q),
                ("out", out.len(), e),
                ("lse", lse.len(), n_q * self.shape.heads),
            ] {
                require(len == want, || format!("`{what}` has {len} elements, expected {want} for {n_q} tokens"))?;
            }
            attention_grid(n_q, self.shape.heads)
        })?;

        for (local, all) in [(k, &mut self.k), (v, &mut self.v)] {
            hook.before(Stage::AllGather, stream)?;
            comm.all_gather_into(local, all, stream)?;
            hook.after(Stage::AllGather, stream)?;
        }
        hook.before(Stage::AllGather, stream)?;
        comm.all_gather_into(positions, &mut self.positions, stream)?;
        hook.after(Stage::AllGather, stream)?;

        hook.before(Stage::Attention, stream)?;
        // The sizes fit u32 (tokens at most i32::MAX, checked in `new`).
        let (n_q, n_k) = (n_q as u32, self.shape.tokens as u32);
        let (heads, head_dim) = (self.shape.heads as u32, self.shape.head_dim as u32);
        let scale = 1.0 / (self.shape.head_dim as f32).sqrt();
        let mut launch = stream.launch_builder(kernels.attention::<T>());
        launch.arg(q).arg(&self.k).arg(&self.v).arg(positions).arg(&self.positions).arg(out).arg(lse);
        launch.arg(&n_q).arg(&n_k).arg(&heads).arg(&head_dim).arg(&scale);
        // SAFETY: `attention(q, k, v, qpos, kpos, out, lse, n_q, n_k, heads, head_dim, scale)`
        // reads `n_q` queries and positions, `n_k` gathered keys, values and positions, and
        // writes `n_q × heads × head_dim` outputs and `n_q × heads` lse values: exactly the
        // lengths checked above and in `new`; `head_dim` is a multiple of 32 up to 256 (what
        // the kernel's shared tiles hold); the argument types match the kernel's.
        unsafe { launch.launch(config) }.map(drop).map_err(super::driver("launching attention"))?;
        hook.after(Stage::Attention, stream)
    }
}
