//! Raw hiprtc binding (HIP's runtime compiler): the eight symbols we call, resolved once from
//! `libhiprtc` at run time, and one compile call on top of them.
//!
//! Used only when no prebuilt code object exists for the device's arch (see [`crate::kernels`]).
//! As for [`crate::sys`], nothing is linked at build time: every symbol is looked up with
//! `libloading` (the library names of [`LIBRARY_NAMES`], then the same under `$ROCM_PATH/lib`),
//! and a missing library or symbol is [`Error::LibraryMissing`], never a panic.
//!
//! Signatures are those of ROCm 6+'s `hip/hiprtc.h`: `hiprtcResult` is a C `int` enum with
//! `HIPRTC_SUCCESS = 0`, `hiprtcProgram` an opaque pointer (`struct _hiprtcProgram*`), string
//! arrays are `const char**`, sizes `size_t*`.
//!
//! Status: written and unit-tested on a machine without ROCm; never executed against a real
//! libhiprtc (no AMD GPU or ROCm install was available).
use crate::result::describe;
use crate::sys::{load_first, rocm_library_candidates, symbol};
use collective_core::Error;
use core::ffi::{c_char, c_int, c_void};
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::OnceLock;

/// `hiprtcResult`.
pub type HiprtcResult = c_int;
/// `hiprtcProgram` (opaque).
pub type HiprtcProgram = *mut c_void;

/// `HIPRTC_SUCCESS`.
pub const HIPRTC_SUCCESS: HiprtcResult = 0;

/// The function table. Field names are the C symbols.
#[allow(non_snake_case, missing_docs)]
#[derive(Debug)]
pub struct RtcApi {
    /// `(prog, src, name, numHeaders, headers, includeNames)`.
    #[allow(clippy::type_complexity)]
    pub hiprtcCreateProgram: unsafe extern "C" fn(
        *mut HiprtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> HiprtcResult,
    /// `(prog, numOptions, options)`.
    pub hiprtcCompileProgram: unsafe extern "C" fn(HiprtcProgram, c_int, *const *const c_char) -> HiprtcResult,
    pub hiprtcGetProgramLogSize: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    pub hiprtcGetProgramLog: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    pub hiprtcGetCodeSize: unsafe extern "C" fn(HiprtcProgram, *mut usize) -> HiprtcResult,
    pub hiprtcGetCode: unsafe extern "C" fn(HiprtcProgram, *mut c_char) -> HiprtcResult,
    pub hiprtcDestroyProgram: unsafe extern "C" fn(*mut HiprtcProgram) -> HiprtcResult,
    pub hiprtcGetErrorString: unsafe extern "C" fn(HiprtcResult) -> *const c_char,
    /// Keeps the library mapped while the pointers above are in use (for the process).
    _lib: libloading::Library,
}

/// Library names tried in order, then the same names under `$ROCM_PATH/lib` (default
/// `/opt/rocm/lib`).
pub const LIBRARY_NAMES: [&str; 3] = ["libhiprtc.so", "libhiprtc.so.7", "libhiprtc.so.6"];

/// The library as named in [`Error::LibraryMissing`].
pub const LIBRARY: &str = "libhiprtc (HIP runtime compiler)";

/// Every path [`RtcApi::load`] tries.
pub fn library_candidates() -> Vec<PathBuf> {
    rocm_library_candidates(&LIBRARY_NAMES)
}

impl RtcApi {
    /// Loads the first library of [`library_candidates`] and resolves every symbol.
    pub fn load() -> Result<RtcApi, String> {
        Self::load_from(&library_candidates())
    }

    /// Loads the first of `candidates` that loads and resolves every symbol from it; the error
    /// lists what was tried (or the symbol the library lacks).
    pub fn load_from(candidates: &[PathBuf]) -> Result<RtcApi, String> {
        load_first(candidates, Self::resolve)
    }

