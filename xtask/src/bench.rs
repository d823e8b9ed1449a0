//! `cargo xtask bench`: forwards to the harness in `detcoll-benches` (`benches/src/harness`).
//!
//! The `cargo xtask` alias builds xtask in release (`.cargo/config.toml`), so `cargo xtask bench`
//! is built once, optimised, and measures itself. What stays here is what needs cargo: a debug
//! xtask (`cargo run -p xtask -- bench`, without the alias) builds the release xtask and runs
//! `bench` with it, so the collectives are measured optimised (the workspace's dev profile is
//! barely optimised). `bench-rank` (the ranks the harness launches re-execute this binary with
//! it) forwards to [`detcoll_benches::run_rank`].
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

#[cfg(test)]
mod tests {
    /// The alias every `cargo xtask` goes through: release (a fresh clone builds xtask once, in
    /// the profile `bench` measures, instead of a debug xtask that then builds a release one)
    /// and not quiet (cargo's `Compiling ...` lines show at once what the first build does).
    #[test]
    fn the_alias_builds_xtask_once_in_release_and_shows_the_build() {
        let config = include_str!("../../.cargo/config.toml");
        let alias = config
            .lines()
            .find_map(|l| l.trim().strip_prefix("xtask").map(|r| r.trim_start()).and_then(|r| r.strip_prefix('=')))
            .expect("an xtask alias in .cargo/config.toml");
        let args: Vec<&str> = alias.trim().trim_matches('"').split_whitespace().collect();
        assert_eq!(args.first(), Some(&"run"), "{alias}");
        assert!(args.contains(&"--release"), "the alias must build release: {alias}");
        assert!(!args.iter().any(|a| *a == "--quiet" || *a == "-q"), "the alias must not hide the build: {alias}");
        assert!(args.windows(2).any(|w| w == ["--package", "xtask"] || w == ["-p", "xtask"]), "{alias}");
    }
}
