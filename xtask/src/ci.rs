//! `cargo xtask ci`: what CI runs (`.ci/run`, plus a fmt check and a build of every target), in
//! order, stopping at the first failure.
use crate::util::{cargo, show, workspace_root};
use anyhow::Context;
use clap::Args;
use std::process::{Command, ExitCode};
use std::time::Instant;

#[derive(Debug, Clone, Args)]
pub struct CiArgs {
    /// Skip the rustfmt check.
    #[arg(long)]
    pub no_fmt: bool,
    /// First `pip install nvidia-cuda-nvrtc` (as `.ci/run` does) so kernel-compile tests run
    /// without a CUDA toolkit; a failed install is reported and the tests report skips.
    #[arg(long)]
    pub install_nvrtc: bool,
}

/// The NVRTC wheel `.ci/run` installs.
const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc>=13,<14";

fn install_nvrtc() {
    if crate::util::which("python3").is_none() {
        eprintln!("[ci] nvrtc: python3 not found; kernel compile tests will report skipped");
        return;
    }
    let st = Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", NVRTC_WHEEL])
        .status();
    if !st.is_ok_and(|s| s.success()) {
        eprintln!("[ci] nvrtc: could not install {NVRTC_WHEEL}; kernel compile tests will report skipped");
    }
}

/// The CI steps: (name, cargo arguments).
pub const STEPS: [(&str, &[&str]); 4] = [
    ("fmt", &["fmt", "--all", "--", "--check"]),
    ("build", &["build", "--workspace", "--all-targets"]),
    ("test", &["test", "--workspace"]),
    ("bench (test mode)", &["bench", "-p", "detcoll-benches", "--", "--test"]),
];

fn rustfmt_available() -> bool {
    cargo().args(["fmt", "--version"]).output().is_ok_and(|o| o.status.success())
}

pub fn main(args: CiArgs) -> anyhow::Result<ExitCode> {
    let root = workspace_root()?;
    let mut summary = Vec::new();
    if args.install_nvrtc {
        install_nvrtc();
    }
    for (name, cargo_args) in STEPS {
        if name == "fmt" && (args.no_fmt || !rustfmt_available()) {
            eprintln!("[ci] {name}: skipped ({})", if args.no_fmt { "--no-fmt" } else { "rustfmt is not installed" });
            summary.push((name, "skipped".to_owned()));
            continue;
        }
        let mut cmd: Command = cargo();
        cmd.args(cargo_args).current_dir(&root);
        eprintln!("[ci] {name}: {}", show(&cmd));
        let start = Instant::now();
        let status = cmd.status().with_context(|| format!("running {}", show(&cmd)))?;
        let secs = start.elapsed().as_secs_f64();
        if !status.success() {
            summary.push((name, format!("FAILED ({status}) in {secs:.1} s")));
            print_summary(&summary);
            eprintln!("[ci] stopped at `{name}`");
            return Ok(ExitCode::FAILURE);
        }
        summary.push((name, format!("ok in {secs:.1} s")));
    }
    print_summary(&summary);
    Ok(ExitCode::SUCCESS)
}

fn print_summary(summary: &[(&str, String)]) {
    eprintln!("[ci] summary:");
    for (name, result) in summary {
        eprintln!("[ci]   {name:<18} {result}");
    }
}
