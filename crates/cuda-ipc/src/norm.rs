//! The residual add + RMSNorm after an all_reduce on CUDA: [`NormDevice`] for [`CudaDevice`],
//! one launch of `detcoll_residual_rmsnorm` (kernels/detcoll_norm.h) on the caller's stream.
//!
//! The kernel is in every main image the crate compiles or loads (it does not depend on the
//! world, so the world-1 module has it, as do prebuilt images of every world); an image without
//! it is an older ABI version and is refused at load.
use crate::CudaDevice;
use crate::driver;
use crate::launch;
use collective_core::Error;
use detcoll_protocol::NormDevice;
use detcoll_protocol::norm::{NORM_THREADS, NormArgs, NormParams};
use ipc_engine::RawStream;

impl NormDevice for CudaDevice {
    unsafe fn residual_rmsnorm(&self, args: &NormArgs, stream: RawStream) -> Result<(), Error> {
        let p = NormParams::pack(args)?;
        let grid = p.grid();
        if grid == 0 {
            return Ok(());
        }
        // Any loaded module: every one carries the norm (world 1 is in each).
        let m = self.module(1)?;
        driver::bind(self.context())?;
        // A programmatic launch where the device allows it (crate::programmatic): the blocks
        // start while the all_reduce before it runs and wait for it at their first
        // instruction, hiding the launch (the norm is the second launch of a fused call whose
        // all_reduce did not take the one-kernel form).
        let pdl = m.programmatic.as_ref();
        // SAFETY: `detcoll_residual_rmsnorm` takes `DcNormParams` (`NormParams`, checked by the
        // ABI table) and runs with NORM_THREADS threads per block, waiting for its
        // dependencies before any memory access (`dc_residual_rmsnorm`); the addresses were
        // checked for size, alignment and overlap by `pack`, their validity and the stream are
        // the caller's contract.
        unsafe { launch::launch_with(pdl, m.norm, grid, NORM_THREADS, &p, stream.0.cast()) }
    }
}
