//! Loading the CUDA driver and mapping its errors.
//!
//! This crate asks cudarc for `fallback-dynamic-loading`: unless the application picks a
//! linking mode of its own, cudarc loads libcuda (and NVRTC) at run time and panics on first use
//! when it is absent, so every public entry point of this crate calls [`ensure_driver`] before
//! any cudarc call and turns a missing library into [`Error::LibraryMissing`].
//!
//! When the application enables cudarc's `dynamic-linking` (candle does), libcuda and libnvrtc
//! are linked into the executable instead: the process does not start without the NVIDIA
//! driver (the dynamic loader refuses it before `main`), so [`Error::LibraryMissing`] cannot
//! occur there. The probe below works in both modes (a linked library is found already loaded).
use collective_core::Error;
use cudarc::driver::{CudaContext, DriverError, sys};
use std::sync::{Arc, OnceLock};

/// Backend name used in [`Error::Backend`].
pub(crate) const BACKEND: &str = "cuda-ipc";

/// Whether libcuda can be loaded and has every entry point this crate calls (never panics):
/// [`ensure_driver`] succeeds.
pub fn driver_present() -> bool {
    ensure_driver().is_ok()
}

/// The driver entry points this crate, and the parts of cudarc it uses, call. cudarc resolves a
/// symbol when it is first called and panics when the library lacks it, so a library that
/// opens under libcuda's name but is not a whole driver (another library, a partial stub, a
/// driver older than the bindings) is refused up front by [`ensure_driver`] instead. Symbols
/// used only where the driver version is checked first (`cuFuncLoad`, `cuLaunchKernelEx`)
/// are not listed.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDeviceCanAccessPeer",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuCtxGetCurrent",
    "cuCtxSynchronize",
    "cuCtxEnablePeerAccess",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamQuery",
    "cuStreamWaitEvent",
    "cuStreamIsCapturing",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuMemAllocAsync",
    "cuMemFreeAsync",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostGetDevicePointer_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoDAsync_v2",
    "cuMemsetD8_v2",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuModuleGetGlobal_v2",
    "cuModuleUnload",
    "cuLaunchKernel",
    "cuOccupancyMaxActiveBlocksPerMultiprocessor",
    "cuIpcGetMemHandle",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
];

/// The entry point whose name depends on the CUDA version of cudarc's bindings (13 calls the
/// `_v2`): the device UUID, which every constructor reads. (`cuEventElapsedTime_v2`, which
/// only event timing calls, is not required: drivers before 12.8 lack it.)
const UUID_SYMBOL: &str = if sys::CUDA_VERSION >= 13000 { "cuDeviceGetUuid_v2" } else { "cuDeviceGetUuid" };

/// Whether the loader's `reason` only says the file is not there (as it says for every name
/// that is not installed), rather than why a file that is there cannot be loaded.
fn not_found(reason: &str) -> bool {
    reason.contains("No such file or directory")
}

/// The file names cudarc's dynamic loading tries for library `name` (`"cuda"`, `"nvrtc"`), in
/// its order. Mirrors cudarc's `get_lib_name_candidates`, which (like `is_culib_present`) only
/// exists under cudarc's `dynamic-loading`; the CUDA version is that of the bindings cudarc was
/// built with, so a name found here is one cudarc's own loader finds too.
pub(crate) fn lib_candidates(name: &str) -> Vec<String> {
    use std::env::consts::{DLL_PREFIX as P, DLL_SUFFIX as S};
    let w = usize::BITS;
    let (major, minor) = (sys::CUDA_VERSION / 1000, (sys::CUDA_VERSION % 1000) / 10);
    vec![
        format!("{P}{name}{S}"),
        format!("{P}{name}{w}{S}"),
        format!("{P}{name}{w}_{major}{S}"),
        format!("{P}{name}{w}_{major}{minor}{S}"),
        format!("{P}{name}{w}_{major}{minor}_0{S}"),
        format!("{P}{name}{w}_{major}0_{minor}{S}"),
        format!("{P}{name}{w}_10{S}"),
        format!("{P}{name}{w}_11{S}"),
        format!("{P}{name}{w}_12{S}"),
        format!("{P}{name}{w}_{major}0_0{S}"),
        format!("{P}{name}{w}_9{S}"),
        format!("{P}{name}{S}.{major}"),
        format!("{P}{name}{S}.12"),
        format!("{P}{name}{S}.11"),
        format!("{P}{name}{S}.10"),
        format!("{P}{name}{S}.9"),
        format!("{P}{name}{S}.1"),
    ]
}

/// Whether one of `names` (`"cublas"`, `"nvrtc"`: tried under the names cudarc's loader tries) can be opened by the dynamic loader. Works
/// whether cudarc loads the library at run time or the application linked it (then it is
/// already loaded and opening it only takes a reference).
pub fn loadable(names: &[&str]) -> bool {
    names.iter().flat_map(|n| lib_candidates(n)).any(|c| {
        // SAFETY: only opens the library (running its initialisers, as cudarc's own load
        // would); no symbol is called, and the handle is closed again on drop.
        unsafe { libloading::Library::new(&c) }.is_ok()
    })
}

/// `Ok` when the library cudarc loads as libcuda (the first of its candidate names that opens)
/// opens and has every entry point this crate calls, [`Error::LibraryMissing`] otherwise: none
/// opens (with the loader's reason for any that is there but cannot be loaded), or the one that
/// opens lacks entry points (named).
pub fn ensure_driver() -> Result<(), Error> {
    // A driver found whole stays loaded for the process (cudarc keeps its handle): checked
    // once; a refusal is checked again on the next call.
    static WHOLE: OnceLock<()> = OnceLock::new();
    if WHOLE.get().is_some() {
        return Ok(());
    }
    check_driver().map(|()| {
        let _ = WHOLE.set(());
    })
}

