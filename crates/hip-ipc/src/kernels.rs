//! Getting the HIP kernels for the device's `gfx` target: a prebuilt code object when one is
//! present, otherwise the embedded source compiled with hiprtc at run time.
//!
//! 1. Prebuilt: looked up in [`detcoll_kernels::prebuilt_dirs`] (`$DETCOLL_KERNEL_DIR`, then the
//!    running executable's directory and its `kernels/` subdirectory), as `detcoll_hip.<gfx>.co`
//!    (what `cargo xtask build --arch gfx942` writes into `kernels/build/`).
//! 2. Otherwise hiprtc ([`crate::rtc`], `libhiprtc` loaded at run time): the embedded
//!    kernels/detcoll_hip.hip and its headers, compiled for the device's gfx with the strict
//!    flags of the offline build ([`rtc_options`]), once per process and gfx.
//! 3. Neither: an error naming both remedies (`cargo xtask build --arch <gfx>`, or installing
//!    ROCm's hiprtc).
//!
//! Every loaded module is checked against its exported `detcoll_abi` table, so a stale object is
//! refused instead of misread. The hiprtc path was compiled and unit-tested without ROCm, never
//! executed (no AMD GPU was available).
use crate::BACKEND;
use crate::build::{HIP_FLAGS, is_gfx};
use crate::result::{api, check};
use crate::rtc::{self, Source};
use crate::runtime;
use crate::sys::{HipFunction, HipModule};
use collective_core::Error;
use detcoll_protocol::params::{ABI_WORDS, EVERY_WORLD};
use std::collections::HashMap;
use std::ffi::CString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

/// `DC_ABI_VERSION` of kernels/detcoll_protocol.h.
pub const ABI_VERSION: u32 = detcoll_protocol::params::ABI_VERSION;
const _: () = assert!(ABI_VERSION == detcoll_kernels::ABI_VERSION, "host and kernel ABI versions differ");

/// Stem of the code objects: `detcoll_hip.<gfx>.co`.
pub const STEM: &str = "detcoll_hip";

/// Directories searched for code objects, in order ([`detcoll_kernels::prebuilt_dirs`]); a
/// `$DETCOLL_KERNEL_DIR` that is not a directory is [`Error::InvalidConfig`].
pub fn search_dirs() -> Result<Vec<PathBuf>, Error> {
    detcoll_kernels::prebuilt_dirs().map_err(|e| Error::InvalidConfig { detail: e.to_string() })
}

/// The code object for `gfx`, if one exists: `(path, bytes)`.
pub fn find_code_object(gfx: &str) -> Result<Option<(PathBuf, Vec<u8>)>, Error> {
    Ok(search_dirs()?
        .into_iter()
        .map(|d| d.join(format!("{STEM}.{gfx}.co")))
        .find_map(|p| std::fs::read(&p).ok().map(|b| (p, b))))
}

/// The HIP entry file, embedded (compiled with hiprtc when no code object exists).
pub const KERNEL_SOURCE: &str = detcoll_kernels::HIP_ENTRY;
/// The portable tree header, embedded (passed to hiprtc as a header).
pub const TREE_HEADER: &str = detcoll_kernels::TREE_HEADER;
/// The portable kernel bodies (protocol, fused tree, copy), embedded (passed to hiprtc as a
/// header).
pub const PROTOCOL_HEADER: &str = detcoll_kernels::PROTOCOL_HEADER;
/// The residual add + RMSNorm kernel body, embedded (passed to hiprtc as a header).
pub const NORM_HEADER: &str = detcoll_kernels::NORM_HEADER;
/// The headers handed to hiprtc, by the names the sources `#include`.
pub const HEADERS: [(&str, &str); 3] = detcoll_kernels::HEADERS;
/// The entry's name in hiprtc's log.
pub const SOURCE_NAME: &str = "detcoll_hip.hip";

/// Flags of [`HIP_FLAGS`] that drive the offline clang (`-x hip`, device-only output, no HIP
/// headers or device libraries), not hiprtc, which compiles HIP device code with its own
/// headers pre-included.
pub const OFFLINE_ONLY_FLAGS: [&str; 5] = ["-x", "hip", "--offload-device-only", "-nogpulib", "-nogpuinc"];

/// The hiprtc options for `gfx`: `--offload-arch=<gfx>` and the strict flags of the offline
/// build (`-O3 -std=c++17 -fno-fast-math -fno-gpu-flush-denormals-to-zero -ffp-contract=off`,
/// [`HIP_FLAGS`] without [`OFFLINE_ONLY_FLAGS`]).
pub fn rtc_options(gfx: &str) -> Vec<String> {
    let mut v = vec![format!("--offload-arch={gfx}")];
    v.extend(HIP_FLAGS.iter().filter(|f| !OFFLINE_ONLY_FLAGS.contains(f)).map(|f| f.to_string()));
    v
}

