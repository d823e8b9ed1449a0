//! `cargo xtask gpu-bundle` and `cargo xtask gpu-test`: GPU suites on a host without Rust.
//!
//! The bundle holds the release test binaries of [`GPU_PACKAGES`] (those in the workspace),
//! this xtask binary (for `gpu-test` and `bench`), the launcher, the packages' examples and any
//! prebuilt kernels from `kernels/build/`, all stripped, plus `manifest.json` and `run.sh`
//! (`./run.sh` = `./bin/xtask gpu-test --bundle .`).
//!
//! `--platform nvidia|rocm` ([`GpuPlatform`]) selects the cargo features the suites are built
//! with ([`suite_features`]): the CUDA or the ROCm side of `ccl-transport` and the factory. A
//! bundle records its platform in `manifest.json`.
use crate::util::{cargo, show, which, workspace_root};
use anyhow::Context;
use clap::{Args, ValueEnum};
use detcoll_benches::harness::clock::{unix_now, utc_string};
use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

/// Packages whose test binaries are GPU suites (absent packages are skipped).
pub const GPU_PACKAGES: &[&str] = &["cuda-ipc", "ccl-transport", "hip-ipc", "collective-factory"];
/// Extra binaries bundled for the GPU host: (package, binary target, name in `bin/`).
const BUNDLED_BINARIES: &[(&str, &str, &str)] =
    &[("xtask", "xtask", "xtask"), ("detcoll-launch", "detcoll-run", "detcoll-run")];
/// A suite whose target name contains one of these starts several processes on one GPU, so
/// `gpu-test` runs it under MPS.
pub const MULTIPROCESS_MARKERS: &[&str] = &["process", "mps", "multiproc"];
/// Bundles above this size get a warning.
pub const BUNDLE_WARN_BYTES: u64 = 60 << 20;
/// Manifest schema version (2: `platform` added; a version-1 manifest is an NVIDIA bundle).
const MANIFEST_VERSION: u32 = 2;
/// Where CUDA's libraries usually live.
const CUDA_LIB: &str = "/usr/local/cuda/lib64";
/// Environment variable telling GPU code where prebuilt kernels are (set by `gpu-test`).
pub const KERNEL_DIR_ENV: &str = "DETCOLL_KERNEL_DIR";
/// CUDA's hardware work queues per context; `gpu-test` sets it for every suite.
pub const CONNECTIONS_ENV: &str = "CUDA_DEVICE_MAX_CONNECTIONS";
/// Overrides [`MPS_CONNECTIONS`] for suites running several processes per GPU under MPS.
pub const MPS_CONNECTIONS_ENV: &str = "DETCOLL_MPS_CONNECTIONS";
/// Connections of each process of a suite running several processes per GPU under MPS. MPS
/// caps the connections of all its clients together: with 32 each, worlds of 4 or more
/// processes fail at context creation with `CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED`
/// (measured on an H200); with 2 every world passes.
pub const MPS_CONNECTIONS: u32 = 2;
/// Connections of every other suite unless the user set [`CONNECTIONS_ENV`]: in-process worlds
/// run every rank on its own stream of one context (8 ranks, 8 streams) and want each stream
/// on its own hardware queue (fewer can serialise one rank's kernel behind another's).
pub const IN_PROCESS_CONNECTIONS: u32 = 32;
/// Lets the CUDA conformance suite with one process per rank run (it skips without it, since
/// processes sharing a GPU need MPS); `gpu-test` sets it where MPS is active.
pub const PROCESS_TESTS_ENV: &str = "DETCOLL_CUDA_PROCESS_TESTS";
/// ROCm (ROCclr): hardware queues a process's HIP streams are multiplexed onto.
pub const HW_QUEUES_ENV: &str = "GPU_MAX_HW_QUEUES";
/// What `gpu-test` sets it to on AMD: one queue per rank of the largest world (8). Fewer queues
/// than ranks sharing a GPU can put a rank's kernel behind a peer's that waits for it, which
/// the protocol reports as `PeerTimeout` instead of running the test.
pub const HW_QUEUES: u32 = 8;

/// The GPU vendor the suites are built for: selects the features of the packages with a device
/// side per vendor ([`suite_features`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum GpuPlatform {
    /// NVIDIA: CUDA and NCCL.
    #[default]
    Nvidia,
    /// AMD: HIP and RCCL.
    Rocm,
}

impl GpuPlatform {
    /// The name on the command line and in the manifest.
    pub fn name(self) -> &'static str {
        match self {
            GpuPlatform::Nvidia => "nvidia",
            GpuPlatform::Rocm => "rocm",
        }
    }

    /// `gpu-test`'s platform without `--platform`, from what this host has: a usable CUDA GPU →
    /// nvidia, else a usable HIP device → rocm, else nvidia (the suites then skip).
    pub fn detected(cuda: bool, hip: bool) -> GpuPlatform {
        if !cuda && hip { GpuPlatform::Rocm } else { GpuPlatform::Nvidia }
    }

    /// [`GpuPlatform::detected`] on this host (loads libcuda / libamdhip64 if present; never
    /// panics without them).
    pub fn detect() -> GpuPlatform {
        let cuda = detcoll_benches::harness::cuda_available();
        GpuPlatform::detected(cuda, !cuda && detcoll_benches::harness::hip_available())
    }
}

