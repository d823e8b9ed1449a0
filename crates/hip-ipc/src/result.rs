//! `hipError_t` to typed errors, and the process-wide loaded runtime.
use crate::BACKEND;
use crate::sys::{Api, HIP_ERROR_NOT_READY, HIP_SUCCESS, HipError};
use collective_core::Error;
use core::ffi::{c_char, c_int};
use std::ffi::CStr;
use std::sync::OnceLock;

/// The loaded HIP runtime, or why it could not be loaded (remembered: loading is tried once
/// per process, and a library appearing later is not picked up).
pub fn api() -> Result<&'static Api, Error> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    match API.get_or_init(|| {
        // hipInit before anything else; its failure (no device, no driver) is reported by the
        // first call that needs a device, through `check`.
        Api::load().inspect(|a| {
            // SAFETY: flags must be 0.
            let _ = unsafe { (a.hipInit)(0) };
        })
    }) {
        Ok(api) => Ok(api),
        Err(detail) => Err(Error::LibraryMissing {
            library: "libamdhip64 (HIP runtime)".into(),
            detail: format!("{detail}; install ROCm 6+ or set ROCM_PATH / LD_LIBRARY_PATH"),
        }),
    }
}

/// Whether the HIP runtime can be loaded (never panics).
pub fn runtime_present() -> bool {
    api().is_ok()
}

/// `hipGetErrorString(code)`, or the number when the runtime has no text for it.
pub fn error_string(api: &Api, code: HipError) -> String {
    // SAFETY: hipGetErrorString returns a static NUL-terminated string or null.
    unsafe { describe((api.hipGetErrorString)(code), code, "hipError_t") }
}

/// `"text (code)"` for the result `text` of a `*GetErrorString(code)` call (hipGetErrorString,
/// hiprtcGetErrorString), or `"<type> <code>"` when it is null.
///
/// # Safety
///
/// `text` is null or a NUL-terminated string that stays valid during the call.
pub(crate) unsafe fn describe(text: *const c_char, code: c_int, type_name: &str) -> String {
    if text.is_null() {
        return format!("{type_name} {code}");
    }
    // SAFETY: non-null and NUL-terminated (the caller's guarantee).
    let s = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    format!("{s} ({code})")
}

/// A failed HIP runtime call: its `hipError_t` and `hipGetErrorString` (the source of the
/// [`Error::Vendor`] a failed call becomes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct HipRuntimeError {
    /// The `hipError_t`.
    pub code: HipError,
    /// `hipGetErrorString(code) (code)`.
    pub message: String,
}

/// `Ok` on `hipSuccess`, [`Error::Vendor`] naming the step otherwise (the runtime's error as
/// the source).
pub fn check(api: &Api, code: HipError, what: &str) -> Result<(), Error> {
    if code == HIP_SUCCESS {
        Ok(())
    } else {
        Err(Error::Vendor {
            backend: BACKEND,
            call: what.to_string(),
            source: Box::new(HipRuntimeError { code, message: error_string(api, code) }),
        })
    }
}

/// For queries (`hipEventQuery`, `hipStreamQuery`): `Ok(true)` on `hipSuccess`, `Ok(false)` on
/// `hipErrorNotReady`, [`Error::Backend`] naming the step otherwise.
pub fn ready(api: &Api, code: HipError, what: &str) -> Result<bool, Error> {
    if code == HIP_ERROR_NOT_READY { Ok(false) } else { check(api, code, what).map(|()| true) }
}