/// Compiles the embedded kernels for `gfx` with hiprtc (uncached; see [`rtc_image`]). A missing
/// hiprtc is [`Error::LibraryMissing`]; a failed compile an [`Error::Backend`] carrying the log.
pub fn compile_rtc(gfx: &str) -> Result<Vec<u8>, Error> {
    let api = rtc::rtc()?;
    rtc_compile(api, gfx).map_err(|detail| Error::Backend { backend: BACKEND, detail })
}

fn rtc_compile(api: &rtc::RtcApi, gfx: &str) -> Result<Vec<u8>, String> {
    if !is_gfx(gfx) {
        return Err(format!("`{gfx}` is not a gfx target (expected e.g. gfx942)"));
    }
    let src = Source { name: SOURCE_NAME, text: KERNEL_SOURCE, headers: &HEADERS };
    rtc::compile(api, &src, &rtc_options(gfx))
}

/// The hiprtc code object for `gfx`: compiled once per process and gfx (a failed compile is
/// remembered too), the same image for every later load.
pub fn rtc_image(gfx: &str) -> Result<Arc<Vec<u8>>, Error> {
    type Images = HashMap<String, Result<Arc<Vec<u8>>, String>>;
    static CACHE: OnceLock<Mutex<Images>> = OnceLock::new();
    // A missing hiprtc is reported as such, never remembered as a failed compile.
    let api = rtc::rtc()?;
    // Holding the lock while compiling makes concurrent first users wait for one compilation.
    let mut map = CACHE
        .get_or_init(Default::default)
        .lock()
        .map_err(|_| Error::Backend { backend: BACKEND, detail: "hiprtc cache lock poisoned".into() })?;
    let image = map.entry(gfx.to_string()).or_insert_with(|| rtc_compile(api, gfx).map(Arc::new));
    image.clone().map_err(|detail| Error::Backend { backend: BACKEND, detail })
}

/// The code object for `gfx` and where it came from: prebuilt if present, else hiprtc.
fn image_for(gfx: &str) -> Result<(String, Arc<Vec<u8>>), Error> {
    if let Some((path, bytes)) = find_code_object(gfx)? {
        return Ok((path.display().to_string(), Arc::new(bytes)));
    }
    match rtc_image(gfx) {
        Ok(image) => Ok((format!("hiprtc ({gfx})"), image)),
        Err(Error::LibraryMissing { detail, .. }) => Err(Error::Backend {
            backend: BACKEND,
            detail: format!(
                "no HIP code object for {gfx}: looked for {STEM}.{gfx}.co in {:?}, and hiprtc could not be loaded to \
                 compile one ({detail}); run `cargo xtask build --arch {gfx}`, or install ROCm's hiprtc (libhiprtc.so)",
                search_dirs().unwrap_or_default()
            ),
        }),
        Err(e) => Err(e),
    }
}

/// A loaded module; unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: HipModule,
    /// Where the code object came from: its path, or `hiprtc (gfx942)`.
    pub origin: String,
}

// SAFETY: module handles may be used from any thread of the process.
unsafe impl Send for Module {}
// SAFETY: launching the same function from several threads is allowed.
unsafe impl Sync for Module {}

impl Module {
    /// Loads the code object for device `ordinal`'s arch (prebuilt, else compiled by hiprtc) and
    /// checks its ABI table (`detcoll_protocol::params::check_abi`: `[ABI_VERSION, sizes of
    /// DcParams<16>, DcParams<32>, DcTreeParams, DcSeg, DcCopyParams, DcNormParams, worlds]`):
    /// the one module of a device runs every world, so a code object of some worlds only is
    /// refused.
    pub fn load(ordinal: usize) -> Result<Module, Error> {
        let gfx = runtime::arch_name(ordinal)?;
        let (origin, image) = image_for(&gfx)?;
        let api = api()?;
        runtime::set_device(ordinal)?;
        let mut raw: HipModule = core::ptr::null_mut();
        // SAFETY: `image` is a code object, alive during the call.
        check(api, unsafe { (api.hipModuleLoadData)(&mut raw, image.as_ptr().cast()) }, "hipModuleLoadData")?;
        let m = Module { raw, origin };
        m.check_abi()?;
        Ok(m)
    }

    /// A kernel of the module.
    pub fn function(&self, name: &str) -> Result<HipFunction, Error> {
        let api = api()?;
        let c = CString::new(name).map_err(|_| Error::Backend { backend: BACKEND, detail: "NUL in name".into() })?;
        let mut f: HipFunction = core::ptr::null_mut();
        // SAFETY: valid module, NUL-terminated name.
        check(api, unsafe { (api.hipModuleGetFunction)(&mut f, self.raw, c.as_ptr()) }, name)?;
        Ok(f)
    }

