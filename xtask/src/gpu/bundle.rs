//! `cargo xtask gpu-bundle`: builds the suites and binaries, copies them (stripped) with the
//! prebuilt kernels into one directory, and writes `run.sh` and `manifest.json`.
use super::BundleArgs;
use super::platform::{GpuPlatform, other_vendor_suite, suite_features};
use super::workspace::{GPU_PACKAGES, Suite, build_suites, cargo_executables, workspace_packages};
use crate::util::{which, workspace_root};
use anyhow::Context;
use detcoll_benches::harness::clock::{unix_now, utc_string};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Extra binaries bundled for the GPU host: (package, binary target, name in `bin/`).
const BUNDLED_BINARIES: &[(&str, &str, &str)] =
    &[("xtask", "xtask", "xtask"), ("detcoll-launch", "detcoll-run", "detcoll-run")];

/// Bundles above this size get a warning.
pub const BUNDLE_WARN_BYTES: u64 = 60 << 20;

/// Manifest schema version (2: `platform` added; a version-1 manifest is an NVIDIA bundle; 3:
/// `other_vendor_suites` added).
const MANIFEST_VERSION: u32 = 3;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct BundleFile {
    pub path: String,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    pub created_utc: String,
    pub git_commit: Option<String>,
    pub gpu_packages: Vec<String>,
    pub missing_packages: Vec<String>,
    pub suites: Vec<Suite>,
    pub files: Vec<BundleFile>,
    pub total_bytes: u64,
    pub stripped: bool,
    /// The vendor the suites were built for (absent from version-1 manifests: nvidia).
    #[serde(default)]
    pub platform: GpuPlatform,
    /// Suites built but left out because they are the other vendor's
    /// (`platform::other_vendor_suite`; absent before version 3).
    #[serde(default)]
    pub other_vendor_suites: Vec<String>,
}

fn git_commit(root: &Path) -> Option<String> {
    let out = Command::new("git").args(["rev-parse", "HEAD"]).current_dir(root).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn copy_dir(src: &Path, dst: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dst)?;
    for e in std::fs::read_dir(src)? {
        let e = e?;
        let to = dst.join(e.file_name());
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &to)?;
        } else {
            std::fs::copy(e.path(), &to).with_context(|| format!("copying {}", e.path().display()))?;
        }
    }
    Ok(())
}

fn list_files(dir: &Path, base: &Path, out: &mut Vec<BundleFile>) -> anyhow::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if e.file_type()?.is_dir() {
            list_files(&e.path(), base, out)?;
        } else {
            let rel = e.path().strip_prefix(base)?.to_string_lossy().into_owned();
            out.push(BundleFile { path: rel, bytes: e.metadata()?.len() });
        }
    }
    Ok(())
}

const RUN_SH: &str = r#"#!/bin/sh
# Runs the detcoll GPU suites of this bundle on a host without Rust:
#   ./run.sh [gpu-test options] [-- test-binary arguments]
# Options: --mps auto|on|off, --suite NAME (repeatable). The suites were built for the platform
# in manifest.json (nvidia or rocm). On nvidia, starts MPS (as root) around the suites
# that run several processes per GPU. Sets CUDA_DEVICE_MAX_CONNECTIONS per suite: 2 for
# processes under MPS (DETCOLL_MPS_CONNECTIONS overrides), else yours or 32. On rocm, sets
# GPU_MAX_HW_QUEUES=8 (yours when set).
# Benchmark: ./bin/xtask bench --nproc 8 --backend auto
set -eu
cd "$(dirname "$0")"
exec ./bin/xtask gpu-test --bundle . "$@"
"#;

