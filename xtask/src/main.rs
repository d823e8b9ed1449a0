//! Project automation for detcoll, run as `cargo xtask <command>` (alias in `.cargo/config.toml`).
//!
//! * `build`: prebuilt kernel images (`--arch gfx942,gfx950,sm_90`) in `kernels/build/`;
//! * `bench`: the deterministic-collective benchmark (CPU twin without GPUs), whose harness is the
//!   `detcoll-benches` library (`benches/src/harness`);
//! * `ci`: what CI runs (fmt, build, test, criterion in test mode), stopping at the first failure;
//! * `gpu-bundle`: release test/bench binaries (+ prebuilt kernels) packed for a GPU host without Rust;
//! * `gpu-test`: runs the GPU suites (from cargo, or from a bundle) and prints a summary.
use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod bench;
mod build;
mod ci;
mod gpu;
mod util;

#[derive(Debug, Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", about = "detcoll project automation")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Benchmark the deterministic collectives (GPU backend when available, else the CPU twin).
    Bench(bench::BenchArgs),
    /// Build prebuilt kernel images for a comma list of gfxNNN / sm_XY targets into kernels/build/.
    Build(build::BuildArgs),
    /// One rank of a benchmark (started by `bench`, torchrun or mpirun; reads RANK, WORLD_SIZE, ...).
    #[command(name = "bench-rank", hide = true)]
    BenchRank(bench::BenchArgs),
    /// Run what CI runs: fmt check, build, tests, criterion benches in test mode.
    Ci(ci::CiArgs),
    /// Build and pack the GPU test suites, bench and prebuilt kernels for a GPU host.
    #[command(name = "gpu-bundle")]
    GpuBundle(gpu::BundleArgs),
    /// Run the GPU test suites (built by cargo, or from a bundle) and print a summary.
    #[command(name = "gpu-test")]
    GpuTest(gpu::GpuTestArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(args) => bench::main(args),
        Command::BenchRank(args) => bench::rank_main(args),
        Command::Build(args) => build::main(args),
        Command::Ci(args) => ci::main(args),
        Command::GpuBundle(args) => gpu::bundle_main(args),
        Command::GpuTest(args) => gpu::test_main(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn ranks_the_harness_launches_reach_bench_rank() {
        let cli = Cli::parse_from(["cargo xtask", detcoll_benches::RANK_COMMAND, "--nproc", "2"]);
        assert!(matches!(cli.command, Command::BenchRank(a) if a.nproc == 2));
    }
}
