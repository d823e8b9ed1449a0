//! Where the NCCL/RCCL library is looked for, and loading it once per process.
//!
//! Search order (first that opens and has every symbol wins):
//!
//! * `$DETCOLL_NCCL_LIBRARY` when set: exactly that file, nothing else — an explicit choice
//!   must not silently fall back to another library;
//! * NVIDIA: `libnccl.so.2`, `libnccl.so` (dynamic loader search path);
//! * ROCm: `librccl.so.1`, `librccl.so`, then the same names under `$ROCM_PATH/lib`
//!   (default `/opt/rocm/lib`), where ROCm installs them outside the default search path.
//!
//! The pure [`candidates`] function computes the list from explicit inputs, and
//! [`load_from`] tries an explicit list, so both are tested without touching the process
//! environment.
use crate::error::NcclError;
use crate::sys::{LoadError, NcclLibrary};
use std::ffi::OsStr;
use std::sync::{Arc, Mutex, OnceLock};

/// Environment variable naming the exact library to load.
pub const LIBRARY_ENV: &str = "DETCOLL_NCCL_LIBRARY";
/// Default ROCm installation prefix.
pub const DEFAULT_ROCM_PATH: &str = "/opt/rocm";

pub use detcoll_protocol::Vendor;

/// The candidate libraries for `vendor` (`None`: NVIDIA's, then ROCm's), given the values of
/// `$DETCOLL_NCCL_LIBRARY` and `$ROCM_PATH`.
pub fn candidates(vendor: Option<Vendor>, override_path: Option<&OsStr>, rocm_path: Option<&OsStr>) -> Vec<String> {
    if let Some(p) = override_path.filter(|p| !p.is_empty()) {
        return vec![p.to_string_lossy().into_owned()];
    }
    let mut out = Vec::new();
    if vendor != Some(Vendor::Amd) {
        out.extend(["libnccl.so.2", "libnccl.so"].map(String::from));
    }
    if vendor != Some(Vendor::Nvidia) {
        out.extend(["librccl.so.1", "librccl.so"].map(String::from));
        // Only an absolute root: an empty or relative one would find `lib/` relative to the
        // working directory.
        let root = rocm_path
            .filter(|p| std::path::Path::new(p).is_absolute())
            .map_or_else(|| DEFAULT_ROCM_PATH.into(), |p| p.to_string_lossy().into_owned());
        let lib = std::path::Path::new(&root).join("lib");
        for name in ["librccl.so.1", "librccl.so"] {
            out.push(lib.join(name).to_string_lossy().into_owned());
        }
    }
    out
}

/// [`candidates`] for `vendor` from this process's environment.
pub fn candidates_from_env(vendor: Option<Vendor>) -> Vec<String> {
    let over = std::env::var_os(LIBRARY_ENV);
    let rocm = std::env::var_os("ROCM_PATH");
    candidates(vendor, over.as_deref(), rocm.as_deref())
}

/// Opens the first candidate that loads with every symbol. Uncached. When none does, the
/// error lists every candidate and why it failed.
pub fn load_from(candidates: &[String]) -> Result<NcclLibrary, NcclError> {
    let mut why = Vec::new();
    for c in candidates {
        match NcclLibrary::open(c) {
            Ok(lib) => return Ok(lib),
            Err(LoadError { detail, .. }) => why.push(format!("{c}: {detail}")),
        }
    }
    Err(NcclError::LibraryMissing {
        library: "NCCL/RCCL (libnccl.so.2 or librccl.so.1)".into(),
        detail: if why.is_empty() {
            "no candidate library to try".into()
        } else {
            format!(
                "tried {}; install NCCL (NVIDIA) or RCCL (ROCm), add its directory to LD_LIBRARY_PATH, \
                 or set {LIBRARY_ENV} to the library file",
                why.join("; ")
            )
        },
    })
}

/// Loads the library for `vendor` from the environment's candidates, once per process and
/// candidate list (only successes are remembered, so a library installed later is found).
/// The library stays loaded for the life of the process: NCCL's helper threads must never see
/// it unloaded.
pub fn load(vendor: Option<Vendor>) -> Result<Arc<NcclLibrary>, NcclError> {
    load_cached(candidates_from_env(vendor))
}

