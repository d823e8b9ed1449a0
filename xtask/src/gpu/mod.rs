//! `cargo xtask gpu-bundle` and `cargo xtask gpu-test`: GPU suites on a host without Rust.
//!
//! The bundle holds the release test binaries of [`GPU_PACKAGES`](workspace::GPU_PACKAGES)
//! (those in the workspace), this xtask binary (for `gpu-test` and `bench`), the launcher, the
//! packages' examples and any prebuilt kernels from `kernels/build/`, all stripped, plus
//! `manifest.json` and `run.sh` (`./run.sh` = `./bin/xtask gpu-test --bundle .`).
//!
//! `--platform nvidia|rocm` ([`GpuPlatform`]) selects the cargo features the suites are built
//! with ([`suite_features`](platform::suite_features)): the CUDA or the ROCm side of
//! `ccl-transport` and the factory. A bundle records its platform in `manifest.json`.
//!
//! One job per module: [`bundle`] (writing a bundle, its manifest), [`workspace`] (what cargo
//! builds), [`platform`], [`mps`], [`suite_env`] (a suite's variables), [`suites`] (running one
//! suite: timeout, signals), [`summary`] (libtest counts, the table) and [`run`] (`gpu-test`).
//! This file holds the command lines.
use clap::Args;
use std::path::PathBuf;

mod bundle;
mod mps;
mod platform;
mod run;
mod suite_env;
mod suites;
mod summary;
mod workspace;

pub use bundle::bundle_main;
use mps::MpsMode;
use platform::GpuPlatform;
pub use run::test_main;
pub use suites::KERNEL_DIR_ENV;
pub(crate) use workspace::cargo_executables;

/// `cargo xtask gpu-bundle` options.
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

/// `cargo xtask gpu-test` options.
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
