//! [`CudaGemm`]: one cuBLAS handle bound to one stream, with the settings that make a GEMM's
//! bits a function of the call alone.
//!
//! # Reproducibility settings
//!
//! cuBLAS documents that, on the same architecture and SM count and with the same toolkit
//! version, a call gives the same bits run to run, except for routines using atomics and for
//! handles with different workspaces or streams set up differently. Every handle made here:
//!
//! * `cublasSetAtomicsMode(CUBLAS_ATOMICS_NOT_ALLOWED)` (the default, set explicitly);
//! * `cublasSetPointerMode(CUBLAS_POINTER_MODE_HOST)` (`alpha = 1`, `beta = 0` from the host);
//! * `cublasSetMathMode(CUBLAS_DEFAULT_MATH)`: no TF32 for f32 (`CUBLAS_COMPUTE_32F`), tensor
//!   cores for bf16 with f32 accumulation;
//! * `cublasSetWorkspace_v2` with a workspace of its own of [`WORKSPACE_BYTES`] (the same size
//!   on every handle, so the heuristics see the same workspace; also what makes graph capture
//!   allocation-free);
//! * every GEMM is `cublasGemmEx` with `A`, `B`, `C` in the element type,
//!   `CUBLAS_COMPUTE_32F` and `CUBLAS_GEMM_DEFAULT`.
//!
//! One handle per stream with its own workspace is also what cuBLAS's reproducibility notes
//! ask for when several streams run GEMMs (the `CUBLAS_WORKSPACE_CONFIG` case arises only for
//! the default workspace pool shared across streams, which these handles do not use).
//!
//! Row-major `C = A · B` (`A` is `m × k`, `B` is `k × n`) is the column-major
//! `Cᵀ = Bᵀ · Aᵀ`: `gemm(N, N, n, m, k, B, ldb = n, A, lda = k, C, ldc = n)`. Callers that need a
//! GEMM's bits not to depend on the parallel size must also give it the same `m`, `n`, `k` and
//! pointer alignment (cuBLAS may choose a kernel by them): [`crate::cuda::ffn`] does.
use super::CudaScalar;
use crate::Error;
use crate::error::{product, require};
use collective_core::Error as CoreError;
use cudarc::cublas::{result as cublas, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use std::sync::Arc;

/// The cuBLAS workspace every [`CudaGemm`] owns: 32 MiB (NVIDIA's recommendation for Hopper).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// One cuBLAS handle on one stream with the settings of the module docs, and its workspace.
/// Used from one thread at a time (it is `Send`, not `Sync`).
///
/// Creating and dropping one synchronise the device (`cublasCreate` allocates, `cublasDestroy`
/// implicitly calls `cudaDeviceSynchronize`): ranks that are threads sharing one GPU create
/// their handles before, and drop them after, their collectives.
#[derive(Debug)]
pub struct CudaGemm {
    handle: sys::cublasHandle_t,
    stream: Arc<CudaStream>,
    /// Kept alive as long as the handle uses it (dropped after the handle is destroyed).
    _workspace: CudaSlice<u8>,
}

// SAFETY: a cuBLAS handle may be used from any thread as long as calls on it do not overlap;
// `CudaGemm` is not `Sync` and every call takes `&self` of the one owner thread.
unsafe impl Send for CudaGemm {}

fn blas_err(call: &str) -> impl FnOnce(cublas::CublasError) -> Error + '_ {
    move |e| Error::cuda(call, e)
}

/// `Ok` when libcublas can be loaded (cudarc would panic on first use otherwise).
pub fn ensure_cublas() -> Result<(), Error> {
    // SAFETY: only tries to open the library (running its initialisers), calls nothing in it.
    if unsafe { sys::is_culib_present() } {
        Ok(())
    } else {
        Err(Error::cuda(
            "loading libcublas",
            CoreError::LibraryMissing {
                library: "libcublas.so (cuBLAS)".into(),
                detail: "not found by the dynamic loader; install the CUDA toolkit's cuBLAS (or the \
                         nvidia-cublas pip wheel) and add its directory to LD_LIBRARY_PATH"
                    .into(),
            },
        ))
    }
}

