//! The device code of detcoll, as a crate.
//!
//! The `.cu` / `.hip` entry files and the portable headers live next to this crate's manifest
//! (the top-level `kernels/` folder), so they travel with the package: cuda-ipc and hip-ipc
//! embed them from here instead of reaching outside their own crate, and a published build
//! compiles them at run time (NVRTC / hiprtc) without this repository.
//!
//! Prebuilt images (`cargo xtask build --arch ...`) are looked up at run time in
//! [`prebuilt_dirs`]: `$DETCOLL_KERNEL_DIR`, then the running executable's directory and its
//! `kernels/` subdirectory. No build-machine path is ever baked in.
#![forbid(unsafe_code)]

use std::fmt;
use std::path::{Path, PathBuf};

/// The portable tree header (`detcoll_tree.h`): tree shape, IEEE adds, vector and flag helpers.
pub const TREE_HEADER: &str = include_str!("../detcoll_tree.h");
/// The portable kernel bodies (`detcoll_protocol.h`): parameter structs (the ABI), the
/// one-launch collective, the fused tree and the copy.
pub const PROTOCOL_HEADER: &str = include_str!("../detcoll_protocol.h");
/// The residual add + RMSNorm kernel body (`detcoll_norm.h`): the step after an all_reduce,
/// whose bits `fixed_tree::residual_rmsnorm` defines.
pub const NORM_HEADER: &str = include_str!("../detcoll_norm.h");
/// The CUDA entry file (`detcoll_cuda.cu`).
pub const CUDA_ENTRY: &str = include_str!("../detcoll_cuda.cu");
/// The HIP entry file (`detcoll_hip.hip`).
pub const HIP_ENTRY: &str = include_str!("../detcoll_hip.hip");

/// The headers both entry files `#include`, by the names they use: what an RTC compiler is
/// given as in-memory headers.
pub const HEADERS: [(&str, &str); 3] =
    [("detcoll_tree.h", TREE_HEADER), ("detcoll_protocol.h", PROTOCOL_HEADER), ("detcoll_norm.h", NORM_HEADER)];

/// `DC_ABI_VERSION` of `detcoll_protocol.h`: the layout version of the parameter structs and
/// of the control blocks. Every loaded module exports it in its `detcoll_abi` table; the host
/// refuses a module with another value. Duplicated here (a `const` cannot parse the header);
/// a unit test keeps the two equal.
pub const ABI_VERSION: u32 = 12;

/// The environment variable naming a folder of prebuilt kernel images.
pub const KERNEL_DIR_ENV: &str = "DETCOLL_KERNEL_DIR";

/// The kernel source folder of this crate (the entry files and headers), for offline compile
/// drivers (`cargo xtask build`, compile tests). Resolved at compile time, so it is only
/// meaningful on the machine that built the crate: run-time code uses the embedded constants.
pub fn source_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Why the prebuilt-image search directories could not be determined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SearchError {
    /// `$DETCOLL_KERNEL_DIR` is set but does not name an existing directory. A typo there would
    /// otherwise silently fall back to run-time compilation (or to other images).
    NotADirectory {
        /// The variable ([`KERNEL_DIR_ENV`]).
        var: &'static str,
        /// Its value.
        value: PathBuf,
    },
}

impl fmt::Display for SearchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SearchError::NotADirectory { var, value } => {
                write!(f, "{var}={} is not an existing directory", value.display())
            }
        }
    }
}

impl std::error::Error for SearchError {}

/// Where prebuilt kernel images are looked up, in order (first match wins):
///
/// 1. `$DETCOLL_KERNEL_DIR` when set (it must be an existing directory, else
///    [`SearchError::NotADirectory`]);
/// 2. the directory of the running executable ([`std::env::current_exe`]), and
/// 3. its `kernels/` subdirectory (how a deployment ships images next to the binary).
///
/// Folders that do not exist are left out of 2 and 3.
pub fn prebuilt_dirs() -> Result<Vec<PathBuf>, SearchError> {
    dirs_from(std::env::var_os(KERNEL_DIR_ENV).map(PathBuf::from), std::env::current_exe().ok())
}

/// [`prebuilt_dirs`] for a given variable value and executable path (testable without
/// touching the process environment).
fn dirs_from(env_dir: Option<PathBuf>, exe: Option<PathBuf>) -> Result<Vec<PathBuf>, SearchError> {
    let mut v = Vec::new();
    if let Some(d) = env_dir {
        if !d.is_dir() {
            return Err(SearchError::NotADirectory { var: KERNEL_DIR_ENV, value: d });
        }
        v.push(d);
    }
    if let Some(exe_dir) = exe.as_deref().and_then(Path::parent) {
        for d in [exe_dir.to_path_buf(), exe_dir.join("kernels")] {
            if d.is_dir() && !v.contains(&d) {
                v.push(d);
            }
        }
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of `#define name <digits>[u]` in `text`.
    fn define(text: &str, name: &str) -> Option<u32> {
        text.lines().find_map(|l| {
            let rest = l.trim().strip_prefix("#define")?.trim_start().strip_prefix(name)?;
            rest.trim().trim_end_matches(['u', 'U']).parse().ok()
        })
    }

    #[test]
    fn abi_version_matches_the_header() {
        assert_eq!(define(PROTOCOL_HEADER, "DC_ABI_VERSION"), Some(ABI_VERSION));
    }

    #[test]
    fn entries_include_the_headers_by_their_names() {
        for entry in [CUDA_ENTRY, HIP_ENTRY] {
            for (name, text) in HEADERS {
                assert!(!text.is_empty());
                assert!(entry.contains(name) || PROTOCOL_HEADER.contains(name), "{name} is not included");
            }
        }
        assert!(source_dir().join("detcoll_protocol.h").is_file());
        for (name, _) in HEADERS {
            assert!(source_dir().join(name).is_file(), "{name} is not in the kernel source folder");
        }
        for entry in [CUDA_ENTRY, HIP_ENTRY] {
            assert!(entry.contains("#include \"detcoll_norm.h\"") && entry.contains("detcoll_residual_rmsnorm"));
        }
    }

    #[test]
    fn kernel_dir_must_exist() {
        let missing = std::env::temp_dir().join("detcoll-kernels-no-such-dir-3f1c");
        let e = dirs_from(Some(missing.clone()), None).unwrap_err();
        assert_eq!(e, SearchError::NotADirectory { var: KERNEL_DIR_ENV, value: missing });
        assert!(e.to_string().contains("DETCOLL_KERNEL_DIR"));
    }

    #[test]
    fn env_dir_first_then_the_executable() {
        let tmp = std::env::temp_dir();
        let exe_dir = tmp.join(format!("detcoll-kernels-test-{}", std::process::id()));
        std::fs::create_dir_all(exe_dir.join("kernels")).unwrap();
        let dirs = dirs_from(Some(tmp.clone()), Some(exe_dir.join("app"))).unwrap();
        assert_eq!(dirs, vec![tmp, exe_dir.clone(), exe_dir.join("kernels")]);
        // Without the variable, only existing folders next to the executable.
        std::fs::remove_dir(exe_dir.join("kernels")).unwrap();
        assert_eq!(dirs_from(None, Some(exe_dir.join("app"))).unwrap(), vec![exe_dir.clone()]);
        std::fs::remove_dir(&exe_dir).unwrap();
        assert!(dirs_from(None, Some(exe_dir.join("app"))).unwrap().is_empty());
        assert!(dirs_from(None, None).unwrap().is_empty());
    }
}
