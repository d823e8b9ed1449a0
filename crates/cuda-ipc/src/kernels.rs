//! Getting the device code: a prebuilt cubin/PTX when one is present, otherwise the embedded
//! source compiled with NVRTC (loaded at run time), once per process, GPU architecture and
//! world size.
//!
//! A run-time compilation builds only the world size it is asked for ([`Worlds::for_world`]:
//! that world and world 1, `-DDC_WORLDS=<mask>`): every world is its own unrolled
//! instantiation of every reduction body, so compiling all eight costs about eight times one
//! (issue 27 measured 433 s against 118 s for the test's five images once worlds 3/5/6/7
//! existed). A prebuilt image carries every world ([`Worlds::ALL`]).
//!
//! Prebuilt images are looked up in [`detcoll_kernels::prebuilt_dirs`] (`$DETCOLL_KERNEL_DIR`,
//! then the running executable's directory and its `kernels/` subdirectory), as
//! `detcoll_cuda.<sm_XY>.cubin`, `detcoll_cuda.<sm_XY>.ptx`, then `detcoll_cuda.ptx` (what
//! `cargo xtask build --arch sm_XY` writes into `kernels/build/`). Every loaded
//! module is checked against the `detcoll_abi` table the kernels export (ABI version and the
//! sizes of the parameter structs), so a stale prebuilt image is refused with an error instead
//! of being misread; the table's last word is the image's world set, so a prebuilt image built
//! for some worlds only (`-DDC_WORLDS=...`) is used only for those, and NVRTC builds the others.
use crate::driver::{self, BACKEND, check};
use crate::launch::ABI_VERSION;
use crate::programmatic::Programmatic;
use collective_core::Error;
use cudarc::driver::{CudaContext, sys};
use cudarc::nvrtc::sys as nvrtc;
use detcoll_protocol::params::{ABI_WORDS, EVERY_WORLD};
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

const _: () = assert!(ABI_VERSION == detcoll_kernels::ABI_VERSION, "host and kernel ABI versions differ");

/// The CUDA entry file, embedded (from the `detcoll-kernels` crate).
pub const KERNEL_SOURCE: &str = detcoll_kernels::CUDA_ENTRY;
/// The portable tree header the entry file includes, embedded (passed to NVRTC as a header).
pub const TREE_HEADER: &str = detcoll_kernels::TREE_HEADER;
/// The portable kernel bodies (protocol, fused tree, copy) shared with the HIP entry, embedded
/// (passed to NVRTC as a header).
pub const PROTOCOL_HEADER: &str = detcoll_kernels::PROTOCOL_HEADER;
/// The residual add + RMSNorm kernel body shared with the HIP entry, embedded (passed to NVRTC
/// as a header).
pub const NORM_HEADER: &str = detcoll_kernels::NORM_HEADER;

/// NVRTC flags. The adds are explicit `.rn` PTX without `.ftz`, so these are a second line of
/// defence: no flush to zero, no contraction into FMA, IEEE division and square root. Line
/// information (no effect on the code) lets compute-sanitizer and profilers name source lines.
pub const NVRTC_FLAGS: [&str; 6] =
    ["--ftz=false", "--prec-div=true", "--prec-sqrt=true", "--fmad=false", "--std=c++17", "--generate-line-info"];

/// The world sizes one image instantiates: bit `w` for world `w` (`DC_WORLDS` in
/// `kernels/detcoll_protocol.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Worlds(u16);

impl Worlds {
    /// Every world 1..=8 (prebuilt images, the header's default).
    pub const ALL: Worlds = Worlds(EVERY_WORLD);

    /// What a process launching collectives of `world` ranks needs: that world, and world 1
    /// (the tree and reduction of one input are trivial and cost nothing to build). `world`
    /// outside 1..=8 is [`Error::UnsupportedWorldSize`].
    pub fn for_world(world: usize) -> Result<Worlds, Error> {
        collective_core::check_node_world_size(world)?;
        Ok(Worlds((1 << 1) | (1 << world)))
    }

    /// Whether an image of these worlds can run a launch of `world` ranks.
    pub fn has(self, world: usize) -> bool {
        world < 16 && (self.0 >> world) & 1 == 1
    }

    /// Whether an image of these worlds has every world of `other`.
    pub fn contains(self, other: Worlds) -> bool {
        self.0 & other.0 == other.0
    }

