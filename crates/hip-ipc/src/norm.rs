//! The residual add + RMSNorm after an all_reduce on HIP: [`NormDevice`] for [`HipDevice`], one
//! launch of `detcoll_residual_rmsnorm` (kernels/detcoll_norm.h) on the caller's stream. The
//! HIP twin of `cuda-ipc/src/norm.rs`: the same kernel body and parameter checks
//! ([`NormParams::pack`]), only the launch call differs.
//!
//! Nothing of this file has run on an AMD GPU (none was available): the kernel is compiled for
//! gfx942/gfx950 by the compile tests, never executed.
use crate::HipDevice;
use crate::entry::launch;
use crate::runtime;
use collective_core::Error;
use detcoll_protocol::NormDevice;
use detcoll_protocol::norm::{NORM_THREADS, NormArgs, NormParams};
use ipc_engine::RawStream;

impl NormDevice for HipDevice {
    unsafe fn residual_rmsnorm(&self, args: &NormArgs, stream: RawStream) -> Result<(), Error> {
        let p = NormParams::pack(args)?;
        let grid = p.grid();
        if grid == 0 {
            return Ok(());
        }
        let k = self.loaded()?;
        runtime::set_device(self.ordinal())?;
        // SAFETY: `detcoll_residual_rmsnorm` takes `DcNormParams` (`NormParams`, checked by the
        // ABI table) and runs with NORM_THREADS work-items per workgroup; the addresses were
        // checked for size, alignment and overlap by `pack`, their validity and the stream are
        // the caller's contract.
        unsafe { launch(k.norm, grid, NORM_THREADS, &p, stream.0) }
    }
}
