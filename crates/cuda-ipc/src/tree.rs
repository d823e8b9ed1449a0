//! The standalone fused tree kernel: W inputs (in rank order) -> one output, in one pass.
//!
//! Used by transports that gather ranks' inputs first and then evaluate the tree locally, and
//! by the bandwidth bench. Same arithmetic as the collectives.
use crate::CudaDevice;
use crate::driver;
use crate::kernels::{Module, SoftModule};
use crate::launch::{self, THREADS, TreeParams};
use collective_core::{DType, Error};
use cudarc::driver::{CudaContext, sys};
use std::sync::{Arc, OnceLock};

/// The fused tree kernel loaded in one context.
#[derive(Debug, Clone)]
pub struct FusedTree {
    ctx: Arc<CudaContext>,
    device: CudaDevice,
    /// The module loaded first (every module has the empty kernel and world 1): the empty
    /// kernel and the grid come from it; a launch of W inputs uses the device's module for W.
    module: Arc<Module>,
    soft: Arc<OnceLock<Arc<SoftModule>>>,
}

impl FusedTree {
    /// Loads the kernels into `ctx` (NVRTC or prebuilt; see [`crate::kernels`]): the world-1
    /// module now, a world's module at its first launch.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, Error> {
        Self::from_device(CudaDevice::new(ctx)?)
    }

    /// Over the kernels of `device` (shared with its collectives).
    pub(crate) fn from_device(device: CudaDevice) -> Result<Self, Error> {
        let module = device.module(1)?;
        Ok(FusedTree { ctx: device.context().clone(), device, module, soft: Arc::new(OnceLock::new()) })
    }

    /// Blocks one launch uses (all SMs full).
    pub fn grid(&self) -> u32 {
        self.module.tree_grid
    }

    /// Enqueues `out[i] = tree(inputs[0][i], ..., inputs[W-1][i])` for `i < count`.
    ///
    /// # Safety
    /// Every input must hold `count` readable elements of `dtype` and `out` `count` writable
    /// ones, all device-addressable from this context, `out` overlapping no input (except being
    /// exactly one of them); `stream` must belong to this context.
    pub unsafe fn launch(
        &self,
        inputs: &[u64],
        out: u64,
        count: usize,
        dtype: DType,
        stream: sys::CUstream,
    ) -> Result<(), Error> {
        let p = TreeParams::pack(inputs, out, count, dtype)?;
        let m = self.device.module(inputs.len())?;
        driver::bind(&self.ctx)?;
        // SAFETY: forwarded from the caller; `detcoll_tree` takes `DcTreeParams`.
        unsafe { launch::launch(m.tree, m.tree_grid, THREADS, &p, stream) }
    }

    /// As [`FusedTree::launch`], with the software arithmetic (f16/bf16 widened to f32, one f32
    /// add, one rounding) that the HIP build uses: same bits by construction, tested here.
    ///
    /// # Safety
    /// As [`FusedTree::launch`].
    pub unsafe fn launch_soft(
        &self,
        inputs: &[u64],
        out: u64,
        count: usize,
        dtype: DType,
        stream: sys::CUstream,
    ) -> Result<(), Error> {
        let p = TreeParams::pack(inputs, out, count, dtype)?;
        let soft = match self.soft.get() {
            Some(m) => m.clone(),
            None => {
                let m = SoftModule::load(&self.ctx)?;
                self.soft.get_or_init(|| m).clone()
            }
        };
        driver::bind(&self.ctx)?;
        // SAFETY: as above, `detcoll_tree_soft` takes the same parameters.
        unsafe { launch::launch(soft.tree_soft, self.module.tree_grid, THREADS, &p, stream) }
    }

    /// Enqueues an empty kernel (the launch-cost baseline of the latency bench).
    ///
    /// # Safety
    /// `stream` must belong to this context.
    pub unsafe fn launch_noop(&self, stream: sys::CUstream) -> Result<(), Error> {
        driver::bind(&self.ctx)?;
        // SAFETY: `detcoll_noop` takes no parameters.
        let r = unsafe {
            sys::cuLaunchKernel(
                self.module.noop,
                1,
                1,
                1,
                32,
                1,
                1,
                0,
                stream,
                core::ptr::null_mut(),
                core::ptr::null_mut(),
            )
        };
        driver::check(r, "cuLaunchKernel(noop)")
    }

    /// Where the kernels came from.
    pub fn origin(&self) -> &str {
        self.module.origin()
    }
}
