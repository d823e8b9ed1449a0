//! Raw HIP runtime binding: the symbols we call, resolved once from `libamdhip64` at run time.
//!
//! Why our own table instead of a crate: hip-rs links ROCm at build time (and uses hipcc as
//! the linker); detcoll must build and test on machines without ROCm, and a ROCm build must
//! not need a HIP toolchain at build time. So every symbol is looked up with `libloading`, and
//! a missing library or symbol is a typed error.
//!
//! Constants are the values of ROCm 6+'s `hip/hip_runtime_api.h` (checked against the header
//! text: `hipDeviceMallocFinegrained 0x1`, `hipDeviceMallocUncached 0x3`,
//! `hipHostMallocMapped 0x2`, `hipIpcMemLazyEnablePeerAccess 0x01`, `hipStreamNonBlocking
//! 0x01`, `hipEventDisableTiming 0x2`, `hipErrorNotReady 600`, `HIP_IPC_HANDLE_SIZE 64`, and
//! the `hipDeviceAttribute_t` enum order).
use core::ffi::{c_char, c_int, c_uint, c_void};
use std::path::PathBuf;

/// `hipError_t`.
pub type HipError = c_int;
/// `hipStream_t` (opaque).
pub type HipStream = *mut c_void;
/// `hipModule_t` (opaque).
pub type HipModule = *mut c_void;
/// `hipFunction_t` (opaque).
pub type HipFunction = *mut c_void;
/// `hipDeviceptr_t`.
pub type HipDevicePtr = *mut c_void;
/// `hipEvent_t` (opaque).
pub type HipEvent = *mut c_void;

/// `hipSuccess`.
pub const HIP_SUCCESS: HipError = 0;
/// `hipErrorPeerAccessAlreadyEnabled`.
pub const HIP_ERROR_PEER_ACCESS_ALREADY_ENABLED: HipError = 704;
/// `hipErrorNotReady`: what `hipEventQuery` / `hipStreamQuery` return while work is pending.
pub const HIP_ERROR_NOT_READY: HipError = 600;

/// `hipExtMallocWithFlags`: memory in the fine-grained region of the device, so system-scope
/// atomics on it are coherent with peers and the host.
pub const HIP_DEVICE_MALLOC_FINEGRAINED: c_uint = 0x1;
/// `hipExtMallocWithFlags`: uncached device memory (the alternative for flags).
pub const HIP_DEVICE_MALLOC_UNCACHED: c_uint = 0x3;
/// `hipHostMalloc`: map the allocation into the device address space.
pub const HIP_HOST_MALLOC_MAPPED: c_uint = 0x2;
/// `hipHostMalloc`: usable from every device.
pub const HIP_HOST_MALLOC_PORTABLE: c_uint = 0x1;
/// `hipIpcOpenMemHandle`: enable peer access lazily.
pub const HIP_IPC_MEM_LAZY_ENABLE_PEER_ACCESS: c_uint = 0x1;
/// `hipStreamCreateWithFlags`: no implicit synchronisation with the null stream.
pub const HIP_STREAM_NON_BLOCKING: c_uint = 0x1;
/// `hipEventCreateWithFlags`: no timestamps (cheaper record and wait).
pub const HIP_EVENT_DISABLE_TIMING: c_uint = 0x2;

/// `hipMemcpyKind`.
pub const HIP_MEMCPY_HOST_TO_DEVICE: c_int = 1;
/// `hipMemcpyKind`.
pub const HIP_MEMCPY_DEVICE_TO_HOST: c_int = 2;
/// `hipMemcpyKind`.
pub const HIP_MEMCPY_DEVICE_TO_DEVICE: c_int = 3;

/// `hipDeviceAttributeMultiprocessorCount` (position 63 of the CUDA-compatible block).
pub const HIP_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: c_int = 63;
/// `hipDeviceAttributeWallClockRate` (kHz of the `s_memrealtime` counter; AMD block, 10017).
pub const HIP_DEVICE_ATTRIBUTE_WALL_CLOCK_RATE: c_int = 10017;

