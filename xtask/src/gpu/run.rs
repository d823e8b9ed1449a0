//! `cargo xtask gpu-test`: the suites (from a bundle, or built for the platform), each with
//! its environment and MPS as it needs, then the summary; an interrupt stops after the running
//! suite, which is killed.
use super::GpuTestArgs;
use super::bundle::Manifest;
use super::mps::{Mps, mps_running, wants_mps};
use super::platform::{GpuPlatform, bundle_platform};
use super::suite_env::{
    CONNECTIONS_ENV, HW_QUEUES_ENV, MODULE_LOADING_ENV, MPS_CONNECTIONS_ENV, PROCESS_TESTS_ENV, hw_queues_var,
    module_loading_var, process_tests_var, suite_connections,
};
use super::suites::{install_signal_handlers, interrupted, run_suite};
use super::summary::summary_table;
use super::workspace::{GPU_PACKAGES, Suite, build_suites, workspace_packages};
use crate::util::workspace_root;
use anyhow::Context;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

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
        // A filter that matches nothing ran nothing: not a success.
        return Ok(if args.suites.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE });
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
        vars.extend(module_loading_var(platform, std::env::var_os(MODULE_LOADING_ENV).is_some()));
        let timeout = Duration::from_secs(args.timeout_s);
        results.push(run_suite(s, cwd, &args.test_args, kernel_dir.as_deref(), &vars, timeout)?);
    }
    mps.stop();
    println!("\n{}", summary_table(&results));
    if let Some(sig) = interrupted() {
        eprintln!("[gpu] interrupted by signal {sig}: the running suite was killed and the rest not run");
        return Ok(ExitCode::from(128u8.saturating_add(u8::try_from(sig).unwrap_or(0))));
    }
    let (passed, skipped) =
        results.iter().map(|r| r.counts.totals()).fold((0, 0), |(p, k), (rp, _, rk)| (p + rp, k + rk));
    if passed == 0 && skipped > 0 {
        eprintln!("[gpu] every test said it was skipped (no GPU ran them): not a pass");
        return Ok(ExitCode::FAILURE);
    }
    Ok(if results.iter().all(|r| r.ok) { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