#[derive(Debug, Clone, Args)]
pub struct BundleArgs {
    /// Output directory (replaced if it holds an earlier bundle).
    #[arg(long, default_value = "gpu-bundle")]
    pub out: PathBuf,
    /// Keep symbols (do not strip).
    #[arg(long)]
    pub no_strip: bool,
    /// The GPU vendor the suites are built for (recorded in the manifest).
    #[arg(long, value_enum, default_value_t = GpuPlatform::Nvidia)]
    pub platform: GpuPlatform,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MpsMode {
    /// Start MPS (as root, if not running) around suites that run several processes per GPU.
    Auto,
    /// Run every suite under MPS.
    On,
    /// Never start MPS.
    Off,
}

#[derive(Debug, Clone, Args)]
pub struct GpuTestArgs {
    /// Run the suites of this bundle (made by `gpu-bundle`) instead of building them with cargo.
    #[arg(long)]
    pub bundle: Option<PathBuf>,
    /// The GPU vendor the suites are built for. Default: nvidia when a CUDA GPU is usable, else
    /// rocm when a HIP device is, else nvidia. With `--bundle`: the bundle's (must match if
    /// given).
    #[arg(long, value_enum)]
    pub platform: Option<GpuPlatform>,
    /// MPS policy (NVIDIA only: `auto` never starts MPS for a rocm run).
    #[arg(long, value_enum, default_value_t = MpsMode::Auto)]
    pub mps: MpsMode,
    /// Only suites whose name contains this (repeatable).
    #[arg(long = "suite")]
    pub suites: Vec<String>,
    /// Kill a suite (and the processes it started) that runs longer than this many seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout_s: u64,
    /// Arguments passed to every test binary (after `--test-threads=1`), e.g. a test filter.
    #[arg(last = true)]
    pub test_args: Vec<String>,
}

/// One GPU test binary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Suite {
    /// `<package>-<kind>-<target>`, also its file name under `tests/` in a bundle.
    pub name: String,
    pub package: String,
    pub target: String,
    pub kind: String,
    /// Absolute when built by cargo; relative to the bundle directory in a manifest.
    pub path: PathBuf,
    /// Runs several processes on one GPU (MPS wanted).
    pub multiprocess: bool,
}

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
}

fn suite_name(package: &str, kind: &str, target: &str) -> String {
    format!("{package}-{kind}-{target}")
}

/// Whether a test target runs several processes per GPU.
pub fn is_multiprocess(target: &str) -> bool {
    let t = target.to_ascii_lowercase();
    MULTIPROCESS_MARKERS.iter().any(|m| t.contains(m))
}

/// A workspace package, from `cargo metadata`.
#[derive(Debug, Clone)]
struct Package {
    name: String,
    dir: PathBuf,
    has_examples: bool,
}

fn workspace_packages(root: &Path) -> anyhow::Result<Vec<Package>> {
    let out = cargo()
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .context("running cargo metadata")?;
    anyhow::ensure!(out.status.success(), "cargo metadata failed ({})", out.status);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).context("parsing cargo metadata")?;
    let pkgs = v["packages"].as_array().context("cargo metadata has no packages")?;
    Ok(pkgs
        .iter()
        .map(|p| Package {
            name: p["name"].as_str().unwrap_or_default().to_owned(),
            dir: Path::new(p["manifest_path"].as_str().unwrap_or_default())
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default(),
            has_examples: p["targets"].as_array().is_some_and(|ts| {
                ts.iter().any(|t| t["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "example")))
            }),
        })
        .collect())
}

/// An executable cargo built: (target name, target kind, path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Artifact {
    pub target: String,
    pub kind: String,
    pub test: bool,
    pub path: PathBuf,
}

/// Parses cargo's `--message-format=json` output: every artifact with an executable.
fn parse_artifacts(stdout: &str) -> Vec<Artifact> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["reason"] == "compiler-artifact")
        .filter_map(|v| {
            let path = v["executable"].as_str()?;
            Some(Artifact {
                target: v["target"]["name"].as_str()?.to_owned(),
                kind: v["target"]["kind"][0].as_str().unwrap_or("bin").to_owned(),
                test: v["profile"]["test"].as_bool().unwrap_or(false),
                path: PathBuf::from(path),
            })
        })
        .collect()
}

/// Runs cargo with `args` + `--message-format=json-render-diagnostics`; the executables built.
pub(crate) fn cargo_executables(root: &Path, args: &[&str]) -> anyhow::Result<Vec<Artifact>> {
    let mut cmd = cargo();
    cmd.args(args).arg("--message-format=json-render-diagnostics").current_dir(root).stderr(Stdio::inherit());
    eprintln!("[xtask] {}", show(&cmd));
    let out = cmd.output().with_context(|| format!("running {}", show(&cmd)))?;
    anyhow::ensure!(out.status.success(), "{} failed ({})", show(&cmd), out.status);
    Ok(parse_artifacts(&String::from_utf8_lossy(&out.stdout)))
}