    fn resolve(lib: libloading::Library) -> Result<RtcApi, String> {
        // Each field is the symbol of its own name.
        macro_rules! table {
            ($($field:ident),+) => {
                RtcApi { $($field: symbol(&lib, stringify!($field))?,)+ _lib: lib }
            };
        }
        Ok(table!(
            hiprtcCreateProgram,
            hiprtcCompileProgram,
            hiprtcGetProgramLogSize,
            hiprtcGetProgramLog,
            hiprtcGetCodeSize,
            hiprtcGetCode,
            hiprtcDestroyProgram,
            hiprtcGetErrorString
        ))
    }
}

/// [`Error::LibraryMissing`] for hiprtc, with what was tried.
pub fn missing(tried: &str) -> Error {
    Error::LibraryMissing {
        library: LIBRARY.into(),
        detail: format!("{tried}; install ROCm 6+ (its hiprtc) or set ROCM_PATH / LD_LIBRARY_PATH"),
    }
}

/// The loaded hiprtc, or why it could not be loaded (remembered: loading is tried once per
/// process, and a library appearing later is not picked up).
pub fn rtc() -> Result<&'static RtcApi, Error> {
    static RTC: OnceLock<Result<RtcApi, String>> = OnceLock::new();
    RTC.get_or_init(RtcApi::load).as_ref().map_err(|tried| missing(tried))
}

/// Whether hiprtc can be loaded (never panics).
pub fn rtc_present() -> bool {
    rtc().is_ok()
}

/// `hiprtcGetErrorString(code)`, or the number when the library has no text for it.
pub fn error_string(api: &RtcApi, code: HiprtcResult) -> String {
    // SAFETY: hiprtcGetErrorString returns a static NUL-terminated string or null.
    unsafe { describe((api.hiprtcGetErrorString)(code), code, "hiprtcResult") }
}

fn check(api: &RtcApi, code: HiprtcResult, what: &str) -> Result<(), String> {
    if code == HIPRTC_SUCCESS { Ok(()) } else { Err(format!("{what}: {}", error_string(api, code))) }
}

/// A program, destroyed on every path.
struct Program<'a> {
    api: &'a RtcApi,
    raw: HiprtcProgram,
}

impl Drop for Program<'_> {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: created by hiprtcCreateProgram, destroyed once (here).
            let _ = unsafe { (self.api.hiprtcDestroyProgram)(&mut self.raw) };
        }
    }
}

impl Program<'_> {
    /// The compile log, empty when there is none or it cannot be read.
    fn log(&self) -> String {
        let mut size = 0usize;
        // SAFETY: valid program, out-pointer to a local.
        if unsafe { (self.api.hiprtcGetProgramLogSize)(self.raw, &mut size) } != HIPRTC_SUCCESS {
            return String::new();
        }
        let mut buf = vec![0u8; size.max(1)];
        // SAFETY: `buf` holds the size hiprtc reported (which counts the trailing NUL).
        if unsafe { (self.api.hiprtcGetProgramLog)(self.raw, buf.as_mut_ptr().cast()) } != HIPRTC_SUCCESS {
            return String::new();
        }
        let end = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    }
}

/// The most of a program log an error carries (the first errors are the useful ones).
pub const MAX_LOG_BYTES: usize = 16 * 1024;

/// `log` cut to at most `max` bytes (on a character boundary), saying how much was left out.
pub fn truncate_log(log: &str, max: usize) -> String {
    if log.len() <= max {
        return log.to_string();
    }
    let mut end = max;
    while !log.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n... ({} more bytes of log)", &log[..end], log.len() - end)
}

/// What to compile: the entry file and the headers it includes, each `(include name, text)`.
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    /// The entry's name (shown in the log).
    pub name: &'a str,
    pub text: &'a str,
    pub headers: &'a [(&'a str, &'a str)],
}

fn c_string(s: &str, what: &str) -> Result<CString, String> {
    CString::new(s).map_err(|_| format!("NUL byte in {what}"))
}