    /// The `DC_WORLDS` mask.
    pub fn mask(self) -> u16 {
        self.0
    }
}

/// Which module of the entry file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// The collectives, the fused tree, the empty kernel, the copy and the residual + RMSNorm.
    Main,
    /// Only the software-arithmetic fused tree (`-DDETCOLL_SOFT_MODULE`), built on demand.
    Soft,
}

impl Variant {
    fn stem(self) -> &'static str {
        match self {
            Variant::Main => "detcoll_cuda",
            Variant::Soft => "detcoll_cuda_soft",
        }
    }
}

/// What NVRTC should produce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageKind {
    /// Machine code for exactly this architecture (`--gpu-architecture=sm_XY`).
    Cubin,
    /// PTX for `compute_XY` (JIT-compiled by the driver at load).
    Ptx,
}

fn nvrtc_missing(detail: String) -> Error {
    Error::LibraryMissing { library: "libnvrtc.so (CUDA runtime compiler)".into(), detail }
}

/// Loads `path` (a libnvrtc shared object) and keeps it loaded, so that cudarc's later
/// `dlopen("libnvrtc.so.<major>")` finds it by soname. For NVRTC from a pip wheel
/// (`nvidia-cuda-nvrtc`) or a toolkit outside the loader's search path.
pub fn load_nvrtc_from(path: &Path) -> Result<(), Error> {
    // SAFETY: loading NVRTC runs only its (trivial) initialisers.
    match unsafe { libloading::Library::new(path) } {
        Ok(lib) => {
            // Kept for the life of the process: cudarc resolves symbols from it lazily.
            std::mem::forget(lib);
            Ok(())
        }
        Err(e) => Err(nvrtc_missing(format!("{}: {e}", path.display()))),
    }
}

/// Candidate NVRTC libraries outside the loader's default search path.
fn nvrtc_candidates() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(p) = std::env::var_os("DETCOLL_NVRTC") {
        let p = PathBuf::from(p);
        if p.is_file() {
            return vec![p];
        }
        dirs.push(p);
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        // Only an absolute root: an empty or relative one would find `lib64/` relative to the
        // working directory.
        if let Some(p) = std::env::var_os(var).filter(|p| Path::new(p).is_absolute()) {
            dirs.push(PathBuf::from(&p).join("lib64"));
            dirs.push(PathBuf::from(p).join("lib"));
        }
    }
    dirs.push("/usr/local/cuda/lib64".into());
    dirs.push("/usr/local/cuda/targets/x86_64-linux/lib".into());
    let mut out = Vec::new();
    for d in dirs {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        let mut found: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("libnvrtc.so.") && !n.contains("builtins"))
            })
            .collect();
        found.sort();
        out.extend(found);
    }
    out
}

/// `Ok` when NVRTC can be used, after trying the loader's path and then the candidates above
/// (`$DETCOLL_NVRTC`, `$CUDA_HOME`, `/usr/local/cuda`).
pub fn ensure_nvrtc() -> Result<(), Error> {
    // Only success is remembered: a library loaded later (`load_nvrtc_from`) is still found.
    static FOUND: AtomicBool = AtomicBool::new(false);
    if FOUND.load(Ordering::Acquire) {
        return Ok(());
    }
    // cudarc's own probe (`is_culib_present`) exists only under its `dynamic-loading`; this one
    // also works when the application links NVRTC (`dynamic-linking`).
    let present = || driver::loadable(&["nvrtc"]);
    if present() {
        FOUND.store(true, Ordering::Release);
        return Ok(());
    }
    let candidates = nvrtc_candidates();
    for c in &candidates {
        if load_nvrtc_from(c).is_ok() && present() {
            FOUND.store(true, Ordering::Release);
            return Ok(());
        }
    }
    Err(nvrtc_missing(format!(
        "not found by the dynamic loader nor at {candidates:?}; set DETCOLL_NVRTC to the library, \
         LD_LIBRARY_PATH, or provide prebuilt kernels in DETCOLL_KERNEL_DIR"
    )))
}

fn nvrtc_err(what: &str, r: nvrtc::nvrtcResult) -> Error {
    Error::Backend { backend: BACKEND, detail: format!("NVRTC {what}: {r:?}") }
}