/// Cargo feature arguments a GPU package's suites need on `platform` beyond `-p`: the factory's
/// GPU tests are behind `cuda` / `rocm` (without them they compile to empty binaries that pass
/// with 0 tests).
pub fn suite_features(package: &str, platform: GpuPlatform) -> &'static [&'static str] {
    match (platform, package) {
        (GpuPlatform::Nvidia, "collective-factory") => &["--features", "cuda"],
        (GpuPlatform::Rocm, "collective-factory") => &["--features", "rocm"],
        _ => &[],
    }
}

/// Builds (release) the test binaries of the GPU packages present in the workspace, for
/// `platform`.
fn build_suites(root: &Path, packages: &[Package], platform: GpuPlatform) -> anyhow::Result<(Vec<Suite>, Vec<String>)> {
    let mut suites = Vec::new();
    let mut missing = Vec::new();
    for &name in GPU_PACKAGES {
        if !packages.iter().any(|p| p.name == name) {
            missing.push(name.to_owned());
            continue;
        }
        let mut args = vec!["test", "--release", "--no-run", "-p", name];
        args.extend(suite_features(name, platform));
        for a in cargo_executables(root, &args)? {
            if a.test {
                suites.push(Suite {
                    name: suite_name(name, &a.kind, &a.target),
                    package: name.to_owned(),
                    multiprocess: is_multiprocess(&a.target),
                    target: a.target,
                    kind: a.kind,
                    path: a.path,
                });
            }
        }
    }
    Ok((suites, missing))
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
        let arts = cargo_executables(&root, &["build", "--release", "--examples", "-p", &p.name])?;
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

/// Counts from libtest output: the `test result:` lines, and the per-test lines as a fallback
/// for a binary that died before its summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    /// `test result:` lines seen.
    pub results: u64,
    /// Per-test lines (`test NAME ... ok|FAILED|ignored`) seen: passed, failed, ignored.
    pub lines: [u64; 3],
}

impl Counts {
    /// Adds the counts of one output line.
    pub fn add_line(&mut self, line: &str) {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("test result: ") {
            self.results += 1;
            for part in rest.split([';', '.']) {
                let mut w = part.split_whitespace();
                let (Some(n), Some(what)) = (w.next(), w.next()) else { continue };
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => self.passed += n,
                    "failed" => self.failed += n,
                    "ignored" => self.skipped += n,
                    _ => {}
                }
            }
        } else if let Some((_, verdict)) = line.strip_prefix("test ").and_then(|r| r.rsplit_once(" ... ")) {
            match verdict {
                "ok" => self.lines[0] += 1,
                "FAILED" => self.lines[1] += 1,
                v if v.starts_with("ignored") => self.lines[2] += 1,
                _ => {}
            }
        }
    }
    /// (passed, failed, skipped): from the summaries, or from the per-test lines without one.
    pub fn totals(&self) -> (u64, u64, u64) {
        if self.results > 0 {
            (self.passed, self.failed, self.skipped)
        } else {
            (self.lines[0], self.lines[1], self.lines[2])
        }
    }
    pub fn failed(&self) -> u64 {
        self.totals().1
    }
}

/// The MPS control daemon, when this run started it.
struct Mps {
    started: bool,
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("Uid:")).and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

fn mps_control(input: &str) -> bool {
    let Ok(mut child) = Command::new("nvidia-cuda-mps-control")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    else {
        return false;
    };
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes());
    }
    child.wait().is_ok_and(|s| s.success())
}

/// Whether an MPS control daemon answers (started by anyone).
fn mps_running() -> bool {
    which("nvidia-cuda-mps-control").is_some() && mps_control("get_server_list\n")
}

impl Mps {
    fn start(&mut self) {
        if self.started {
            return;
        }
        if which("nvidia-cuda-mps-control").is_none() {
            eprintln!("[gpu] nvidia-cuda-mps-control not found: running without MPS");
            return;
        }
        if mps_running() {
            eprintln!("[gpu] MPS is already running; using it");
            return;
        }
        if !is_root() {
            eprintln!("[gpu] starting MPS needs root: running without MPS");
            return;
        }
        match Command::new("nvidia-cuda-mps-control").arg("-d").status() {
            Ok(s) if s.success() => {
                eprintln!("[gpu] started the MPS control daemon");
                self.started = true;
            }
            Ok(s) => eprintln!("[gpu] nvidia-cuda-mps-control -d failed ({s}): running without MPS"),
            Err(e) => eprintln!("[gpu] nvidia-cuda-mps-control -d: {e}: running without MPS"),
        }
    }
    fn stop(&mut self) {
        if self.started {
            if mps_control("quit\n") {
                eprintln!("[gpu] stopped the MPS control daemon");
            } else {
                eprintln!("[gpu] warning: `echo quit | nvidia-cuda-mps-control` failed");
            }
            self.started = false;
        }
    }
}

