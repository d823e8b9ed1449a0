//! `cargo xtask bench`: forwards to the harness in `detcoll-benches` (`benches/src/harness`).
//!
//! What stays here is what needs cargo: a debug `cargo xtask bench` builds the release xtask and
//! runs `bench` with it, so the collectives are measured optimised (the workspace's dev profile
//! is barely optimised). `bench-rank` (the ranks the harness launches re-execute this binary
//! with it) forwards to [`detcoll_benches::run_rank`].
use crate::gpu::cargo_executables;
use crate::util::workspace_root;
use anyhow::Context;
pub use detcoll_benches::BenchArgs;
use detcoll_benches::Frontend;
use std::process::ExitCode;

/// The harness as xtask runs it.
const XTASK: Frontend = Frontend { tool: "cargo xtask bench", release: Some(run_release) };

/// `cargo xtask bench`.
pub fn main(args: BenchArgs) -> anyhow::Result<ExitCode> {
    detcoll_benches::run(args, &XTASK)
}

/// `bench-rank`.
pub fn rank_main(args: BenchArgs) -> anyhow::Result<ExitCode> {
    detcoll_benches::run_rank(args, &XTASK)
}

/// Builds the release xtask and runs `bench` with it: the collectives are measured optimised
/// (the workspace's dev profile is barely optimised).
fn run_release(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let root = workspace_root()?;
    eprintln!("[bench] building the release xtask (benchmarks measure optimised code)");
    let arts = cargo_executables(&root, &["build", "--release", "-p", "xtask", "--bin", "xtask"])?;
    let exe = arts.iter().find(|a| a.target == "xtask" && !a.test).context("cargo built no xtask binary")?;
    let status = std::process::Command::new(&exe.path)
        .arg("bench")
        .args(args.to_cli_args())
        .status()
        .with_context(|| format!("running {}", exe.path.display()))?;
    match status.code() {
        Some(0) => Ok(ExitCode::SUCCESS),
        Some(c) => Ok(ExitCode::from(u8::try_from(c).unwrap_or(1))),
        None => anyhow::bail!("the release bench was killed ({status})"),
    }
}