/// Loads exactly `path` (cached like [`load`]).
pub fn load_path(path: &str) -> Result<Arc<NcclLibrary>, NcclError> {
    load_cached(vec![path.to_string()])
}

fn load_cached(list: Vec<String>) -> Result<Arc<NcclLibrary>, NcclError> {
    type Cache = Mutex<Vec<(Vec<String>, Arc<NcclLibrary>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(Vec::new()));
    // A poisoned cache only means another thread panicked while loading; the entries are valid.
    let mut entries = cache.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, lib)) = entries.iter().find(|(k, _)| *k == list) {
        return Ok(lib.clone());
    }
    let lib = Arc::new(load_from(&list)?);
    entries.push((list, lib.clone()));
    Ok(lib)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vendor_candidates_in_order() {
        assert_eq!(candidates(Some(Vendor::Nvidia), None, None), ["libnccl.so.2", "libnccl.so"]);
        assert_eq!(
            candidates(Some(Vendor::Amd), None, None),
            ["librccl.so.1", "librccl.so", "/opt/rocm/lib/librccl.so.1", "/opt/rocm/lib/librccl.so"]
        );
        let rocm = OsStr::new("/opt/rocm-7.0");
        let all = candidates(None, None, Some(rocm));
        assert_eq!(all[0], "libnccl.so.2");
        assert_eq!(all.last().map(String::as_str), Some("/opt/rocm-7.0/lib/librccl.so"));
    }

    #[test]
    fn an_empty_or_relative_rocm_path_is_ignored() {
        // Else `lib/librccl.so.1` would be found relative to the working directory.
        for root in ["", "relative/rocm"] {
            let list = candidates(Some(Vendor::Amd), None, Some(OsStr::new(root)));
            assert_eq!(list[2..], ["/opt/rocm/lib/librccl.so.1", "/opt/rocm/lib/librccl.so"], "{root:?}");
        }
    }

    #[test]
    fn override_is_the_only_candidate() {
        let p = OsStr::new("/custom/libnccl.so.2.28.3");
        assert_eq!(candidates(Some(Vendor::Nvidia), Some(p), None), ["/custom/libnccl.so.2.28.3"]);
        assert_eq!(candidates(Some(Vendor::Nvidia), Some(OsStr::new("")), None).len(), 2);
    }

    #[test]
    fn missing_library_is_a_typed_error_listing_what_was_tried() {
        let list = vec!["/nonexistent/libnccl.so.2".to_string(), "/nonexistent/librccl.so.1".to_string()];
        let e = load_from(&list).expect_err("nothing to load");
        let NcclError::LibraryMissing { detail, .. } = &e else { panic!("{e:?}") };
        assert!(
            detail.contains("/nonexistent/libnccl.so.2") && detail.contains("/nonexistent/librccl.so.1"),
            "{detail}"
        );
        assert!(matches!(collective_core::Error::from(e), collective_core::Error::LibraryMissing { .. }));
        assert!(matches!(load_from(&[]), Err(NcclError::LibraryMissing { .. })));
    }

    #[test]
    fn a_bad_override_does_not_fall_back() {
        let list = candidates(Some(Vendor::Nvidia), Some(OsStr::new("/nonexistent/libnccl.so")), None);
        assert!(matches!(load_path(&list[0]), Err(NcclError::LibraryMissing { .. })));
        assert!(matches!(load_from(&list), Err(NcclError::LibraryMissing { .. })));
    }

    #[test]
    fn a_file_the_loader_refuses_is_named_with_its_reason() {
        // libloading's own text is only "dlopen failed"; the loader's reason is its source.
        let path = std::env::temp_dir().join(format!("detcoll-empty-libnccl-{}.so", std::process::id()));
        std::fs::write(&path, b"").expect("write");
        let e = load_from(&[path.to_string_lossy().into_owned()]).expect_err("an empty file");
        let _ = std::fs::remove_file(&path);
        let NcclError::LibraryMissing { detail, .. } = &e else { panic!("{e:?}") };
        assert!(detail.contains("too short"), "{detail}");
    }
}