/// `HIP_IPC_HANDLE_SIZE`.
pub const HIP_IPC_HANDLE_SIZE: usize = 64;
/// Bytes we hand to `hipDeviceGetPCIBusId`: `dddd:bb:dd.f` and its NUL fit with room to spare.
pub const PCI_BUS_ID_BYTES: usize = 64;

/// `hipIpcMemHandle_t`: 64 opaque bytes passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HipIpcMemHandle {
    pub reserved: [c_char; HIP_IPC_HANDLE_SIZE],
}

const _: () = assert!(size_of::<HipIpcMemHandle>() == 64);
const _: () = assert!(align_of::<HipIpcMemHandle>() == 1);
const _: () = assert!(size_of::<HipStream>() == 8 && size_of::<HipDevicePtr>() == 8);
const _: () = assert!(size_of::<HipEvent>() == 8);

/// `hipMemoryTypeDevice` (ROCm 6 numbering: Unregistered 0, Host 1, Device 2, Managed 3,
/// Array 10, Unified 11; ROCm 5 numbered Host 0, Device 1).
pub const HIP_MEMORY_TYPE_DEVICE: c_uint = 2;

/// `hipPointerAttribute_t` of ROCm 6's `hip/hip_runtime_api.h`: `{ enum hipMemoryType type;
/// int device; void* devicePointer; void* hostPointer; int isManaged; unsigned
/// allocationFlags; }`. CLR's `hipExtMallocWithFlags` saves the flags it was given, and
/// `hipPointerGetAttributes` reports them in `allocation_flags`: how the control block's kind
/// is checked after allocating (see `staging::check_control_attributes`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HipPointerAttribute {
    /// `hipMemoryType` (a C enum: 4 bytes).
    pub memory_type: c_uint,
    pub device: c_int,
    pub device_pointer: *mut c_void,
    pub host_pointer: *mut c_void,
    pub is_managed: c_int,
    pub allocation_flags: c_uint,
}

const _: () = assert!(size_of::<HipPointerAttribute>() == 32 && align_of::<HipPointerAttribute>() == 8);
const _: () = assert!(core::mem::offset_of!(HipPointerAttribute, memory_type) == 0);
const _: () = assert!(core::mem::offset_of!(HipPointerAttribute, device) == 4);
const _: () = assert!(core::mem::offset_of!(HipPointerAttribute, device_pointer) == 8);
const _: () = assert!(core::mem::offset_of!(HipPointerAttribute, host_pointer) == 16);
const _: () = assert!(core::mem::offset_of!(HipPointerAttribute, is_managed) == 24);
const _: () = assert!(core::mem::offset_of!(HipPointerAttribute, allocation_flags) == 28);

/// Bytes we hand to `hipGetDeviceProperties`: more than any `hipDeviceProp_t` revision
/// (R0600 is about 1.5 KiB), so the runtime never writes past it.
pub const DEVICE_PROP_BYTES: usize = 8192;

