//! The one `cuLaunchKernel` per call. The kernel parameter structs, their packing from a
//! protocol [`Plan`](detcoll_protocol::Plan) and the launch shape are backend-neutral
//! and live in [`detcoll_protocol::params`] (shared with `hip-ipc` through the
//! engine).
use crate::driver::check;
use crate::programmatic::Programmatic;
use collective_core::Error;
use cudarc::driver::sys;

pub(crate) use detcoll_protocol::params::{ABI_VERSION, THREADS, TreeParams};

/// One `cuLaunchKernel` of `f` with `params` (a single by-value struct argument).
///
/// # Safety
/// `f` must be a kernel taking exactly one parameter of type `P`'s C twin; every address in
/// `params` must be valid for the kernel's accesses; `stream` must belong to the current
/// context.
pub(crate) unsafe fn launch<P>(
    f: sys::CUfunction,
    grid: u32,
    threads: u32,
    params: &P,
    stream: sys::CUstream,
) -> Result<(), Error> {
    // SAFETY: forwarded from the caller.
    unsafe { launch_with(None, f, grid, threads, params, stream) }
}

/// As [`launch`], through `programmatic` (a programmatic dependent launch) when given.
///
/// # Safety
/// As [`launch`]; with `programmatic`, `f` must also wait for its dependencies
/// (`griddepcontrol.wait`) before its first memory access, as the collective kernels do.
pub(crate) unsafe fn launch_with<P>(
    programmatic: Option<&Programmatic>,
    f: sys::CUfunction,
    grid: u32,
    threads: u32,
    params: &P,
    stream: sys::CUstream,
) -> Result<(), Error> {
    let mut args = [(params as *const P).cast_mut().cast::<core::ffi::c_void>()];
    if let Some(p) = programmatic.filter(|_| Programmatic::suits(stream)) {
        // SAFETY: forwarded from the caller.
        if unsafe { p.launch(f, grid, threads, &mut args, stream) }.is_ok() {
            return Ok(());
        }
        // A refused programmatic launch launched nothing: launch plainly (an error that is not
        // the attribute's, e.g. a sticky context error, is then reported by that launch).
    }
    // SAFETY: forwarded from the caller; the driver copies the parameter bytes before returning.
    let r = unsafe {
        sys::cuLaunchKernel(f, grid, 1, 1, threads, 1, 1, 0, stream, args.as_mut_ptr(), core::ptr::null_mut())
    };
    check(r, "cuLaunchKernel")
}