impl CudaGemm {
    /// A handle bound to `stream`, with the settings of the module docs and its own workspace.
    /// Allocates (the workspace): create it before any peer has a collective in flight.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self, Error> {
        ensure_cublas()?;
        let workspace =
            stream.alloc_zeros::<u8>(WORKSPACE_BYTES).map_err(super::driver("allocating the cuBLAS workspace"))?;
        stream.context().bind_to_thread().map_err(super::driver("binding the context"))?;
        let handle = cublas::create_handle().map_err(blas_err("cublasCreate"))?;
        // Owned from here: destroyed on every path by `Drop`.
        let gemm = CudaGemm { handle, stream: stream.clone(), _workspace: workspace };
        gemm.configure()?;
        Ok(gemm)
    }

    fn configure(&self) -> Result<(), Error> {
        let (ws, _guard) = self._workspace.device_ptr(&self.stream);
        // SAFETY: `handle` is a live handle owned by `self`; the stream and the workspace
        // outlive it (fields of `self`, the workspace dropped after the handle is destroyed).
        unsafe {
            cublas::set_stream(self.handle, self.stream.cu_stream() as _).map_err(blas_err("cublasSetStream"))?;
            sys::cublasSetPointerMode_v2(self.handle, sys::cublasPointerMode_t::CUBLAS_POINTER_MODE_HOST)
                .result()
                .map_err(blas_err("cublasSetPointerMode"))?;
            sys::cublasSetAtomicsMode(self.handle, sys::cublasAtomicsMode_t::CUBLAS_ATOMICS_NOT_ALLOWED)
                .result()
                .map_err(blas_err("cublasSetAtomicsMode"))?;
            sys::cublasSetMathMode(self.handle, sys::cublasMath_t::CUBLAS_DEFAULT_MATH)
                .result()
                .map_err(blas_err("cublasSetMathMode"))?;
            sys::cublasSetWorkspace_v2(self.handle, ws as *mut _, WORKSPACE_BYTES)
                .result()
                .map_err(blas_err("cublasSetWorkspace"))?;
        }
        Ok(())
    }

    /// The stream every GEMM of this handle is enqueued on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// `out = a · b`, row-major: `a` is `m × k`, `b` is `k × n`, `out` is `m × n` (exact
    /// lengths, all dimensions at least 1, else a shape error before any device work). Enqueued
    /// on [`CudaGemm::stream`]; `cublasGemmEx` with the settings of the module docs.
    pub fn gemm<T: CudaScalar>(
        &self,
        a: &impl DevicePtr<T>,
        b: &impl DevicePtr<T>,
        m: usize,
        k: usize,
        n: usize,
        out: &mut impl DevicePtrMut<T>,
    ) -> Result<(), Error> {
        require(m > 0 && k > 0 && n > 0, || format!("gemm {m}x{k}x{n}: every dimension must be at least 1"))?;
        for (what, len, dims) in [("a", a.len(), [m, k]), ("b", b.len(), [k, n]), ("out", out.len(), [m, n])] {
            let want = product(what, &dims)?;
            require(len == want, || format!("gemm {m}x{k}x{n}: `{what}` has {len} elements, expected {want}"))?;
        }
        let dim = |v: usize| {
            i32::try_from(v).map_err(|_| Error::Shape(format!("gemm dimension {v} does not fit cuBLAS's int")))
        };
        let (mi, ki, ni) = (dim(m)?, dim(k)?, dim(n)?);
        let (alpha, beta) = (1f32, 0f32);
        let (a_ptr, _ga) = a.device_ptr(&self.stream);
        let (b_ptr, _gb) = b.device_ptr(&self.stream);
        let (c_ptr, _gc) = out.device_ptr_mut(&self.stream);
        // SAFETY: the pointers cover exactly `m*k`, `k*n` and `m*n` elements of `T` (checked
        // above), borrowed for this call and ordered on the handle's stream by cudarc's guards;
        // alpha and beta are host f32 values (pointer mode host, f32 compute) read before the
        // call returns.
        unsafe {
            sys::cublasGemmEx(
                self.handle,
                sys::cublasOperation_t::CUBLAS_OP_N,
                sys::cublasOperation_t::CUBLAS_OP_N,
                ni,
                mi,
                ki,
                (&alpha as *const f32).cast(),
                b_ptr as *const _,
                T::CUBLAS_TYPE,
                ni,
                a_ptr as *const _,
                T::CUBLAS_TYPE,
                ki,
                (&beta as *const f32).cast(),
                c_ptr as *mut _,
                T::CUBLAS_TYPE,
                ni,
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
            .result()
            .map_err(blas_err("cublasGemmEx"))
        }
    }
}

impl Drop for CudaGemm {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: the handle was created by `cublasCreate` and is destroyed once, here.
        let _ = unsafe { cublas::destroy_handle(self.handle) };
    }
}
