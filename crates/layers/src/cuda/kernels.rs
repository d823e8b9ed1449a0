//! [`CudaKernels`]: the layers' device code (`layers.cu`: SiLU, SwiGLU's activation, the leaf
//! fold, causal attention), compiled with NVRTC for the context's GPU and loaded once per context.
//!
//! Compiled without fast math ([`NVRTC_FLAGS`]); [`compile_ptx`] builds the same PTX for any
//! architecture with no GPU present (the CI check). The module is PTX for `compute_XY` of the
//! context's GPU, JIT-compiled by the driver at load: the NVRTC found must not be newer than
//! the driver (else loading fails with `CUDA_ERROR_UNSUPPORTED_PTX_VERSION`, an
//! [`Error::Cuda`]). The PTX's instructions carry their rounding explicitly (`.rn`, no `.ftz`),
//! so the JIT cannot change the arithmetic.
use super::CudaScalar;
use crate::Error;
use crate::error::require;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, LaunchConfig};
use cudarc::nvrtc::{CompileOptions, Ptx};
use std::sync::Arc;

/// The CUDA source of the layers' kernels, embedded.
pub const SOURCE: &str = include_str!("layers.cu");

/// NVRTC flags: no flush to zero, IEEE division and square root, no contraction into FMA
/// (never `--use_fast_math`), C++17.
pub const NVRTC_FLAGS: [&str; 5] =
    ["--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--fmad=false", "--std=c++17"];

/// The largest `head_dim` the attention kernel takes (it must also be a multiple of 32).
pub const MAX_HEAD_DIM: usize = 256;

/// Queries (one warp each) per block of the attention kernel (`ATT_WARPS` in `layers.cu`).
const ATTENTION_WARPS: u32 = 8;

/// The kernels of the module: SiLU, the leaf fold, attention and SwiGLU's activation, each for
/// f32 and bf16.
pub const ENTRIES: [&str; 8] = [
    "detcoll_layers_silu_f32",
    "detcoll_layers_silu_bf16",
    "detcoll_layers_leaf_fold_f32",
    "detcoll_layers_leaf_fold_bf16",
    "detcoll_layers_attention_f32",
    "detcoll_layers_attention_bf16",
    "detcoll_layers_silu_mul_f32",
    "detcoll_layers_silu_mul_bf16",
];

/// [`SOURCE`] compiled to PTX for `arch` (`"sm_90"`, ...: PTX for `compute_90`). Needs only
/// NVRTC (found by `cuda_ipc::kernels::ensure_nvrtc`), no GPU.
pub fn compile_ptx(arch: &str) -> Result<String, Error> {
    cuda_ipc::kernels::ensure_nvrtc().map_err(|e| Error::cuda("loading libnvrtc", e))?;
    let target = arch.replacen("sm_", "compute_", 1);
    let mut options = vec![format!("--gpu-architecture={target}")];
    options.extend(NVRTC_FLAGS.iter().map(|f| f.to_string()));
    let opts = CompileOptions { options, name: Some("detcoll_layers.cu".into()), ..Default::default() };
    let ptx = cudarc::nvrtc::compile_ptx_with_opts(SOURCE, opts).map_err(|e| Error::cuda("NVRTC compile", e))?;
    Ok(ptx.to_src())
}

/// The layers' kernels loaded into one context (every function resolved up front, so nothing
/// is loaded lazily during a forward).
#[derive(Debug)]
pub struct CudaKernels {
    ctx: Arc<CudaContext>,
    _module: Arc<CudaModule>,
    functions: Vec<CudaFunction>,
}

impl CudaKernels {
    /// Compiles [`SOURCE`] for `ctx`'s GPU with NVRTC and loads it. Loads a module: create it
    /// before any peer sharing the GPU has a collective in flight.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, Error> {
        let (major, minor) = ctx.compute_capability().map_err(super::driver("cuDeviceGetAttribute"))?;
        let ptx = compile_ptx(&format!("sm_{major}{minor}"))?;
        let module = ctx.load_module(Ptx::from_src(ptx)).map_err(super::driver("cuModuleLoadData"))?;
        let functions = ENTRIES
            .iter()
            .map(|name| module.load_function(name).map_err(super::driver("cuModuleGetFunction")))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(CudaKernels { ctx: ctx.clone(), _module: module, functions })
    }

    /// The context the module is loaded in.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Kernel `kind` (0 SiLU, 1 leaf fold, 2 attention, 3 SiLU times up) for `T`: `ENTRIES[2 * kind + type]`.
    fn function<T: CudaScalar>(&self, kind: usize) -> &CudaFunction {
        &self.functions[2 * kind + usize::from(T::KERNEL_SUFFIX != "f32")]
    }

    pub(crate) fn silu<T: CudaScalar>(&self) -> &CudaFunction {
        self.function::<T>(0)
    }

    pub(crate) fn leaf_fold<T: CudaScalar>(&self) -> &CudaFunction {
        self.function::<T>(1)
    }

    pub(crate) fn attention<T: CudaScalar>(&self) -> &CudaFunction {
        self.function::<T>(2)
    }

    pub(crate) fn silu_mul<T: CudaScalar>(&self) -> &CudaFunction {
        self.function::<T>(3)
    }
}

/// A grid-stride launch over `n` elements (256 threads a block, at most 4096 blocks).
pub(crate) fn elementwise(n: usize) -> LaunchConfig {
    let blocks = n.div_ceil(256).clamp(1, 4096) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 }
}

/// The attention launch: one block per [`ATTENTION_WARPS`] queries and head.
pub(crate) fn attention_grid(queries: usize, heads: usize) -> Result<LaunchConfig, Error> {
    let blocks = queries.div_ceil(ATTENTION_WARPS as usize);
    require(blocks <= i32::MAX as usize && heads <= 65535, || {
        format!("attention grid of {blocks} x {heads} blocks is too large")
    })?;
    Ok(LaunchConfig {
        grid_dim: (blocks.max(1) as u32, heads as u32, 1),
        block_dim: (ATTENTION_WARPS * 32, 1, 1),
        shared_mem_bytes: 0,
    })
}
