//! What cargo builds for the GPU jobs: the workspace's packages, the executables of a cargo
//! run (from its JSON messages), and the GPU suites (release test binaries of
//! [`GPU_PACKAGES`]). Shared by `gpu-bundle` and `gpu-test` (and the release rebuild of `bench`).
use super::platform::{GpuPlatform, suite_features};
use crate::util::{cargo, show};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::process::Stdio;

/// Packages whose test binaries are GPU suites (absent packages are skipped).
pub const GPU_PACKAGES: &[&str] = &["cuda-ipc", "ccl-transport", "hip-ipc", "collective-factory", "detcoll-layers"];

/// A suite whose target name contains one of these starts several processes on one GPU, so
/// `gpu-test` runs it under MPS.
pub const MULTIPROCESS_MARKERS: &[&str] = &["process", "mps", "multiproc"];

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
pub(super) struct Package {
    pub(super) name: String,
    pub(super) dir: PathBuf,
    pub(super) has_examples: bool,
}

pub(super) fn workspace_packages(root: &Path) -> anyhow::Result<Vec<Package>> {
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

/// Builds (release) the test binaries of the GPU packages present in the workspace, for
/// `platform`.
pub(super) fn build_suites(
    root: &Path,
    packages: &[Package],
    platform: GpuPlatform,
) -> anyhow::Result<(Vec<Suite>, Vec<String>)> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