impl Drop for Mps {
    fn drop(&mut self) {
        self.stop();
    }
}

fn library_path() -> std::ffi::OsString {
    let mut parts: Vec<PathBuf> = Vec::new();
    if Path::new(CUDA_LIB).is_dir() {
        parts.push(PathBuf::from(CUDA_LIB));
    }
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH") {
        parts.extend(std::env::split_paths(&old).filter(|p| p != Path::new(CUDA_LIB)));
    }
    std::env::join_paths(parts).unwrap_or_default()
}

/// A variable `gpu-test` sets in one suite's environment, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteVar {
    pub name: &'static str,
    pub value: String,
    pub why: String,
}

/// Parses a connection count (CUDA accepts 1 to 32).
fn parse_connections(var: &str, value: &str) -> anyhow::Result<u32> {
    match value.trim().parse::<u32>() {
        Ok(n) if (1..=32).contains(&n) => Ok(n),
        _ => anyhow::bail!("{var}={value:?}: expected a number of connections from 1 to 32"),
    }
}

/// The [`CONNECTIONS_ENV`] of a suite: [`MPS_CONNECTIONS`] (or `mps_override`, the value of
/// [`MPS_CONNECTIONS_ENV`]) for a suite running several processes per GPU while MPS is
/// active, whatever `user` (the caller's [`CONNECTIONS_ENV`]) says; otherwise `user`, or
/// [`IN_PROCESS_CONNECTIONS`] when unset.
pub fn suite_connections(
    multiprocess: bool,
    mps_active: bool,
    user: Option<&str>,
    mps_override: Option<&str>,
) -> anyhow::Result<SuiteVar> {
    let set = |value: u32, why: String| Ok(SuiteVar { name: CONNECTIONS_ENV, value: value.to_string(), why });
    let user = user.filter(|v| !v.trim().is_empty());
    if multiprocess && mps_active {
        if let Some(v) = mps_override.filter(|v| !v.trim().is_empty()) {
            let value = parse_connections(MPS_CONNECTIONS_ENV, v)?;
            return set(value, format!("several processes per GPU under MPS; from {MPS_CONNECTIONS_ENV}"));
        }
        let ignored = user.map_or_else(String::new, |u| {
            format!("; your {CONNECTIONS_ENV}={u} is not used here, set {MPS_CONNECTIONS_ENV} to change it")
        });
        return set(
            MPS_CONNECTIONS,
            format!("several processes per GPU under MPS, whose clients share its connections{ignored}"),
        );
    }
    if let Some(u) = user {
        return set(parse_connections(CONNECTIONS_ENV, u)?, "yours".into());
    }
    let why = if multiprocess { "one context per process, no MPS" } else { "ranks' streams in one context" };
    set(IN_PROCESS_CONNECTIONS, format!("default: {why}"))
}

/// [`HW_QUEUES_ENV`] for every suite on AMD: yours when set, else [`HW_QUEUES`]; nothing on
/// NVIDIA.
pub fn hw_queues_var(platform: GpuPlatform, user: Option<&str>) -> Option<SuiteVar> {
    if platform != GpuPlatform::Rocm {
        return None;
    }
    Some(match user.filter(|v| !v.trim().is_empty()) {
        Some(u) => SuiteVar { name: HW_QUEUES_ENV, value: u.trim().to_owned(), why: "yours".into() },
        None => SuiteVar {
            name: HW_QUEUES_ENV,
            value: HW_QUEUES.to_string(),
            why: "default: one hardware queue per rank's stream, up to 8 ranks on one GPU".into(),
        },
    })
}

/// [`PROCESS_TESTS_ENV`]`=1` for a suite running several processes per GPU while MPS is
/// active, unless the user set the variable (to anything).
pub fn process_tests_var(multiprocess: bool, mps_active: bool, user_set: bool) -> Option<SuiteVar> {
    (multiprocess && mps_active && !user_set).then(|| SuiteVar {
        name: PROCESS_TESTS_ENV,
        value: "1".into(),
        why: "MPS is active: CUDA ranks may share a GPU as processes".into(),
    })
}

/// The signal that interrupted `gpu-test` (0: none yet).
static INTERRUPTED: AtomicI32 = AtomicI32::new(0);
/// The process group of the suite running now (0: none), killed by the signal handler.
static RUNNING_GROUP: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    // Only atomics and kill(2) (all the launcher's helper does) here: both are async-signal-safe.
    INTERRUPTED.store(sig, Ordering::SeqCst);
    let group = RUNNING_GROUP.load(Ordering::SeqCst);
    if group > 0 {
        detcoll_launch::signal_process_group(group as u32, libc::SIGKILL);
    }
}

