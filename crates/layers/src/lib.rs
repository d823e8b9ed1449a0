//! Reference layers over detcoll whose output bits do not depend on the parallel size: a
//! sequence-parallel FFN that is bit-identical at TP = 1, 2, 4 and 8, and a causal
//! context-parallel attention that is bit-identical at CP = 1, 2, 4 and 8.
//!
//! Everything here is plain Rust on host slices with a fixed evaluation order, over any host
//! [`collective_core::Collective`] (the CPU twin, `shm_ipc::ShmCollective`, or the factory's
//! `collective_factory::cpu` collective), so CI checks the TP/CP invariance of the whole
//! pipeline on every commit. The GEMM sits behind the [`Gemm`] trait.
//!
//! The GPU path is the module `cuda` (feature `cuda`, off by default): the same two layers on
//! an NVIDIA GPU through `collective_factory::NvidiaCollective`, cuBLAS GEMMs and NVRTC-compiled
//! kernels, everything loaded at run time through cudarc (nothing linked at build time; a
//! missing driver, cuBLAS or NVRTC is an [`Error`], never a panic). Its promise: on one GPU
//! model, driver, toolkit and cuBLAS version, the FFN output bits are the same at TP = 1, 2, 4
//! and 8 and the attention output and log-sum-exp bits are the same at CP = 1, 2, 4 and 8, run
//! to run and in a captured CUDA graph. Not promised: the GPU bits equal the CPU bits, or
//! stay the same across GPU architectures or cuBLAS/toolkit versions. A stage hook (`cuda::StageHook`)
//! times each stage with CUDA events.
//!
//! A layer call is one or several collective calls (the FFN: an all_gather, then a
//! reduce_scatter), so it follows the collectives' rule: every rank makes the same calls in the
//! same order. Two threads sharing one rank's collective must therefore order their layer calls
//! the same way on every rank (a lock around each whole layer call, or a collective per
//! thread): interleaved, an FFN's collectives fail with `SignatureMismatch`, and two decoder
//! tails of different requests may pair up across ranks and sum one request's shard with
//! another's (no error: the calls agree in every signed respect). A layer call refused on a
//! rank (a shape of its own, a GEMM's error before its collectives) counts the collective calls
//! it would have made as refused (`Collective::count_refused_call`): on a collective that
//! numbers its calls (the factory's), peers that made the layer call then fail with
//! `SignatureMismatch` instead of pairing its collectives with the rank's next layer's.
//!
//! * [`gemm`]: the reference GEMM (f32 accumulation, fixed contraction order, one rounding).
//! * [`activation`]: SiLU in f32, no fast math, and SwiGLU's SiLU(gate) times up.
//! * [`ffn`]: `AllGather(x) -> GEMM(W1) -> SiLU -> GEMM(W2) -> ReduceScatter`, with the FFN
//!   width split into 8 fixed leaves (TP-invariant), and the naive split for comparison; the
//!   gated FFN of Llama, Mistral and Qwen (SwiGLU, `FfnShard::from_full_gated`) by the same
//!   leaves.
//! * [`attention`]: `AllGather(K, V, positions)`, then each rank's own queries over all keys in
//!   global key order (CP-invariant).
//! * [`data`]: a seeded generator for test and example inputs.
//! * `cuda` (feature `cuda`): the GPU path: `CudaGemm`, `CudaKernels`, `CudaFfnShard`,
//!   `CudaAttention`, the stage hooks.
//!
//! ```
//! // Dependencies: detcoll-layers and collective-factory (which re-exports `Collective` and
//! // `half`).
//! use collective_factory::{Collective, Config, cpu, half::bf16};
//! use detcoll_layers::{FfnShape, FfnShard, ReferenceGemm, data::SplitMix64};
//!
//! let shape = FfnShape { tokens: 16, hidden: 8, ffn: 32 };
//! let mut rng = SplitMix64::new(7);
//! let x: Vec<bf16> = rng.values(shape.tokens * shape.hidden, 1.0);
//! let w1: Vec<bf16> = rng.values(shape.hidden * shape.ffn, 0.3);
//! let w2: Vec<bf16> = rng.values(shape.ffn * shape.hidden, 0.2);
//! let want = detcoll_layers::ffn::reference(&ReferenceGemm, shape, &x, &w1, &w2)?;
//!
//! let ranks = cpu::thread_group(2, &Config::new().with_capacity(1 << 16))?;
//! let rows = shape.tokens / 2 * shape.hidden;
//! let outs = std::thread::scope(|s| {
//!     let hs: Vec<_> = ranks.iter().map(|comm| {
//!         let (x, w1, w2) = (&x, &w1, &w2);
//!         s.spawn(move || {
//!             let r = comm.rank();
//!             let shard = FfnShard::from_full(shape, w1, w2, 2, r)?;
//!             let mut out = vec![bf16::ZERO; rows];
//!             shard.forward(comm, &ReferenceGemm, &x[r * rows..(r + 1) * rows], &mut out)?;
//!             Ok::<_, detcoll_layers::Error>(out)
//!         })
//!     }).collect();
//!     hs.into_iter().map(|h| h.join().unwrap()).collect::<Result<Vec<_>, _>>()
//! })?;
//! let got: Vec<u16> = outs.concat().iter().map(|v| v.to_bits()).collect();
//! assert_eq!(got, want.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

pub mod activation;
pub mod attention;
#[cfg(feature = "cuda")]
#[allow(unsafe_code)]
pub mod cuda;
pub mod data;
pub mod decoder;
mod error;
pub mod ffn;
pub mod gemm;
mod scalar;

pub use attention::{AttentionInput, AttentionOutput, AttentionShape};
pub use decoder::NextNorm;
pub use error::Error;
pub use ffn::{FfnShape, FfnShard, LEAVES};
pub use gemm::{Gemm, ReferenceGemm};
pub use scalar::Scalar;