/// Compiles `src` with `options` and returns the code object (for `hipModuleLoadData`).
///
/// The error is the detail of an [`Error::Backend`]: the failing call, or for a failed compile
/// the program log (at most [`MAX_LOG_BYTES`] of it).
pub fn compile(api: &RtcApi, src: &Source<'_>, options: &[String]) -> Result<Vec<u8>, String> {
    let text = c_string(src.text, src.name)?;
    let name = c_string(src.name, "the source name")?;
    let headers = src.headers.iter().map(|(n, t)| c_string(t, n)).collect::<Result<Vec<_>, _>>()?;
    let include_names = src.headers.iter().map(|(n, _)| c_string(n, "a header name")).collect::<Result<Vec<_>, _>>()?;
    let opts = options.iter().map(|o| c_string(o, "an option")).collect::<Result<Vec<_>, _>>()?;
    let ptrs = |v: &[CString]| v.iter().map(|c| c.as_ptr()).collect::<Vec<*const c_char>>();
    let (header_ptrs, include_ptrs, opt_ptrs) = (ptrs(&headers), ptrs(&include_names), ptrs(&opts));
    let mut prog = Program { api, raw: core::ptr::null_mut() };
    // SAFETY: every string is NUL-terminated and outlives the call; the header and include-name
    // arrays both hold `header_ptrs.len()` pointers.
    let r = unsafe {
        (api.hiprtcCreateProgram)(
            &mut prog.raw,
            text.as_ptr(),
            name.as_ptr(),
            header_ptrs.len() as c_int,
            header_ptrs.as_ptr(),
            include_ptrs.as_ptr(),
        )
    };
    check(api, r, "hiprtcCreateProgram")?;
    // SAFETY: a valid program; `opt_ptrs` holds `len` NUL-terminated strings alive for the call.
    let r = unsafe { (api.hiprtcCompileProgram)(prog.raw, opt_ptrs.len() as c_int, opt_ptrs.as_ptr()) };
    if r != HIPRTC_SUCCESS {
        return Err(format!(
            "hiprtc failed to compile {} with {options:?} ({}):\n{}",
            src.name,
            error_string(api, r),
            truncate_log(&prog.log(), MAX_LOG_BYTES)
        ));
    }
    let mut size = 0usize;
    // SAFETY: a compiled program; out-pointer to a local.
    check(api, unsafe { (api.hiprtcGetCodeSize)(prog.raw, &mut size) }, "hiprtcGetCodeSize")?;
    if size == 0 {
        return Err(format!("hiprtc produced no code for {}", src.name));
    }
    let mut code = vec![0u8; size];
    // SAFETY: `code` holds the size hiprtc reported.
    check(api, unsafe { (api.hiprtcGetCode)(prog.raw, code.as_mut_ptr().cast()) }, "hiprtcGetCode")?;
    Ok(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_cover_the_sonames_and_rocm_path() {
        let c = library_candidates();
        assert_eq!(c.len(), 2 * LIBRARY_NAMES.len());
        for n in LIBRARY_NAMES {
            assert!(c.iter().any(|p| p.as_os_str() == n), "{n} by the loader's search");
            assert!(c.iter().any(|p| p.ends_with(format!("lib/{n}"))), "{n} under $ROCM_PATH/lib");
        }
    }

    #[test]
    fn missing_library_is_library_missing_not_a_panic() {
        let tried = RtcApi::load_from(&[PathBuf::from("/nonexistent/detcoll/libhiprtc.so")]).unwrap_err();
        assert!(tried.contains("/nonexistent/detcoll/libhiprtc.so"), "{tried}");
        let Error::LibraryMissing { library, detail } = missing(&tried) else { panic!("not LibraryMissing") };
        assert!(library.contains("libhiprtc") && detail.contains("ROCM_PATH"), "{library}: {detail}");
        assert!(RtcApi::load_from(&[]).is_err());
        if rtc_present() {
            collective_core::conformance::skip("libhiprtc is present");
        } else {
            assert!(matches!(rtc(), Err(Error::LibraryMissing { .. })));
        }
    }

    #[test]
    fn a_library_without_the_symbols_is_an_error_not_a_panic() {
        // libc loads everywhere and has none of hiprtc's symbols.
        match RtcApi::load_from(&[PathBuf::from("libc.so.6")]) {
            Err(e) => assert!(e.contains("hiprtcCreateProgram"), "{e}"),
            Ok(_) => panic!("libc resolved as hiprtc"),
        }
    }

    #[test]
    fn logs_are_truncated_on_a_character_boundary() {
        assert_eq!(truncate_log("short", 10), "short");
        let t = truncate_log("ééééé", 3);
        assert!(t.starts_with('é') && !t.starts_with("éé"), "{t}");
        assert!(t.ends_with("(8 more bytes of log)"), "{t}");
    }
}