    fn check_abi(&self) -> Result<(), Error> {
        let api = api()?;
        let mut ptr = core::ptr::null_mut();
        let mut bytes = 0usize;
        // SAFETY: valid module; out-pointers to locals; the name is NUL-terminated.
        let r = unsafe { (api.hipModuleGetGlobal)(&mut ptr, &mut bytes, self.raw, c"detcoll_abi".as_ptr()) };
        check(api, r, "detcoll_abi lookup")?;
        let mut raw = [0u8; 4 * ABI_WORDS];
        if bytes != raw.len() {
            return Err(abi_error(format!("detcoll_abi has {bytes} bytes")));
        }
        runtime::copy_to_host(ptr as u64, &mut raw)?;
        let mut got = [0u32; ABI_WORDS];
        for (g, c) in got.iter_mut().zip(raw.chunks_exact(4)) {
            *g = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        match detcoll_protocol::params::check_abi(&got).map_err(abi_error)? {
            EVERY_WORLD => Ok(()),
            worlds => Err(abi_error(format!(
                "built for worlds {worlds:#x}, not every world (the HIP backend loads one code object for all)"
            ))),
        }
    }
}

fn abi_error(detail: String) -> Error {
    Error::Backend { backend: BACKEND, detail: format!("HIP code object does not match this crate's ABI: {detail}") }
}

impl Drop for Module {
    fn drop(&mut self) {
        if let Ok(api) = api() {
            // SAFETY: loaded by hipModuleLoadData; users hold the module while launching.
            let _ = unsafe { (api.hipModuleUnload)(self.raw) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names a source `#include "..."`s.
    fn includes(src: &str) -> Vec<&str> {
        src.lines()
            .filter_map(|l| l.trim_start().strip_prefix("#include"))
            .filter_map(|rest| rest.trim().strip_prefix('"')?.split('"').next())
            .collect()
    }

    #[test]
    fn rtc_options_are_the_strict_offline_flags_for_the_arch() {
        let o = rtc_options("gfx942");
        assert_eq!(o[0], "--offload-arch=gfx942");
        for f in ["-O3", "-std=c++17", "-fno-fast-math", "-fno-gpu-flush-denormals-to-zero", "-ffp-contract=off"] {
            assert!(o.iter().any(|x| x == f), "{f} missing from {o:?}");
        }
        for f in ["-x", "hip", "-nogpuinc", "-nogpulib", "--offload-device-only", "-S", "-ffast-math"] {
            assert!(!o.iter().any(|x| x == f), "offline-only or lax flag {f} in {o:?}");
        }
        // Every flag of the offline build is either passed to hiprtc or an offline-driver flag.
        for f in HIP_FLAGS {
            assert!(o.iter().any(|x| x == f) ^ OFFLINE_ONLY_FLAGS.contains(&f), "{f}");
        }
        assert_eq!(rtc_options("gfx950")[0], "--offload-arch=gfx950");
        // Code object v5 for hiprtc too (ROCm before 6.3 refuses v6).
        assert!(o.iter().any(|x| x == "-mcode-object-version=5"), "{o:?}");
    }

    #[test]
    fn embedded_sources_and_header_names_match_the_includes() {
        assert!(KERNEL_SOURCE.contains("detcoll_collective_s") && KERNEL_SOURCE.contains("__HIPCC_RTC__"));
        for (name, text) in HEADERS {
            assert!(!text.is_empty(), "{name} empty");
        }
        let names: Vec<&str> = HEADERS.iter().map(|(n, _)| *n).collect();
        let entry = includes(KERNEL_SOURCE);
        assert!(!entry.is_empty());
        // Every include of the entry and of the headers is a header handed to hiprtc ...
        for (file, src) in std::iter::once((SOURCE_NAME, KERNEL_SOURCE)).chain(HEADERS) {
            for inc in includes(src) {
                assert!(names.contains(&inc), "{file} includes {inc}, which is not passed to hiprtc");
            }
        }
        // ... and the entry includes every header passed.
        for n in &names {
            assert!(entry.contains(n), "{n} is passed to hiprtc but not included by {SOURCE_NAME}");
        }
    }

    #[test]
    fn missing_hiprtc_is_library_missing_and_the_load_error_names_both_remedies() {
        if rtc::rtc_present() {
            collective_core::conformance::skip("libhiprtc is present");
            return;
        }
        assert!(matches!(compile_rtc("gfx942"), Err(Error::LibraryMissing { .. })));
        assert!(matches!(rtc_image("gfx942"), Err(Error::LibraryMissing { .. })));
        // No code object is ever built for this (valid, non-existent) target.
        match image_for("gfx9ff") {
            Err(Error::Backend { detail, .. }) => {
                assert!(detail.contains("cargo xtask build --arch gfx9ff"), "{detail}");
                assert!(detail.contains("install ROCm's hiprtc") && detail.contains("libhiprtc"), "{detail}");
            }
            other => panic!("expected a Backend error naming both remedies, got {other:?}"),
        }
    }
}
