//! Loading the HIP kernels: the prebuilt code object for the device's `gfx` target.
//!
//! Looked up in `$DETCOLL_KERNEL_DIR`, then `kernels/build/` of this workspace, as
//! `detcoll_hip.<gfx>.co` (what `cargo xtask build --arch gfx942` writes). hiprtc is not bound:
//! an AMD host without a prebuilt object builds one with `cargo xtask build` (hipcc is part of
//! ROCm), which keeps this crate's binding to libamdhip64 alone. Every loaded module is checked
//! against its exported `detcoll_abi` table, so a stale object is refused instead of misread.
use crate::BACKEND;
use crate::result::{api, check};
use crate::runtime;
use crate::sys::{HipFunction, HipModule};
use collective_core::Error;
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// `DC_ABI_VERSION` of kernels/detcoll_protocol.h.
pub const ABI_VERSION: u32 = collective_core::protocol::params::ABI_VERSION;

/// Stem of the code objects: `detcoll_hip.<gfx>.co`.
pub const STEM: &str = "detcoll_hip";

/// Directories searched for code objects, in order.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(d) = std::env::var_os("DETCOLL_KERNEL_DIR") {
        v.push(PathBuf::from(d));
    }
    v.push(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels/build"));
    v
}

/// The code object for `gfx`, if one exists: `(path, bytes)`.
pub fn find_code_object(gfx: &str) -> Option<(PathBuf, Vec<u8>)> {
    search_dirs()
        .into_iter()
        .map(|d| d.join(format!("{STEM}.{gfx}.co")))
        .find_map(|p| std::fs::read(&p).ok().map(|b| (p, b)))
}

/// A loaded module; unloaded on drop.
#[derive(Debug)]
pub struct Module {
    raw: HipModule,
    /// Where the code object came from.
    pub origin: String,
}

// SAFETY: module handles may be used from any thread of the process.
unsafe impl Send for Module {}
// SAFETY: launching the same function from several threads is allowed.
unsafe impl Sync for Module {}

impl Module {
    /// Loads the code object for device `ordinal`'s arch and checks its ABI table; the expected
    /// table is `[ABI_VERSION, sizes of DcParams<16>, DcParams<32>, DcTreeParams, DcSeg,
    /// DcCopyParams]`.
    pub fn load(ordinal: usize, expected_abi: [u32; 6]) -> Result<Module, Error> {
        let gfx = runtime::arch_name(ordinal)?;
        let (path, image) = find_code_object(&gfx).ok_or_else(|| Error::Backend {
            backend: BACKEND,
            detail: format!(
                "no HIP code object for {gfx}: looked for {STEM}.{gfx}.co in {:?}; run `cargo xtask build --arch {gfx}`",
                search_dirs()
            ),
        })?;
        let api = api()?;
        runtime::set_device(ordinal)?;
        let mut raw: HipModule = core::ptr::null_mut();
        // SAFETY: `image` is a code object, alive during the call.
        check(api, unsafe { (api.hipModuleLoadData)(&mut raw, image.as_ptr().cast()) }, "hipModuleLoadData")?;
        let m = Module { raw, origin: path.display().to_string() };
        m.check_abi(expected_abi)?;
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

    fn check_abi(&self, want: [u32; 6]) -> Result<(), Error> {
        let api = api()?;
        let mut ptr = core::ptr::null_mut();
        let mut bytes = 0usize;
        // SAFETY: valid module; out-pointers to locals; the name is NUL-terminated.
        let r = unsafe { (api.hipModuleGetGlobal)(&mut ptr, &mut bytes, self.raw, c"detcoll_abi".as_ptr()) };
        check(api, r, "detcoll_abi lookup")?;
        let mut raw = [0u8; 24];
        if bytes != raw.len() {
            return Err(abi_error(format!("detcoll_abi has {bytes} bytes")));
        }
        runtime::copy_to_host(ptr as u64, &mut raw)?;
        let mut got = [0u32; 6];
        for (g, c) in got.iter_mut().zip(raw.chunks_exact(4)) {
            *g = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        }
        if got != want {
            return Err(abi_error(format!("kernels export {got:?}, this crate expects {want:?}")));
        }
        Ok(())
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
