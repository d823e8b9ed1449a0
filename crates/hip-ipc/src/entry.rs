//! The kernel entry points of one HIP device (the loaded code object, ABI-checked) and the one
//! `hipModuleLaunchKernel` every launch goes through.
//!
//! Nothing of this file has run on an AMD GPU (none was available).
use crate::kernels::Module;
use crate::result::{api, check};
use crate::runtime;
use crate::sys::{HipFunction, HipStream};
use collective_core::Error;
use core::ffi::c_void;

use std::sync::Arc;

/// The kernels of one device: the loaded code object and the functions the collective launches.
#[derive(Debug)]
pub struct Kernels {
    pub(crate) module: Module,
    pub(crate) collective_single: HipFunction,
    pub(crate) collective_many: HipFunction,
    pub(crate) copy: HipFunction,
    /// The fused tree W inputs -> 1 output (`detcoll_tree`, [`crate::FusedTree`]): the packed
    /// hardware arithmetic the collectives use.
    pub(crate) tree: HipFunction,
    /// The same tree in the software arithmetic (`detcoll_tree_soft`), for parity tests.
    pub(crate) tree_soft: HipFunction,
    /// The residual add + RMSNorm (`detcoll_residual_rmsnorm`, [`crate::norm`]).
    pub(crate) norm: HipFunction,
    /// The fused all_reduce + residual + RMSNorm's last launch (`detcoll_collective_norm`).
    pub(crate) collective_norm: HipFunction,
    /// One reading of the wait clock (`detcoll_clock`), for calibrating its rate; `None` in a
    /// code object built before the entry existed (then the documented default rate is used).
    pub(crate) clock: Option<HipFunction>,
    /// Most blocks of the world-1 copy kernel and of the fused tree (both grid-stride): 4
    /// blocks of `THREADS` per compute unit.
    pub(crate) grid: u32,
}

// SAFETY: module and function handles may be used from any thread of the process.
unsafe impl Send for Kernels {}
// SAFETY: launching the same function from several threads is allowed.
unsafe impl Sync for Kernels {}

impl Kernels {
    /// Loads the code object for device `ordinal` and checks its ABI table
    /// ([`detcoll_protocol::params::check_abi`]).
    pub(crate) fn load(ordinal: usize) -> Result<Arc<Kernels>, Error> {
        let module = Module::load(ordinal)?;
        Ok(Arc::new(Kernels {
            collective_single: module.function("detcoll_collective_s")?,
            collective_many: module.function("detcoll_collective_m")?,
            copy: module.function("detcoll_copy")?,
            tree: module.function("detcoll_tree")?,
            tree_soft: module.function("detcoll_tree_soft")?,
            norm: module.function("detcoll_residual_rmsnorm")?,
            collective_norm: module.function("detcoll_collective_norm")?,
            clock: module.function("detcoll_clock").ok(),
            grid: (runtime::multiprocessors(ordinal)? * 4) as u32,
            module,
        }))
    }
}

/// One `hipModuleLaunchKernel` of `f` with `params` (a single by-value struct argument).
///
/// # Safety
/// `f` must be a kernel taking exactly one parameter of type `P`'s C twin; every address in
/// `params` must be valid for the kernel's accesses; `stream` must belong to the device `f`
/// was loaded on.
pub(crate) unsafe fn launch<P>(
    f: HipFunction,
    grid: u32,
    threads: u32,
    params: &P,
    stream: HipStream,
) -> Result<(), Error> {
    let api = api()?;
    let mut args = [(params as *const P).cast_mut().cast::<c_void>()];
    // SAFETY: forwarded from the caller; the runtime copies the parameter bytes before returning.
    let r = unsafe {
        (api.hipModuleLaunchKernel)(f, grid, 1, 1, threads, 1, 1, 0, stream, args.as_mut_ptr(), core::ptr::null_mut())
    };
    check(api, r, "hipModuleLaunchKernel")
}