fn nvrtc_check(r: nvrtc::nvrtcResult, what: &str) -> Result<(), Error> {
    if r == nvrtc::nvrtcResult::NVRTC_SUCCESS { Ok(()) } else { Err(nvrtc_err(what, r)) }
}

/// Destroys an NVRTC program on every path.
struct Program(nvrtc::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by nvrtcCreateProgram, destroyed once.
        let _ = unsafe { nvrtc::nvrtcDestroyProgram(&mut self.0) };
    }
}

fn c_string(s: &str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::Backend { backend: BACKEND, detail: "NUL byte in kernel source".into() })
}

/// Compiles the embedded main module for `arch` (`"sm_90"`, `"sm_100"`, ...) with NVRTC, every
/// world size (what `cargo xtask build` ships).
///
/// PTX images keep their trailing NUL, as `cuModuleLoadData` expects.
pub fn compile(arch: &str, kind: ImageKind) -> Result<Vec<u8>, Error> {
    compile_variant(arch, kind, Variant::Main)
}

/// Compiles one [`Variant`] of the embedded kernels for `arch` with NVRTC, every world size.
pub fn compile_variant(arch: &str, kind: ImageKind, variant: Variant) -> Result<Vec<u8>, Error> {
    compile_worlds(arch, kind, variant, Worlds::ALL)
}

/// Compiles one [`Variant`] of the embedded kernels for `arch` with NVRTC, instantiating only
/// `worlds`.
pub fn compile_worlds(arch: &str, kind: ImageKind, variant: Variant, worlds: Worlds) -> Result<Vec<u8>, Error> {
    ensure_nvrtc()?;
    let src = c_string(KERNEL_SOURCE)?;
    // Every header the entry file includes, by the name it includes it by.
    let headers = detcoll_kernels::HEADERS.iter().map(|(_, text)| c_string(text)).collect::<Result<Vec<_>, _>>()?;
    let header_names =
        detcoll_kernels::HEADERS.iter().map(|(name, _)| c_string(name)).collect::<Result<Vec<_>, _>>()?;
    let header_ptrs: Vec<*const core::ffi::c_char> = headers.iter().map(|h| h.as_ptr()).collect();
    let header_name_ptrs: Vec<*const core::ffi::c_char> = header_names.iter().map(|h| h.as_ptr()).collect();
    let name = c_string("detcoll_cuda.cu")?;
    let target = match kind {
        ImageKind::Cubin => arch.to_string(),
        ImageKind::Ptx => arch.replacen("sm_", "compute_", 1),
    };
    let mut opts: Vec<CString> = vec![c_string(&format!("--gpu-architecture={target}"))?];
    for f in NVRTC_FLAGS {
        opts.push(c_string(f)?);
    }
    if variant == Variant::Soft {
        opts.push(c_string("-DDETCOLL_SOFT_MODULE")?);
    }
    if worlds != Worlds::ALL {
        opts.push(c_string(&format!("-DDC_WORLDS={:#x}u", worlds.mask()))?);
    }
    let opt_ptrs: Vec<*const core::ffi::c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog = Program(core::ptr::null_mut());
    // SAFETY: all strings are NUL-terminated and outlive the calls; the header and name arrays
    // have the same length.
    let r = unsafe {
        nvrtc::nvrtcCreateProgram(
            &mut prog.0,
            src.as_ptr(),
            name.as_ptr(),
            header_ptrs.len() as i32,
            header_ptrs.as_ptr(),
            header_name_ptrs.as_ptr(),
        )
    };
    nvrtc_check(r, "nvrtcCreateProgram")?;
    // SAFETY: `prog` is a valid program; options are valid C strings.
    let r = unsafe { nvrtc::nvrtcCompileProgram(prog.0, opt_ptrs.len() as i32, opt_ptrs.as_ptr()) };
    if r != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        let log = program_log(&prog).unwrap_or_default();
        return Err(Error::Backend { backend: BACKEND, detail: format!("NVRTC failed for {target} ({r:?}):\n{log}") });
    }
    let mut size = 0usize;
    let mut out;
    match kind {
        ImageKind::Cubin => {
            // SAFETY: compiled program; out-pointer to a local.
            nvrtc_check(unsafe { nvrtc::nvrtcGetCUBINSize(prog.0, &mut size) }, "nvrtcGetCUBINSize")?;
            out = vec![0u8; size];
            // SAFETY: `out` has the size NVRTC reported.
            nvrtc_check(unsafe { nvrtc::nvrtcGetCUBIN(prog.0, out.as_mut_ptr().cast()) }, "nvrtcGetCUBIN")?;
        }
        ImageKind::Ptx => {
            // SAFETY: as above.
            nvrtc_check(unsafe { nvrtc::nvrtcGetPTXSize(prog.0, &mut size) }, "nvrtcGetPTXSize")?;
            out = vec![0u8; size];
            // SAFETY: as above (size includes the trailing NUL).
            nvrtc_check(unsafe { nvrtc::nvrtcGetPTX(prog.0, out.as_mut_ptr().cast()) }, "nvrtcGetPTX")?;
        }
    }
    Ok(out)
}