/// The function table. Field names are the C symbols.
#[allow(non_snake_case, missing_docs)]
#[derive(Debug)]
pub struct Api {
    pub hipInit: unsafe extern "C" fn(c_uint) -> HipError,
    pub hipGetDeviceCount: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub hipSetDevice: unsafe extern "C" fn(c_int) -> HipError,
    pub hipGetDevice: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub hipDeviceGetAttribute: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError,
    /// `hipGetDevicePropertiesR0600` (ROCm 6+), else `hipGetDeviceProperties`.
    pub hipGetDeviceProperties: unsafe extern "C" fn(*mut c_void, c_int) -> HipError,
    pub hipDeviceSynchronize: unsafe extern "C" fn() -> HipError,
    pub hipMalloc: unsafe extern "C" fn(*mut *mut c_void, usize) -> HipError,
    pub hipExtMallocWithFlags: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError,
    pub hipFree: unsafe extern "C" fn(*mut c_void) -> HipError,
    /// `(attributes, ptr)`: what the runtime recorded for the allocation holding `ptr`.
    pub hipPointerGetAttributes: unsafe extern "C" fn(*mut HipPointerAttribute, *const c_void) -> HipError,
    pub hipHostMalloc: unsafe extern "C" fn(*mut *mut c_void, usize, c_uint) -> HipError,
    pub hipHostFree: unsafe extern "C" fn(*mut c_void) -> HipError,
    pub hipHostGetDevicePointer: unsafe extern "C" fn(*mut *mut c_void, *mut c_void, c_uint) -> HipError,
    pub hipMemcpy: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int) -> HipError,
    pub hipMemcpyAsync: unsafe extern "C" fn(*mut c_void, *const c_void, usize, c_int, HipStream) -> HipError,
    pub hipMemset: unsafe extern "C" fn(*mut c_void, c_int, usize) -> HipError,
    pub hipMemsetAsync: unsafe extern "C" fn(*mut c_void, c_int, usize, HipStream) -> HipError,
    pub hipStreamCreateWithFlags: unsafe extern "C" fn(*mut HipStream, c_uint) -> HipError,
    pub hipStreamDestroy: unsafe extern "C" fn(HipStream) -> HipError,
    pub hipStreamSynchronize: unsafe extern "C" fn(HipStream) -> HipError,
    pub hipStreamQuery: unsafe extern "C" fn(HipStream) -> HipError,
    pub hipStreamWaitEvent: unsafe extern "C" fn(HipStream, HipEvent, c_uint) -> HipError,
    pub hipEventCreateWithFlags: unsafe extern "C" fn(*mut HipEvent, c_uint) -> HipError,
    pub hipEventQuery: unsafe extern "C" fn(HipEvent) -> HipError,
    pub hipDeviceGetPCIBusId: unsafe extern "C" fn(*mut c_char, c_int, c_int) -> HipError,
    /// Default flags: timing enabled (what `hipEventElapsedTime` needs).
    pub hipEventCreate: unsafe extern "C" fn(*mut HipEvent) -> HipError,
    pub hipEventRecord: unsafe extern "C" fn(HipEvent, HipStream) -> HipError,
    pub hipEventSynchronize: unsafe extern "C" fn(HipEvent) -> HipError,
    /// `(ms, start, stop)`: milliseconds between two completed events.
    pub hipEventElapsedTime: unsafe extern "C" fn(*mut f32, HipEvent, HipEvent) -> HipError,
    pub hipEventDestroy: unsafe extern "C" fn(HipEvent) -> HipError,
    pub hipIpcGetMemHandle: unsafe extern "C" fn(*mut HipIpcMemHandle, *mut c_void) -> HipError,
    pub hipIpcOpenMemHandle: unsafe extern "C" fn(*mut *mut c_void, HipIpcMemHandle, c_uint) -> HipError,
    pub hipIpcCloseMemHandle: unsafe extern "C" fn(*mut c_void) -> HipError,
    pub hipDeviceCanAccessPeer: unsafe extern "C" fn(*mut c_int, c_int, c_int) -> HipError,
    pub hipDeviceEnablePeerAccess: unsafe extern "C" fn(c_int, c_uint) -> HipError,
    pub hipModuleLoadData: unsafe extern "C" fn(*mut HipModule, *const c_void) -> HipError,
    pub hipModuleGetFunction: unsafe extern "C" fn(*mut HipFunction, HipModule, *const c_char) -> HipError,
    pub hipModuleGetGlobal: unsafe extern "C" fn(*mut HipDevicePtr, *mut usize, HipModule, *const c_char) -> HipError,
    #[allow(clippy::type_complexity)]
    pub hipModuleLaunchKernel: unsafe extern "C" fn(
        HipFunction,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        HipStream,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> HipError,
    pub hipModuleUnload: unsafe extern "C" fn(HipModule) -> HipError,
    pub hipGetErrorString: unsafe extern "C" fn(HipError) -> *const c_char,
    pub hipRuntimeGetVersion: unsafe extern "C" fn(*mut c_int) -> HipError,
    pub hipDriverGetVersion: unsafe extern "C" fn(*mut c_int) -> HipError,
    /// Keeps the library mapped while the pointers above are in use (for the process).
    _lib: libloading::Library,
}

