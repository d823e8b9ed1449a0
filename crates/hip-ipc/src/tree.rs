//! The standalone fused tree kernel on the host side: W inputs (in rank order) -> one output,
//! in one pass (`detcoll_tree`, kernels/detcoll_protocol.h). The HIP twin of
//! `cuda-ipc/src/tree.rs`: the same kernel body, the same parameter packing
//! ([`TreeParams::pack`], shared through `detcoll_protocol::params`), only the launch
//! call differs.
//!
//! Used by the RCCL transport (`ccl-transport`'s `HipDevice`: gathered ranks -> local tree), so
//! its reductions are the IPC route's bits by construction.
//!
//! Nothing of this file has run on an AMD GPU (none was available): see docs/rocm.md.
use crate::entry::{Kernels, launch};
use crate::runtime;
use crate::sys::HipStream;
use collective_core::{DType, Error};
use detcoll_protocol::params::{THREADS, TreeParams};
use std::sync::Arc;

/// Which arithmetic a tree launch uses. Both give the dtype add's bits (the fixed-tree
/// argument); the GPU tests check them against each other.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arithmetic {
    /// The packed gfx9 instructions (`detcoll_tree`): what the collectives use.
    Hardware,
    /// Widen to f32, one add, round once in code (`detcoll_tree_soft`): the path the NVIDIA
    /// "soft" module also runs.
    Software,
}

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

    /// Over a code object already loaded on device `ordinal` (a [`crate::HipDevice`]'s).
    pub(crate) fn from_kernels(kernels: Arc<Kernels>, ordinal: usize) -> Self {
        FusedTree { kernels, device: ordinal }
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
        let p = TreeParams::pack(inputs, out, count, dtype)?;
        // SAFETY: forwarded from the caller.
        unsafe { self.launch_packed(&p, Arithmetic::Hardware, stream) }
    }

    /// Enqueues one tree launch of already packed (hence checked) parameters in `arithmetic`.
    ///
    /// # Safety
    /// As [`FusedTree::launch`], for the addresses in `p`.
    pub unsafe fn launch_packed(&self, p: &TreeParams, arithmetic: Arithmetic, stream: HipStream) -> Result<(), Error> {
        let f = match arithmetic {
            Arithmetic::Hardware => self.kernels.tree,
            Arithmetic::Software => self.kernels.tree_soft,
        };
        runtime::set_device(self.device)?;
        // SAFETY: forwarded from the caller; both kernels take `DcTreeParams`.
        unsafe { launch(f, self.kernels.grid, THREADS, p, stream) }
    }
}