fn program_log(prog: &Program) -> Option<String> {
    let mut size = 0usize;
    // SAFETY: valid program, out-pointer to a local.
    if unsafe { nvrtc::nvrtcGetProgramLogSize(prog.0, &mut size) } != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return None;
    }
    let mut buf = vec![0u8; size.max(1)];
    // SAFETY: `buf` has the reported size.
    if unsafe { nvrtc::nvrtcGetProgramLog(prog.0, buf.as_mut_ptr().cast()) } != nvrtc::nvrtcResult::NVRTC_SUCCESS {
        return None;
    }
    Some(CStr::from_bytes_until_nul(&buf).map(|c| c.to_string_lossy().into_owned()).unwrap_or_default())
}

/// Directories searched for prebuilt images ([`detcoll_kernels::prebuilt_dirs`]); a
/// `$DETCOLL_KERNEL_DIR` that is not a directory is [`Error::InvalidConfig`].
pub fn prebuilt_dirs() -> Result<Vec<PathBuf>, Error> {
    detcoll_kernels::prebuilt_dirs().map_err(|e| Error::InvalidConfig { detail: e.to_string() })
}

/// A prebuilt image of `variant` for `arch`, if one exists: `(path, bytes)`; PTX gets a
/// trailing NUL.
fn prebuilt(arch: &str, variant: Variant) -> Result<Option<(PathBuf, Vec<u8>)>, Error> {
    let stem = variant.stem();
    for dir in prebuilt_dirs()? {
        for name in [format!("{stem}.{arch}.cubin"), format!("{stem}.{arch}.ptx"), format!("{stem}.ptx")] {
            let p = dir.join(&name);
            if let Ok(mut bytes) = std::fs::read(&p) {
                if name.ends_with(".ptx") && bytes.last() != Some(&0) {
                    bytes.push(0);
                }
                return Ok(Some((p, bytes)));
            }
        }
    }
    Ok(None)
}

/// The image of `variant` for `arch` and `worlds`: one compilation per process, variant,
/// architecture and world set.
fn image_for(arch: &str, variant: Variant, worlds: Worlds) -> Result<Arc<Vec<u8>>, Error> {
    type Images = HashMap<(String, Variant, Worlds), Arc<Vec<u8>>>;
    static CACHE: OnceLock<Mutex<Images>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    // Holding the lock while compiling makes concurrent first users wait for one compilation.
    let mut map =
        cache.lock().map_err(|_| Error::Backend { backend: BACKEND, detail: "kernel cache lock poisoned".into() })?;
    let key = (arch.to_string(), variant, worlds);
    if let Some(img) = map.get(&key) {
        return Ok(img.clone());
    }
    let img = Arc::new(compile_worlds(arch, ImageKind::Cubin, variant, worlds)?);
    map.insert(key, img.clone());
    Ok(img)
}

/// A loaded module, unloaded on drop.
#[derive(Debug)]
struct RawModule {
    ctx: Arc<CudaContext>,
    module: sys::CUmodule,
    /// Where the image came from (for logs and bench output).
    origin: String,
    /// The world sizes it instantiates.
    worlds: Worlds,
}

// SAFETY: module and function handles may be used from any thread of the process once the
// owning context is current there (every launch binds it first).
unsafe impl Send for RawModule {}
// SAFETY: as above; launching the same function concurrently from several threads is allowed.
unsafe impl Sync for RawModule {}