/// Library names tried in order, then the same names under `$ROCM_PATH/lib` (default
/// `/opt/rocm/lib`).
pub const LIBRARY_NAMES: [&str; 3] = ["libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so"];

/// Every path [`Api::load`] tries.
pub fn library_candidates() -> Vec<PathBuf> {
    rocm_library_candidates(&LIBRARY_NAMES)
}

/// `names` as the dynamic loader finds them, then under `$ROCM_PATH/lib` (default
/// `/opt/rocm/lib`): how every ROCm library of this crate is looked for.
pub fn rocm_library_candidates(names: &[&str]) -> Vec<PathBuf> {
    let rocm = rocm_root();
    let mut v: Vec<PathBuf> = names.iter().map(PathBuf::from).collect();
    v.extend(names.iter().map(|n| rocm.join("lib").join(n)));
    v
}

/// ROCm's root: `$ROCM_PATH` when it is an absolute path, else `/opt/rocm`. An empty or
/// relative value is ignored: libraries and tools looked for under it would be found relative
/// to the working directory (an outside probe had `ROCM_PATH=` load `./lib/libamdhip64.so`).
pub fn rocm_root() -> PathBuf {
    rocm_root_of(std::env::var_os("ROCM_PATH"))
}

/// [`rocm_root`] for a `ROCM_PATH` of `value`.
fn rocm_root_of(value: Option<std::ffi::OsString>) -> PathBuf {
    value.map(PathBuf::from).filter(|p| p.is_absolute()).unwrap_or_else(|| "/opt/rocm".into())
}

/// Opens the first of `candidates` that loads and resolves its symbols with `resolve`. The
/// error lists every path tried (or the symbol the first loadable library lacks).
pub(crate) fn load_first<T>(
    candidates: &[PathBuf],
    resolve: impl FnOnce(libloading::Library) -> Result<T, String>,
) -> Result<T, String> {
    let mut errors = Vec::new();
    for path in candidates {
        // SAFETY: loading a ROCm library (libamdhip64, libhiprtc) runs its initialisers, which
        // is what every HIP program does at start-up.
        match unsafe { libloading::Library::new(path) } {
            Ok(lib) => return resolve(lib).map_err(|e| format!("{}: {e}", path.display())),
            Err(e) => errors.push(format!("{}: {}", path.display(), collective_core::display_chain(&e))),
        }
    }
    Err(errors.join("; "))
}

/// Looks `name` up in `lib` as a `T`. Only for the function tables of this crate ([`Api`] and
/// `rtc::RtcApi`), whose field types are the C signatures.
pub(crate) fn symbol<T: Copy>(lib: &libloading::Library, name: &str) -> Result<T, String> {
    // SAFETY: every `T` used with this function is the `extern "C"` signature of the symbol
    // `name` as declared in ROCm 6+'s hip_runtime_api.h / hiprtc.h.
    unsafe { lib.get::<T>(name.as_bytes()) }.map(|s| *s).map_err(|e| format!("symbol {name}: {e}"))
}

impl Api {
    /// Loads the first library of [`library_candidates`] and resolves every symbol.
    pub fn load() -> Result<Api, String> {
        load_first(&library_candidates(), Self::resolve)
    }

