//! The standalone fused tree kernel on the host side: W inputs (in rank order) -> one output,
//! in one pass (`detcoll_tree`, kernels/detcoll_protocol.h). The HIP twin of
//! `cuda-ipc/src/tree.rs`: the same kernel body, the same parameter packing
//! ([`TreeParams::pack`], shared through `collective_core::protocol::params`), only the launch
//! call differs.
//!
//! Used by the RCCL transport (`ccl-transport`'s `HipDevice`: gathered ranks -> local tree), so
//! its reductions are the IPC route's bits by construction.
//!
//! Nothing of this file has run on an AMD GPU (none was available): see docs/rocm.md.
use crate::collective::{Kernels, launch};
use crate::runtime;
use crate::sys::{HipFunction, HipStream};
use collective_core::protocol::params::{THREADS, TreeParams};
use collective_core::{DType, Error};
use std::sync::Arc;

/// The fused tree kernel loaded on one HIP device.
#[derive(Debug, Clone)]
pub struct FusedTree {
    kernels: Arc<Kernels>,
    device: usize,
}

impl FusedTree {
    /// Loads the code object for device `ordinal`'s arch (ABI-checked, see
    /// [`crate::kernels`]). A missing `libamdhip64` is [`Error::LibraryMissing`]; a device that
    /// does not exist is [`Error::InvalidConfig`]; a missing code object is a `Backend` error
    /// naming the `cargo xtask build` command that makes it.
    pub fn load(ordinal: usize) -> Result<Self, Error> {
        let n = runtime::device_count()?;
        if ordinal >= n {
            return Err(Error::InvalidConfig { detail: format!("HIP device {ordinal} does not exist ({n} visible)") });
        }
        Ok(FusedTree { kernels: Kernels::load(ordinal)?, device: ordinal })
    }

    /// The device the kernel is loaded on.
    pub fn device(&self) -> usize {
        self.device
    }

    /// Blocks one launch uses (4 per compute unit; the kernel is grid-stride, so the grid
    /// never changes the bits).
    pub fn grid(&self) -> u32 {
        self.kernels.grid
    }

    /// Where the code object came from.
    pub fn origin(&self) -> &str {
        &self.kernels.module.origin
    }

    /// Enqueues `out[i] = tree(inputs[0][i], ..., inputs[W-1][i])` for `i < count`, `W =
    /// inputs.len()` in {1, 2, 4, 8}, in `dtype`'s arithmetic (the packed gfx9 instructions:
    /// see kernels/detcoll_tree.h). Parameters are checked before anything is enqueued
    /// ([`TreeParams::pack`]).
    ///
    /// # Safety
    /// Every input must hold `count` readable elements of `dtype` and `out` `count` writable
    /// ones, all device-addressable from this device, `out` overlapping no input (except being
    /// exactly one of them); `stream` must be a live stream of this device (or null).
    pub unsafe fn launch(
        &self,
        inputs: &[u64],
        out: u64,
        count: usize,
        dtype: DType,
        stream: HipStream,
    ) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_with(self.kernels.tree, inputs, out, count, dtype, stream) }
    }

    /// [`FusedTree::launch`] in the software arithmetic (widen to f32, one add, round once):
    /// the same bits by the fixed-tree argument; the GPU tests check the two against each other.
    ///
    /// # Safety
    /// As [`FusedTree::launch`].
    pub unsafe fn launch_soft(
        &self,
        inputs: &[u64],
        out: u64,
        count: usize,
        dtype: DType,
        stream: HipStream,
    ) -> Result<(), Error> {
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_with(self.kernels.tree_soft, inputs, out, count, dtype, stream) }
    }

    /// # Safety
    /// As [`FusedTree::launch`]; `f` takes `DcTreeParams`.
    unsafe fn launch_with(
        &self,
        f: HipFunction,
        inputs: &[u64],
        out: u64,
        count: usize,
        dtype: DType,
        stream: HipStream,
    ) -> Result<(), Error> {
        let p = TreeParams::pack(inputs, out, count, dtype)?;
        runtime::set_device(self.device)?;
        // SAFETY: forwarded from the caller; `f` takes `DcTreeParams`.
        unsafe { launch(f, self.kernels.grid, THREADS, &p, stream) }
    }
}