impl RawModule {
    /// Loads `variant` into `ctx` for `worlds`: a prebuilt image when present, falling back to
    /// NVRTC if the driver or the ABI check refuses it or it lacks one of `worlds` (its world set
    /// is in its ABI table); else NVRTC for `worlds`.
    fn load(ctx: &Arc<CudaContext>, variant: Variant, worlds: Worlds) -> Result<RawModule, Error> {
        driver::ensure_driver()?;
        let arch = driver::arch(ctx)?;
        let pre = prebuilt(&arch, variant)?;
        let nvrtc = |worlds: Worlds| format!("NVRTC {arch}, worlds {:#x}", worlds.mask());
        let first = match &pre {
            Some((p, bytes)) => Self::load_image(ctx, bytes, p.display().to_string()).and_then(|m| {
                if m.worlds.contains(worlds) {
                    Ok(m)
                } else {
                    Err(Error::Backend {
                        backend: BACKEND,
                        detail: format!(
                            "kernel image built for worlds {:#x}, without some of {:#x}",
                            m.worlds.mask(),
                            worlds.mask()
                        ),
                    })
                }
            }),
            None => Self::load_image(ctx, &image_for(&arch, variant, worlds)?, nvrtc(worlds)),
        };
        match first {
            Err(e) if pre.is_some() => {
                let origin = pre.map(|(p, _)| p.display().to_string()).unwrap_or_default();
                let Ok(img) = image_for(&arch, variant, worlds) else { return Err(e) };
                Self::load_image(ctx, &img, format!("{} (prebuilt {origin} refused: {e})", nvrtc(worlds)))
            }
            other => other,
        }
    }

    /// Loads `image` and checks its ABI table; the module's worlds are the table's.
    fn load_image(ctx: &Arc<CudaContext>, image: &[u8], origin: String) -> Result<RawModule, Error> {
        driver::bind(ctx)?;
        let mut module: sys::CUmodule = core::ptr::null_mut();
        // SAFETY: `image` is a cubin or a NUL-terminated PTX string, alive during the call.
        check(unsafe { sys::cuModuleLoadData(&mut module, image.as_ptr().cast()) }, "cuModuleLoadData")?;
        // Unloaded on drop if the check refuses it.
        let mut m = RawModule { ctx: ctx.clone(), module, origin, worlds: Worlds::ALL };
        m.worlds = m.check_abi()?;
        Ok(m)
    }

    fn function(&self, name: &str) -> Result<sys::CUfunction, Error> {
        let c = c_string(name)?;
        let mut f: sys::CUfunction = core::ptr::null_mut();
        // SAFETY: valid module, NUL-terminated name.
        let r = unsafe { sys::cuModuleGetFunction(&mut f, self.module, c.as_ptr()) };
        check(r, &format!("cuModuleGetFunction({name})"))?;
        // Load it now. Under lazy loading (the default since CUDA 12.2) a function is loaded at
        // its first launch, and loading may wait for the device to go idle: a rank launching
        // its first collective while a peer's kernel already spins waiting for it would then
        // deadlock until the timeout.
        if driver_version() >= 12040 {
            // SAFETY: a valid function handle of this module.
            check(unsafe { sys::cuFuncLoad(f) }, &format!("cuFuncLoad({name})"))?;
        }
        Ok(f)
    }

    /// Refuses an image built from another protocol/parameter layout; returns its world set.
    fn check_abi(&self) -> Result<Worlds, Error> {
        let name = c_string("detcoll_abi")?;
        let mut ptr: sys::CUdeviceptr = 0;
        let mut bytes = 0usize;
        // SAFETY: valid module; out-pointers to locals.
        let r = unsafe { sys::cuModuleGetGlobal_v2(&mut ptr, &mut bytes, self.module, name.as_ptr()) };
        check(r, "detcoll_abi lookup")?;
        let mut abi = [0u32; ABI_WORDS];
        if bytes != size_of_val(&abi) {
            return Err(abi_error(format!("detcoll_abi has {bytes} bytes")));
        }
        // SAFETY: `ptr` is a device global of exactly `bytes` bytes.
        check(unsafe { sys::cuMemcpyDtoH_v2(abi.as_mut_ptr().cast(), ptr, bytes) }, "reading detcoll_abi")?;
        detcoll_protocol::params::check_abi(&abi).map(Worlds).map_err(abi_error)
    }
}

impl Drop for RawModule {
    fn drop(&mut self) {
        if driver::bind(&self.ctx).is_ok() {
            // SAFETY: loaded by cuModuleLoadData; every user holds the module through an Arc,
            // and ranks synchronise their context at close.
            let _ = unsafe { sys::cuModuleUnload(self.module) };
        }
    }
}