/// [`ensure_driver`]'s check, uncached.
fn check_driver() -> Result<(), Error> {
    let missing = |detail: String| Error::LibraryMissing { library: "libcuda.so (NVIDIA driver)".into(), detail };
    let mut refused = Vec::new();
    for name in ["cuda", "nvcuda"].iter().flat_map(|n| lib_candidates(n)) {
        // SAFETY: only opens the library (running its initialisers, as cudarc's own load
        // would); no symbol is called, and the handle is closed again on drop.
        let lib = match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => lib,
            Err(e) => {
                let reason = collective_core::display_chain(&e);
                if !not_found(&reason) {
                    refused.push(format!("{name}: {reason}"));
                }
                continue;
            }
        };
        let absent: Vec<&str> = REQUIRED_SYMBOLS
            .iter()
            .copied()
            .chain([UUID_SYMBOL])
            // SAFETY: only looks the symbol up (as a data pointer, never called).
            .filter(|sym| unsafe { lib.get::<*const ()>(sym.as_bytes()) }.is_err())
            .collect();
        if absent.is_empty() {
            return Ok(());
        }
        let shown: Vec<&str> = absent.iter().take(4).copied().collect();
        return Err(missing(format!(
            "{name} was loaded but lacks {} of the driver's entry points ({}{}): it is not the NVIDIA \
             driver's libcuda, or a driver older than CUDA {}.{} (cudarc's bindings); install the NVIDIA driver \
             or put its directory first in LD_LIBRARY_PATH",
            absent.len(),
            shown.join(", "),
            if absent.len() > shown.len() { ", ..." } else { "" },
            sys::CUDA_VERSION / 1000,
            sys::CUDA_VERSION % 1000 / 10,
        )));
    }
    let mut detail = "no CUDA driver library was found by the dynamic loader; install the NVIDIA driver or add \
                      its directory to LD_LIBRARY_PATH"
        .to_string();
    if !refused.is_empty() {
        detail = format!("{detail} (found but refused by the loader: {})", refused.join("; "));
    }
    Err(missing(detail))
}

/// Maps a driver error of step `what` to [`Error::Vendor`] (cudarc's error is the source).
pub(crate) fn backend(what: &str, e: DriverError) -> Error {
    Error::Vendor { backend: BACKEND, call: what.to_string(), source: Box::new(e) }
}

/// Checks a raw driver call's status.
pub(crate) fn check(r: sys::CUresult, what: &str) -> Result<(), Error> {
    r.result().map_err(|e| backend(what, e))
}

/// Number of CUDA devices; [`Error::LibraryMissing`] without a driver.
pub fn device_count() -> Result<usize, Error> {
    ensure_driver()?;
    match CudaContext::device_count() {
        Ok(n) => Ok(usize::try_from(n).unwrap_or(0)),
        // A driver without a visible device (`CUDA_VISIBLE_DEVICES=""`, no GPU): `cuInit` says
        // so; that is a count of 0, which callers report as such (not a failed driver call).
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NO_DEVICE => Ok(0),
        Err(e) => Err(backend("cuDeviceGetCount", e)),
    }
}

/// The primary context of device `ordinal`, bound to the calling thread.
///
/// Unlike `CudaContext::new`, returns [`Error::LibraryMissing`] (instead of panicking) when
/// there is no driver.
pub fn open_device(ordinal: usize) -> Result<Arc<CudaContext>, Error> {
    ensure_driver()?;
    CudaContext::new(ordinal).map_err(|e| backend(&format!("opening CUDA device {ordinal}"), e))
}

/// Makes `ctx` current on this thread (a no-op when it already is).
pub(crate) fn bind(ctx: &CudaContext) -> Result<(), Error> {
    ctx.bind_to_thread().map_err(|e| backend("binding the CUDA context", e))
}

/// A device attribute of `ctx`'s device.
pub(crate) fn attribute(ctx: &CudaContext, attr: sys::CUdevice_attribute) -> Result<i32, Error> {
    ctx.attribute(attr).map_err(|e| backend("cuDeviceGetAttribute", e))
}

/// Multiprocessors of `ctx`'s device.
pub(crate) fn multiprocessors(ctx: &CudaContext) -> Result<usize, Error> {
    let n = attribute(ctx, sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;
    Ok(usize::try_from(n).unwrap_or(1).max(1))
}

/// `sm_XY` of `ctx`'s device.
pub(crate) fn arch(ctx: &CudaContext) -> Result<String, Error> {
    let (major, minor) = ctx.compute_capability().map_err(|e| backend("cuDeviceGetAttribute", e))?;
    Ok(format!("sm_{major}{minor}"))
}

/// The 16-byte UUID of `ctx`'s device (identifies "same GPU" across processes).
pub fn uuid(ctx: &CudaContext) -> Result<[u8; 16], Error> {
    let u = ctx.uuid().map_err(|e| backend("cuDeviceGetUuid", e))?;
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(u.bytes.iter()) {
        *o = *b as u8;
    }
    Ok(out)
}

/// Waits for all work of `ctx`'s device context.
pub(crate) fn synchronize(ctx: &CudaContext) -> Result<(), Error> {
    ctx.synchronize().map_err(|e| backend("cuCtxSynchronize", e))
}