/// On SIGINT, SIGTERM or SIGHUP: kill the running suite and let `gpu-test` stop after it, so
/// that MPS it started is stopped on the way out. The handler is reset by its first signal,
/// so a second one kills `gpu-test` at once. Signals ignored on entry (`nohup`, background
/// jobs) stay ignored.
fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: plain sigaction(2) calls on zero-initialised structs; the handler only
        // touches atomics and calls kill(2).
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN {
                continue;
            }
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART | libc::SA_RESETHAND;
            libc::sigemptyset(&mut sa.sa_mask);
            if libc::sigaction(sig, &sa, std::ptr::null_mut()) != 0 {
                eprintln!("[gpu] warning: cannot handle signal {sig}: an interrupt may leave MPS running");
            }
        }
    }
}

/// The signal that interrupted `gpu-test`, if any.
fn interrupted() -> Option<i32> {
    Some(INTERRUPTED.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

struct SuiteResult {
    name: String,
    ok: bool,
    status: String,
    counts: Counts,
    secs: f64,
}

/// Kills the process group `pgid` (a suite and every process it started).
fn kill_group(pgid: u32) {
    detcoll_launch::signal_process_group(pgid, libc::SIGKILL);
}

fn run_suite(
    s: &Suite,
    cwd: &Path,
    test_args: &[String],
    kernel_dir: Option<&Path>,
    vars: &[SuiteVar],
    timeout: Duration,
) -> anyhow::Result<SuiteResult> {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(&s.path);
    cmd.arg("--test-threads=1")
        .args(test_args)
        .current_dir(cwd)
        .env("LD_LIBRARY_PATH", library_path())
        .envs(vars.iter().map(|v| (v.name, &v.value)));
    if let Some(k) = kernel_dir {
        cmd.env(KERNEL_DIR_ENV, k);
    }
    // Own process group: on timeout the suite and the processes it started are killed together.
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).process_group(0);
    eprintln!("[gpu] === {} ({})", s.name, show(&cmd));
    for v in vars {
        eprintln!("[gpu] {}={} ({})", v.name, v.value, v.why);
    }
    let start = Instant::now();
    let mut child = cmd.spawn().with_context(|| format!("starting {}", s.path.display()))?;
    let pgid = child.id();
    RUNNING_GROUP.store(pgid as i32, Ordering::SeqCst);
    if interrupted().is_some() {
        // The signal came before the handler could see this group.
        kill_group(pgid);
    }
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let timed_out = Arc::new(AtomicBool::new(false));
    let watchdog = {
        let timed_out = Arc::clone(&timed_out);
        std::thread::spawn(move || {
            if let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(timeout) {
                timed_out.store(true, Ordering::SeqCst);
                eprintln!("[gpu] suite ran past {} s: killing it", timeout.as_secs());
                kill_group(pgid);
            }
        })
    };
    let mut counts = Counts::default();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            println!("{line}");
            counts.add_line(&line);
        }
    }
    let status = child.wait();
    RUNNING_GROUP.store(0, Ordering::SeqCst);
    let status = status?;
    let _ = done_tx.send(());
    let _ = watchdog.join();
    let timed_out = timed_out.load(Ordering::SeqCst);
    let ok = status.success() && counts.failed() == 0 && !timed_out;
    let signal = interrupted();
    let ok = ok && signal.is_none();
    let status = if let Some(sig) = signal {
        format!("INTERRUPTED (signal {sig})")
    } else if timed_out {
        format!("TIMEOUT after {} s", timeout.as_secs())
    } else if ok && counts.results == 0 {
        "ok (no libtest summary)".to_owned()
    } else if ok {
        "ok".to_owned()
    } else {
        format!("FAILED ({status})")
    };
    Ok(SuiteResult { name: s.name.clone(), ok, status, counts, secs: start.elapsed().as_secs_f64() })
}

/// The summary table printed at the end.
fn summary_table(results: &[SuiteResult]) -> String {
    let mut s = String::from(
        "| suite | result | passed | failed | skipped | seconds |\n| --- | --- | ---: | ---: | ---: | ---: |\n",
    );
    let mut total = (0, 0, 0);
    for r in results {
        let (p, f, k) = r.counts.totals();
        s.push_str(&format!("| {} | {} | {p} | {f} | {k} | {:.1} |\n", r.name, r.status, r.secs));
        total = (total.0 + p, total.1 + f, total.2 + k);
    }
    let ok = results.iter().all(|r| r.ok);
    s.push_str(&format!(
        "| **total** | {} | {} | {} | {} | {:.1} |\n",
        if ok { "ok" } else { "FAILED" },
        total.0,
        total.1,
        total.2,
        results.iter().map(|r| r.secs).sum::<f64>()
    ));
    s
}

/// The platform of a `gpu-test --bundle` run: the bundle's; `--platform` may only confirm it
/// (its suites cannot be rebuilt for another).
pub fn bundle_platform(bundle: GpuPlatform, asked: Option<GpuPlatform>) -> anyhow::Result<GpuPlatform> {
    match asked {
        Some(p) if p != bundle => anyhow::bail!(
            "--platform {} given, but the bundle was built for {} (make one with `cargo xtask gpu-bundle --platform {}`)",
            p.name(),
            bundle.name(),
            p.name()
        ),
        _ => Ok(bundle),
    }
}