    fn resolve(lib: libloading::Library) -> Result<Api, String> {
        let props = symbol(&lib, "hipGetDevicePropertiesR0600").or_else(|_| symbol(&lib, "hipGetDeviceProperties"))?;
        Ok(Api {
            hipInit: symbol(&lib, "hipInit")?,
            hipGetDeviceCount: symbol(&lib, "hipGetDeviceCount")?,
            hipSetDevice: symbol(&lib, "hipSetDevice")?,
            hipGetDevice: symbol(&lib, "hipGetDevice")?,
            hipDeviceGetAttribute: symbol(&lib, "hipDeviceGetAttribute")?,
            hipGetDeviceProperties: props,
            hipDeviceSynchronize: symbol(&lib, "hipDeviceSynchronize")?,
            hipMalloc: symbol(&lib, "hipMalloc")?,
            hipExtMallocWithFlags: symbol(&lib, "hipExtMallocWithFlags")?,
            hipFree: symbol(&lib, "hipFree")?,
            hipPointerGetAttributes: symbol(&lib, "hipPointerGetAttributes")?,
            hipHostMalloc: symbol(&lib, "hipHostMalloc")?,
            hipHostFree: symbol(&lib, "hipHostFree")?,
            hipHostGetDevicePointer: symbol(&lib, "hipHostGetDevicePointer")?,
            hipMemcpy: symbol(&lib, "hipMemcpy")?,
            hipMemcpyAsync: symbol(&lib, "hipMemcpyAsync")?,
            hipMemset: symbol(&lib, "hipMemset")?,
            hipMemsetAsync: symbol(&lib, "hipMemsetAsync")?,
            hipStreamCreateWithFlags: symbol(&lib, "hipStreamCreateWithFlags")?,
            hipStreamDestroy: symbol(&lib, "hipStreamDestroy")?,
            hipStreamSynchronize: symbol(&lib, "hipStreamSynchronize")?,
            hipStreamQuery: symbol(&lib, "hipStreamQuery")?,
            hipStreamWaitEvent: symbol(&lib, "hipStreamWaitEvent")?,
            hipEventCreateWithFlags: symbol(&lib, "hipEventCreateWithFlags")?,
            hipEventQuery: symbol(&lib, "hipEventQuery")?,
            hipDeviceGetPCIBusId: symbol(&lib, "hipDeviceGetPCIBusId")?,
            hipEventCreate: symbol(&lib, "hipEventCreate")?,
            hipEventRecord: symbol(&lib, "hipEventRecord")?,
            hipEventSynchronize: symbol(&lib, "hipEventSynchronize")?,
            hipEventElapsedTime: symbol(&lib, "hipEventElapsedTime")?,
            hipEventDestroy: symbol(&lib, "hipEventDestroy")?,
            hipIpcGetMemHandle: symbol(&lib, "hipIpcGetMemHandle")?,
            hipIpcOpenMemHandle: symbol(&lib, "hipIpcOpenMemHandle")?,
            hipIpcCloseMemHandle: symbol(&lib, "hipIpcCloseMemHandle")?,
            hipDeviceCanAccessPeer: symbol(&lib, "hipDeviceCanAccessPeer")?,
            hipDeviceEnablePeerAccess: symbol(&lib, "hipDeviceEnablePeerAccess")?,
            hipModuleLoadData: symbol(&lib, "hipModuleLoadData")?,
            hipModuleGetFunction: symbol(&lib, "hipModuleGetFunction")?,
            hipModuleGetGlobal: symbol(&lib, "hipModuleGetGlobal")?,
            hipModuleLaunchKernel: symbol(&lib, "hipModuleLaunchKernel")?,
            hipModuleUnload: symbol(&lib, "hipModuleUnload")?,
            hipGetErrorString: symbol(&lib, "hipGetErrorString")?,
            hipRuntimeGetVersion: symbol(&lib, "hipRuntimeGetVersion")?,
            hipDriverGetVersion: symbol(&lib, "hipDriverGetVersion")?,
            _lib: lib,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::rocm_root_of;
    use std::path::PathBuf;

    #[test]
    fn an_empty_or_relative_rocm_path_is_ignored() {
        // Else `lib/libamdhip64.so.7` would be loaded from the working directory.
        for v in ["", "lib/..", "rocm"] {
            assert_eq!(rocm_root_of(Some(v.into())), PathBuf::from("/opt/rocm"), "{v:?}");
        }
        assert_eq!(rocm_root_of(Some("/opt/rocm-7.0".into())), PathBuf::from("/opt/rocm-7.0"));
        assert_eq!(rocm_root_of(None), PathBuf::from("/opt/rocm"));
    }
}