/// `cargo xtask gpu-bundle`.
pub fn bundle_main(args: BundleArgs) -> anyhow::Result<ExitCode> {
    let root = workspace_root()?;
    let out = if args.out.is_absolute() { args.out.clone() } else { std::env::current_dir()?.join(&args.out) };
    if out.exists() {
        let empty = std::fs::read_dir(&out)?.next().is_none();
        anyhow::ensure!(
            empty || out.join("manifest.json").is_file(),
            "{} exists and is not a bundle (no manifest.json); refusing to replace it",
            out.display()
        );
        std::fs::remove_dir_all(&out).with_context(|| format!("removing the old bundle {}", out.display()))?;
    }
    let packages = workspace_packages(&root)?;
    eprintln!("[gpu] platform: {}", args.platform.name());
    let (suites, missing) = build_suites(&root, &packages, args.platform)?;
    for m in &missing {
        eprintln!("[gpu] package {m} is not in the workspace; skipped");
    }
    let (suites, other): (Vec<Suite>, Vec<Suite>) =
        suites.into_iter().partition(|s| !other_vendor_suite(args.platform, &s.package, &s.target));
    let other_vendor_suites: Vec<String> = other.into_iter().map(|s| s.name).collect();
    if !other_vendor_suites.is_empty() {
        eprintln!(
            "[gpu] left out of the {} bundle (the other vendor's suites, which would only report skipped): {}",
            args.platform.name(),
            other_vendor_suites.join(", ")
        );
    }
    std::fs::create_dir_all(out.join("tests"))?;
    std::fs::create_dir_all(out.join("bin"))?;

    let mut bundled = Vec::new();
    for s in &suites {
        let rel = PathBuf::from("tests").join(&s.name);
        std::fs::copy(&s.path, out.join(&rel)).with_context(|| format!("copying {}", s.path.display()))?;
        bundled.push(Suite { path: rel, ..s.clone() });
    }
    for &(pkg, bin, name) in BUNDLED_BINARIES {
        if !packages.iter().any(|p| p.name == pkg) {
            continue;
        }
        let arts = cargo_executables(&root, &["build", "--release", "-p", pkg, "--bin", bin])?;
        let a =
            arts.iter().find(|a| a.target == bin && !a.test).with_context(|| format!("cargo built no {bin} binary"))?;
        std::fs::copy(&a.path, out.join("bin").join(name))?;
    }
    for p in packages.iter().filter(|p| GPU_PACKAGES.contains(&p.name.as_str()) && p.has_examples) {
        // The suites' features (e.g. detcoll-layers' `cuda`), so feature-gated examples build too.
        let mut build = vec!["build", "--release", "--examples", "-p", &p.name];
        build.extend(suite_features(&p.name, args.platform));
        let arts = cargo_executables(&root, &build)?;
        let dir = out.join("examples");
        std::fs::create_dir_all(&dir)?;
        for a in arts.iter().filter(|a| a.kind == "example") {
            std::fs::copy(&a.path, dir.join(format!("{}-{}", p.name, a.target)))?;
        }
    }
    let kernels = root.join("kernels").join("build");
    if kernels.is_dir() {
        copy_dir(&kernels, &out.join("kernels"))?;
        eprintln!("[gpu] copied prebuilt kernels from {}", kernels.display());
    } else {
        eprintln!("[gpu] no prebuilt kernels ({} absent): GPU code compiles them at runtime", kernels.display());
    }

    let strip = if args.no_strip { None } else { which("strip") };
    if strip.is_none() && !args.no_strip {
        eprintln!("[gpu] `strip` not found: binaries keep their symbols");
    }
    if let Some(strip) = &strip {
        for dir in ["tests", "bin", "examples"] {
            let d = out.join(dir);
            if !d.is_dir() {
                continue;
            }
            for e in std::fs::read_dir(&d)? {
                let p = e?.path();
                let st = Command::new(strip)
                    .arg(&p)
                    .status()
                    .with_context(|| format!("running strip on {}", p.display()))?;
                anyhow::ensure!(st.success(), "strip {} failed ({st})", p.display());
            }
        }
    }
    let run_sh = out.join("run.sh");
    std::fs::write(&run_sh, RUN_SH)?;
    set_executable(&run_sh)?;

    let mut files = Vec::new();
    list_files(&out, &out, &mut files)?;
    let total: u64 = files.iter().map(|f| f.bytes).sum();
    let manifest = Manifest {
        schema_version: MANIFEST_VERSION,
        created_utc: utc_string(unix_now()),
        git_commit: git_commit(&root),
        gpu_packages: GPU_PACKAGES.iter().map(|s| s.to_string()).collect(),
        missing_packages: missing,
        suites: bundled,
        files,
        total_bytes: total,
        stripped: strip.is_some(),
        platform: args.platform,
        other_vendor_suites,
    };
    std::fs::write(out.join("manifest.json"), serde_json::to_string_pretty(&manifest)? + "\n")?;
    eprintln!(
        "[gpu] bundle {} ({}): {} suite(s), {} file(s), {:.1} MiB",
        out.display(),
        args.platform.name(),
        manifest.suites.len(),
        manifest.files.len() + 1,
        total as f64 / (1 << 20) as f64
    );
    if total > BUNDLE_WARN_BYTES {
        eprintln!("[gpu] warning: the bundle is larger than {} MiB", BUNDLE_WARN_BYTES >> 20);
    }
    if manifest.suites.is_empty() {
        eprintln!("[gpu] note: no GPU suites yet (none of {} is in the workspace)", GPU_PACKAGES.join(", "));
    }
    Ok(ExitCode::SUCCESS)
}

fn set_executable(p: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(p)?.permissions();
    perm.set_mode(0o755);
    std::fs::set_permissions(p, perm)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifests_record_the_platform() {
        let m = Manifest {
            schema_version: MANIFEST_VERSION,
            created_utc: "t".into(),
            git_commit: None,
            gpu_packages: vec![],
            missing_packages: vec![],
            suites: vec![],
            files: vec![],
            total_bytes: 0,
            stripped: true,
            platform: GpuPlatform::Rocm,
            other_vendor_suites: vec!["cuda-ipc-test-gpu".into()],
        };
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains(r#""platform":"rocm""#), "{json}");
        assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap().platform, GpuPlatform::Rocm);
        // A version-1 manifest (no platform) is an NVIDIA bundle.
        let old = json.replace(r#","platform":"rocm""#, "");
        assert_eq!(serde_json::from_str::<Manifest>(&old).unwrap().platform, GpuPlatform::Nvidia);
        // Before version 3 no suite was left out.
        let v2 = json.replace(r#","other_vendor_suites":["cuda-ipc-test-gpu"]"#, "");
        assert_ne!(v2, json);
        assert!(serde_json::from_str::<Manifest>(&v2).unwrap().other_vendor_suites.is_empty());
    }

    #[test]
    fn run_sh_calls_gpu_test_on_the_bundle() {
        assert!(RUN_SH.starts_with("#!/bin/sh\n"));
        assert!(RUN_SH.contains("exec ./bin/xtask gpu-test --bundle . \"$@\""));
    }
}