/// Whether a suite runs under MPS: `--mps on` / `off` as given; `auto` for suites running several
/// processes per GPU on NVIDIA (MPS is NVIDIA's; AMD GPUs run several processes without it).
pub fn wants_mps(mode: MpsMode, multiprocess: bool, platform: GpuPlatform) -> bool {
    match mode {
        MpsMode::On => true,
        MpsMode::Off => false,
        MpsMode::Auto => multiprocess && platform == GpuPlatform::Nvidia,
    }
}

/// `cargo xtask gpu-test`.
pub fn test_main(args: GpuTestArgs) -> anyhow::Result<ExitCode> {
    // Every suite with the directory it runs in (the bundle, or its package like `cargo test`),
    // and the platform they were built for.
    let platform;
    let mut suites: Vec<(Suite, PathBuf)> = match &args.bundle {
        Some(dir) => {
            let dir = dir.canonicalize().with_context(|| format!("bundle directory {}", dir.display()))?;
            let text = std::fs::read_to_string(dir.join("manifest.json"))
                .with_context(|| format!("reading {}/manifest.json (is it a gpu-bundle?)", dir.display()))?;
            let m: Manifest = serde_json::from_str(&text).context("parsing the bundle manifest")?;
            platform = bundle_platform(m.platform, args.platform)?;
            eprintln!("[gpu] platform: {} (the bundle's)", platform.name());
            m.suites.into_iter().map(|s| (Suite { path: dir.join(&s.path), ..s }, dir.clone())).collect()
        }
        None => {
            let root = workspace_root()?;
            let packages = workspace_packages(&root)?;
            platform = match args.platform {
                Some(p) => {
                    eprintln!("[gpu] platform: {}", p.name());
                    p
                }
                None => {
                    let p = GpuPlatform::detect();
                    eprintln!("[gpu] platform: {} (detected; --platform nvidia|rocm overrides)", p.name());
                    p
                }
            };
            let (suites, missing) = build_suites(&root, &packages, platform)?;
            for m in &missing {
                eprintln!("[gpu] package {m} is not in the workspace; skipped");
            }
            suites
                .into_iter()
                .map(|s| {
                    let dir =
                        packages.iter().find(|p| p.name == s.package).map_or_else(|| root.clone(), |p| p.dir.clone());
                    (s, dir)
                })
                .collect()
        }
    };
    if !args.suites.is_empty() {
        suites.retain(|(s, _)| args.suites.iter().any(|f| s.name.contains(f.as_str())));
    }
    if suites.is_empty() {
        println!("no GPU suites to run (GPU packages: {})", GPU_PACKAGES.join(", "));
        return Ok(ExitCode::SUCCESS);
    }
    let kernel_dir = match &args.bundle {
        Some(d) => Some(d.join("kernels")),
        None => Some(workspace_root()?.join("kernels").join("build")),
    }
    .filter(|d| d.is_dir())
    .and_then(|d| d.canonicalize().ok());

    let user_connections = std::env::var(CONNECTIONS_ENV).ok();
    let mps_connections = std::env::var(MPS_CONNECTIONS_ENV).ok();
    let user_hw_queues = std::env::var(HW_QUEUES_ENV).ok();
    // Fail on a bad value before starting anything.
    suite_connections(true, true, user_connections.as_deref(), mps_connections.as_deref())?;
    suite_connections(false, false, user_connections.as_deref(), mps_connections.as_deref())?;

    // From here on an interrupt kills the running suite and leaves through `mps`'s Drop.
    install_signal_handlers();
    let mut mps = Mps { started: false };
    let mut results = Vec::new();
    for (s, cwd) in &suites {
        if interrupted().is_some() {
            break;
        }
        let want_mps = wants_mps(args.mps, s.multiprocess, platform);
        if want_mps {
            mps.start();
        } else {
            mps.stop();
        }
        // A daemon someone else started makes processes MPS clients too, even with `--mps off`.
        let mps_active = s.multiprocess && (mps.started || mps_running());
        let mut vars = vec![suite_connections(
            s.multiprocess,
            mps_active,
            user_connections.as_deref(),
            mps_connections.as_deref(),
        )?];
        vars.extend(process_tests_var(s.multiprocess, mps_active, std::env::var_os(PROCESS_TESTS_ENV).is_some()));
        vars.extend(hw_queues_var(platform, user_hw_queues.as_deref()));
        let timeout = Duration::from_secs(args.timeout_s);
        results.push(run_suite(s, cwd, &args.test_args, kernel_dir.as_deref(), &vars, timeout)?);
    }
    mps.stop();
    println!("\n{}", summary_table(&results));
    if let Some(sig) = interrupted() {
        eprintln!("[gpu] interrupted by signal {sig}: the running suite was killed and the rest not run");
        return Ok(ExitCode::from(128u8.saturating_add(u8::try_from(sig).unwrap_or(0))));
    }
    Ok(if results.iter().all(|r| r.ok) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amd_suites_get_a_hardware_queue_per_rank() {
        assert!(hw_queues_var(GpuPlatform::Nvidia, None).is_none());
        assert!(hw_queues_var(GpuPlatform::Nvidia, Some("4")).is_none());
        let d = hw_queues_var(GpuPlatform::Rocm, None).unwrap();
        assert_eq!((d.name, d.value.as_str()), ("GPU_MAX_HW_QUEUES", "8"));
        let y = hw_queues_var(GpuPlatform::Rocm, Some(" 16 ")).unwrap();
        assert_eq!((y.value.as_str(), y.why.as_str()), ("16", "yours"));
        assert_eq!(hw_queues_var(GpuPlatform::Rocm, Some(" ")).unwrap().value, "8");
    }

    #[test]
    fn libtest_result_lines_are_counted() {
        let mut c = Counts::default();
        c.add_line("running 5 tests");
        c.add_line("test a ... ok");
        c.add_line("test result: ok. 3 passed; 0 failed; 2 ignored; 0 measured; 1 filtered out; finished in 0.01s");
        c.add_line("test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.50s");
        assert_eq!(c.totals(), (4, 2, 2));
        assert_eq!(c.results, 2);
        // Killed before its summary: the per-test lines count.
        let mut k = Counts::default();
        for l in
            ["test a::world1 ... ok", "test a::world2 ... FAILED", "test b ... ignored, needs a GPU", "test c ... ok"]
        {
            k.add_line(l);
        }
        assert_eq!(k.totals(), (2, 1, 1));
        assert_eq!(k.failed(), 1);
    }

    #[test]
    fn multiprocess_suites_are_recognised() {
        assert!(is_multiprocess("multi_process"));
        assert!(is_multiprocess("conformance_processes"));
        assert!(is_multiprocess("MPS_smoke"));
        assert!(!is_multiprocess("cuda_ipc"));
        assert!(!is_multiprocess("conformance_threads"));
    }

    #[test]
    fn conformance_suites_are_classified_by_name() {
        assert!(is_multiprocess("conformance_processes"));
        // Threads, on one GPU or across GPUs: in-process suites (no MPS, 32 connections).
        assert!(!is_multiprocess("conformance"));
        assert!(!is_multiprocess("conformance_gpus"));
        assert!(!is_multiprocess("gpu"));
    }

    #[test]
    fn connections_per_suite() {
        let c = |mp, mps, user, ovr| suite_connections(mp, mps, user, ovr).map(|c| c.value.parse::<u32>().unwrap());
        // Several processes per GPU under MPS: 2, whatever CUDA_DEVICE_MAX_CONNECTIONS says.
        assert_eq!(c(true, true, None, None).unwrap(), MPS_CONNECTIONS);
        assert_eq!(c(true, true, Some("32"), None).unwrap(), 2);
        let why = suite_connections(true, true, Some("32"), None).unwrap().why;
        assert!(why.contains(MPS_CONNECTIONS_ENV) && why.contains("=32"), "{why}");
        // ... unless DETCOLL_MPS_CONNECTIONS says otherwise (blank counts as unset).
        assert_eq!(c(true, true, Some("32"), Some("4")).unwrap(), 4);
        assert_eq!(c(true, true, None, Some(" ")).unwrap(), 2);
        assert!(c(true, true, None, Some("0")).is_err());
        assert!(c(true, true, None, Some("33")).is_err());
        assert!(c(true, true, None, Some("two")).is_err());
        // In-process suites (and processes without MPS): 32 unless the user set a value; the
        // MPS override does not apply to them.
        assert_eq!(c(false, false, None, None).unwrap(), IN_PROCESS_CONNECTIONS);
        assert_eq!(c(false, true, None, Some("2")).unwrap(), 32);
        assert_eq!(c(true, false, None, Some("2")).unwrap(), 32);
        assert_eq!(c(false, false, Some("8"), None).unwrap(), 8);
        assert_eq!(suite_connections(false, false, Some("8"), None).unwrap().why, "yours");
        assert_eq!(c(false, false, Some(""), None).unwrap(), 32);
        assert!(c(false, false, Some("lots"), None).is_err());
        assert_eq!(suite_connections(false, false, None, None).unwrap().name, "CUDA_DEVICE_MAX_CONNECTIONS");
    }

    #[test]
    fn process_suites_are_enabled_under_mps_only() {
        let v = process_tests_var(true, true, false).unwrap();
        assert_eq!((v.name, v.value.as_str()), ("DETCOLL_CUDA_PROCESS_TESTS", "1"));
        assert_eq!(process_tests_var(true, false, false), None);
        assert_eq!(process_tests_var(false, true, false), None);
        // The user's own value (even 0) stands.
        assert_eq!(process_tests_var(true, true, true), None);
    }

    #[test]
    fn cargo_json_artifacts_are_parsed() {
        let out = r#"{"reason":"compiler-artifact","target":{"name":"cuda_ipc","kind":["lib"]},"profile":{"test":true},"executable":"/t/release/deps/cuda_ipc-1"}
{"reason":"compiler-artifact","target":{"name":"half","kind":["lib"]},"profile":{"test":false},"executable":null}
{"reason":"compiler-artifact","target":{"name":"threads","kind":["test"]},"profile":{"test":true},"executable":"/t/release/deps/threads-2"}
{"reason":"build-finished","success":true}
not json"#;
        let a = parse_artifacts(out);
        assert_eq!(a.len(), 2);
        assert_eq!(
            a[0],
            Artifact {
                target: "cuda_ipc".into(),
                kind: "lib".into(),
                test: true,
                path: "/t/release/deps/cuda_ipc-1".into()
            }
        );
        assert_eq!(a[1].kind, "test");
        assert_eq!(suite_name("cuda-ipc", &a[1].kind, &a[1].target), "cuda-ipc-test-threads");
    }

    #[test]
    fn summary_table_totals() {
        let r = vec![
            SuiteResult {
                name: "a".into(),
                ok: true,
                status: "ok".into(),
                counts: Counts { passed: 2, failed: 0, skipped: 1, results: 1, lines: [0; 3] },
                secs: 1.0,
            },
            SuiteResult {
                name: "b".into(),
                ok: false,
                status: "FAILED".into(),
                counts: Counts { passed: 0, failed: 0, skipped: 0, results: 0, lines: [1, 1, 0] },
                secs: 2.0,
            },
        ];
        let t = summary_table(&r);
        assert!(t.contains("| **total** | FAILED | 3 | 1 | 1 | 3.0 |"), "{t}");
    }

    #[test]
    fn suite_features_follow_the_platform() {
        use GpuPlatform::{Nvidia, Rocm};
        let f = |p, pl| suite_features(p, pl).join(" ");
        assert_eq!(f("collective-factory", Nvidia), "--features cuda");
        assert_eq!(f("collective-factory", Rocm), "--features rocm");
        // ccl-transport has no vendor features (its GPU suites run both vendors' devices).
        for p in ["ccl-transport", "cuda-ipc", "hip-ipc", "unknown"] {
            assert!(suite_features(p, Nvidia).is_empty() && suite_features(p, Rocm).is_empty(), "{p}");
        }
        // Every GPU package's arguments are well-formed cargo flags.
        for &p in GPU_PACKAGES {
            for pl in [Nvidia, Rocm] {
                let a = suite_features(p, pl);
                assert!(a.is_empty() || a[a.len() - 2] == "--features", "{p} {pl:?}: {a:?}");
            }
        }
    }

    #[test]
    fn platform_detection_prefers_cuda() {
        assert_eq!(GpuPlatform::detected(true, false), GpuPlatform::Nvidia);
        assert_eq!(GpuPlatform::detected(true, true), GpuPlatform::Nvidia);
        assert_eq!(GpuPlatform::detected(false, true), GpuPlatform::Rocm);
        assert_eq!(GpuPlatform::detected(false, false), GpuPlatform::Nvidia);
        assert_eq!(GpuPlatform::default(), GpuPlatform::Nvidia);
    }

    #[test]
    fn bundles_keep_their_platform() {
        use GpuPlatform::{Nvidia, Rocm};
        assert_eq!(bundle_platform(Rocm, None).unwrap(), Rocm);
        assert_eq!(bundle_platform(Rocm, Some(Rocm)).unwrap(), Rocm);
        let e = bundle_platform(Nvidia, Some(Rocm)).unwrap_err().to_string();
        assert!(e.contains("built for nvidia") && e.contains("--platform rocm"), "{e}");
    }

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
        };
        let json = serde_json::to_string(&m).unwrap();
        assert!(json.contains(r#""platform":"rocm""#), "{json}");
        assert_eq!(serde_json::from_str::<Manifest>(&json).unwrap().platform, GpuPlatform::Rocm);
        // A version-1 manifest (no platform) is an NVIDIA bundle.
        let old = json.replace(r#","platform":"rocm""#, "");
        assert_eq!(serde_json::from_str::<Manifest>(&old).unwrap().platform, GpuPlatform::Nvidia);
    }

    #[test]
    fn mps_is_nvidia_only_in_auto_mode() {
        use GpuPlatform::{Nvidia, Rocm};
        assert!(wants_mps(MpsMode::Auto, true, Nvidia));
        assert!(!wants_mps(MpsMode::Auto, false, Nvidia));
        assert!(!wants_mps(MpsMode::Auto, true, Rocm));
        assert!(wants_mps(MpsMode::On, false, Rocm));
        assert!(!wants_mps(MpsMode::Off, true, Nvidia));
    }

    #[test]
    fn run_sh_calls_gpu_test_on_the_bundle() {
        assert!(RUN_SH.starts_with("#!/bin/sh\n"));
        assert!(RUN_SH.contains("exec ./bin/xtask gpu-test --bundle . \"$@\""));
    }
}
