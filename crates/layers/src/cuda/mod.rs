//! The GPU path (feature `cuda`): the same two layers on an NVIDIA GPU, through the NVIDIA
//! collective of `collective-factory`, cuBLAS for the GEMMs and NVRTC-compiled kernels for the
//! rest, all loaded at run time through cudarc (nothing is linked at build time; a missing
//! libcuda, libcublas or libnvrtc is an [`Error::Cuda`], never a panic).
//!
//! * [`CudaGemm`] ([`blas`]): one cuBLAS handle bound to one stream, with reproducible
//!   settings (atomics off, host pointer mode, default math mode, an explicit workspace of
//!   [`blas::WORKSPACE_BYTES`] on every handle).
//! * [`CudaKernels`] ([`kernels`]): SiLU, the leaf fold and causal attention, one NVRTC module
//!   per context.
//! * [`CudaFfnShard`] ([`ffn`]): one rank's weights, the TP-invariant layer and the naive one.
//! * [`CudaAttention`] ([`attention`]): the CP-invariant causal attention of one rank.
//! * [`Stage`], [`StageHook`], [`StageEvents`], [`Lockstep`] ([`stages`]): a hook around every
//!   stage of a forward, for timing (CUDA events) and for ranks that are threads sharing one
//!   context (which must enqueue their collectives in call order).
//!
//! # What is promised
//!
//! On one GPU model, driver, toolkit and cuBLAS version, the FFN output of a token has the same
//! bits at TP = 1, 2, 4 and 8 and run to run, and the attention output and log-sum-exp have the
//! same bits at CP = 1, 2, 4 and 8 and run to run. The arguments are those of [`crate::ffn`] and
//! [`crate::attention`]: every GEMM that feeds the output has the same `m`, `n`, `k`, leading
//! dimensions and alignment at every TP (one leaf per call, leaves stored contiguously), cuBLAS
//! guarantees the same bits for the same call on the same architecture and SM count with the
//! settings of [`blas`], the leaf fold and the collective evaluate the same fixed tree, and the
//! attention kernel's order of operations is fixed by the key index alone.
//!
//! Not promised: the same bits as the CPU path (cuBLAS's contraction order is not the reference
//! GEMM's), nor across GPU architectures, SM counts, cuBLAS or toolkit versions (cuBLAS may
//! choose other kernels there; `expf` may differ between toolkits).
//!
//! # Graph capture and threads
//!
//! `forward` only enqueues: no allocation, no host synchronisation, no module load, so a
//! whole forward can be captured into a CUDA graph (disable cudarc's event tracking on the
//! context first, `CudaContext::disable_event_tracking`, as for the collectives). Ranks that are
//! threads on one GPU: create every handle, buffer and workspace, and run
//! [`CudaFfnShard::warm_up`] (cuBLAS loads its kernels lazily on first use, which may wait for
//! the device) before the ranks start their first collective; pass a [`Lockstep`] hook so that
//! collective `k` of every rank is enqueued before collective `k + 1` of any, a [`Rendezvous`]
//! that a failing rank poisons (so its peers fail instead of waiting), and
//! [`thread_group_config`] (collective kernels capped at half the GPU over its ranks). Set
//! `CUDA_MODULE_LOADING=EAGER` in the environment before CUDA starts: with CUDA's default lazy
//! loading a kernel (cuBLAS's among them) is loaded at its first launch, which can wait for the
//! device while a peer's collective kernel spins waiting for this rank (`cargo xtask gpu-test`
//! and `cargo xtask bench` set it).
use crate::Error;
use crate::Scalar;
use cudarc::cublas::sys::cudaDataType;
use cudarc::driver::{DeviceRepr, ValidAsZeroBits};

pub mod attention;
pub mod blas;
pub mod ffn;
pub mod kernels;
pub mod stages;

pub use attention::CudaAttention;
pub use blas::CudaGemm;
pub use ffn::{CudaFfnShard, FfnWorkspace};
pub use kernels::CudaKernels;
pub use stages::{Lockstep, Rendezvous, Stage, StageEvents, StageHook};

mod sealed {
    /// Only the types the kernels are compiled for.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
}