/// The driver's CUDA version (e.g. 13000), 0 if unknown.
fn driver_version() -> i32 {
    let mut v = 0i32;
    // SAFETY: out-pointer to a local; the driver library is loaded (checked by the caller).
    let _ = unsafe { sys::cuDriverGetVersion(&mut v) };
    v
}

fn abi_error(detail: String) -> Error {
    Error::Backend { backend: BACKEND, detail: format!("kernel image does not match this crate's ABI: {detail}") }
}

/// The main kernels of one context.
#[derive(Debug)]
pub struct Module {
    raw: RawModule,
    pub(crate) collective_single: sys::CUfunction,
    pub(crate) collective_many: sys::CUfunction,
    pub(crate) tree: sys::CUfunction,
    pub(crate) noop: sys::CUfunction,
    pub(crate) copy: sys::CUfunction,
    /// The residual add + RMSNorm (`detcoll_residual_rmsnorm`, [`crate::norm`]): in every
    /// image, whatever its worlds.
    pub(crate) norm: sys::CUfunction,
    /// The fused all_reduce + residual + RMSNorm's last launch (`detcoll_collective_norm`):
    /// in every image.
    pub(crate) collective_norm: sys::CUfunction,
    /// Grid of the fused tree kernel: every SM full.
    pub(crate) tree_grid: u32,
    /// Programmatic dependent launches of the collective kernels, where the device, the driver
    /// and `DETCOLL_PDL` allow them.
    pub(crate) programmatic: Option<Programmatic>,
}

// SAFETY: see `RawModule`; function handles are plain driver handles.
unsafe impl Send for Module {}
// SAFETY: as above.
unsafe impl Sync for Module {}

impl Module {
    /// Loads the main kernels for `worlds` into `ctx` and checks their ABI (a prebuilt image
    /// brings every world).
    pub(crate) fn load(ctx: &Arc<CudaContext>, worlds: Worlds) -> Result<Arc<Module>, Error> {
        let raw = RawModule::load(ctx, Variant::Main, worlds)?;
        let tree = raw.function("detcoll_tree")?;
        let mut per_sm = 0i32;
        // SAFETY: valid function handle, out-pointer to a local.
        let r = unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(&mut per_sm, tree, crate::launch::THREADS as i32, 0)
        };
        check(r, "cuOccupancyMaxActiveBlocksPerMultiprocessor")?;
        Ok(Arc::new(Module {
            collective_single: raw.function("detcoll_collective_s")?,
            collective_many: raw.function("detcoll_collective_m")?,
            tree,
            noop: raw.function("detcoll_noop")?,
            copy: raw.function("detcoll_copy")?,
            norm: raw.function("detcoll_residual_rmsnorm")?,
            collective_norm: raw.function("detcoll_collective_norm")?,
            tree_grid: (driver::multiprocessors(ctx)? * per_sm.max(1) as usize) as u32,
            programmatic: Programmatic::probe(
                ctx.compute_capability().map_err(|e| driver::backend("cuDeviceGetAttribute", e))?.0,
                driver_version(),
            )?,
            raw,
        }))
    }

    /// Where the image came from.
    pub(crate) fn origin(&self) -> &str {
        &self.raw.origin
    }

    /// Whether it can run launches of `world` ranks.
    pub(crate) fn has_world(&self, world: usize) -> bool {
        self.raw.worlds.has(world)
    }
}

/// The software-arithmetic fused tree of one context (built on first use).
#[derive(Debug)]
pub(crate) struct SoftModule {
    #[allow(dead_code)]
    raw: RawModule,
    pub(crate) tree_soft: sys::CUfunction,
}

// SAFETY: see `RawModule`.
unsafe impl Send for SoftModule {}
// SAFETY: as above.
unsafe impl Sync for SoftModule {}

impl SoftModule {
    pub(crate) fn load(ctx: &Arc<CudaContext>) -> Result<Arc<SoftModule>, Error> {
        // Tests and parity checks only: every world in one image.
        let raw = RawModule::load(ctx, Variant::Soft, Worlds::ALL)?;
        Ok(Arc::new(SoftModule { tree_soft: raw.function("detcoll_tree_soft")?, raw }))
    }
}