/// An element type of the GPU path: `f32` or `half::bf16` (sealed: the kernels exist for
/// these two).
pub trait CudaScalar:
    sealed::Sealed + Scalar + DeviceRepr + ValidAsZeroBits + collective_core::Reducible + Unpin + Send + Sync + 'static
{
    /// The cuBLAS data type of `A`, `B` and `C` (`CUDA_R_32F`, `CUDA_R_16BF`).
    const CUBLAS_TYPE: cudaDataType;
    /// The suffix of this type's kernels in the NVRTC module (`"f32"`, `"bf16"`).
    const KERNEL_SUFFIX: &'static str;
}

impl CudaScalar for f32 {
    const CUBLAS_TYPE: cudaDataType = cudaDataType::CUDA_R_32F;
    const KERNEL_SUFFIX: &'static str = "f32";
}

impl CudaScalar for half::bf16 {
    const CUBLAS_TYPE: cudaDataType = cudaDataType::CUDA_R_16BF;
    const KERNEL_SUFFIX: &'static str = "bf16";
}

/// How many CUDA devices this process sees, or why it sees none: no driver
/// ([`Error::Collective`] with `LibraryMissing`) or no device ([`Error::Cuda`]). Never panics;
/// examples and tests use it to print a skip line.
pub fn require_device() -> Result<usize, Error> {
    match cuda_ipc::driver::device_count()? {
        0 => Err(Error::cuda(
            "cuDeviceGetCount",
            collective_core::Error::InvalidConfig { detail: "no CUDA device is visible".into() },
        )),
        n => Ok(n),
    }
}

/// `config` for a thread group of `ranks` ranks on this process's GPUs (rank `r` on GPU
/// `r % count`, as `collective_factory::nvidia::thread_group` places them) that run the layers:
/// when ranks share a GPU, every collective kernel is capped at `multiprocessors / (2 · ranks
/// per GPU)` blocks (at least 1), so the ranks' kernels waiting in a collective hold at most
/// half the GPU and a peer still in its GEMMs keeps the rest. (A rank's collective waits for
/// its peers inside the kernel; with the default grid, eight waiting ranks hold nearly every
/// multiprocessor of an H200 while the last rank's GEMMs need them.) Ranks on GPUs of their
/// own: `config` unchanged. Also set `CUDA_MODULE_LOADING=EAGER` before CUDA starts (see the
/// module docs).
pub fn thread_group_config(
    config: collective_factory::Config,
    ranks: usize,
) -> Result<collective_factory::Config, Error> {
    let count = require_device()?;
    let per_gpu = ranks.div_ceil(count);
    if per_gpu <= 1 {
        return Ok(config);
    }
    let ctx = cudarc::driver::CudaContext::new(0).map_err(driver("cuDevicePrimaryCtxRetain"))?;
    let sms = ctx
        .attribute(cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .map_err(driver("cuDeviceGetAttribute (multiprocessors)"))?;
    let sms = usize::try_from(sms).unwrap_or(1);
    Ok(config.with_max_blocks((sms / (2 * per_gpu)).max(1)))
}

/// A shape error unless `comm` is rank `rank` of a world of `size` (the `what` was made for
/// that rank) and `stream` belongs to `comm`'s context.
pub(crate) fn check_member(
    comm: &collective_factory::NvidiaCollective,
    what: &str,
    group: &str,
    size: usize,
    rank: usize,
    stream: &cudarc::driver::CudaStream,
) -> Result<(), Error> {
    use collective_core::Collective;
    let (r, w) = (comm.rank(), comm.world_size());
    crate::error::require(w == size && r == rank, || {
        format!("{what} of rank {rank} of {group} {size} called on rank {r} of a world of {w}")
    })?;
    crate::error::require(comm.context().cu_ctx() == stream.context().cu_ctx(), || {
        "the stream belongs to another context than the collective's".into()
    })
}

/// Maps a cudarc driver error of step `call`.
pub(crate) fn driver(call: &str) -> impl FnOnce(cudarc::driver::DriverError) -> Error + '_ {
    move |e| Error::cuda(call, e)
}
