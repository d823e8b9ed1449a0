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

/// Points the GPU backends of `bench` / `bench-rank` (run in this process and in the rank
/// processes it starts, which inherit the variable) at the prebuilt kernels, since the
/// libraries only look in `$DETCOLL_KERNEL_DIR` and next to the executable: `kernels/build/` of
/// this checkout (what `cargo xtask build` writes), else a GPU bundle's `kernels/` (this binary
/// is `<bundle>/bin/xtask`). A folder the caller chose is kept.
fn default_kernel_dir() {
    if std::env::var_os(gpu::KERNEL_DIR_ENV).is_some() {
        return;
    }
    let checkout = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../kernels/build");
    let bundle = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.parent()?.join("kernels")));
    if let Some(dir) = [Some(checkout), bundle].into_iter().flatten().find(|d| d.is_dir()) {
        let dir = dir.canonicalize().unwrap_or(dir);
        // SAFETY: called first thing in `main`, before this process starts any thread.
        unsafe { std::env::set_var(gpu::KERNEL_DIR_ENV, dir) };
    }
}

fn main() -> ExitCode {
    // Usage errors exit 1, not clap's 2: status 2 says every row ran but some row is not
    // bitwise (help and version still exit 0).
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::FAILURE } else { ExitCode::SUCCESS };
        }
    };
    if let Command::Bench(args) | Command::BenchRank(args) = &cli.command {
        default_kernel_dir();
        // SAFETY: still on the main thread, before any other thread and before CUDA starts.
        unsafe { detcoll_benches::prepare_cuda_environment(args) };
    }
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
    fn bench_takes_the_end_to_end_layers() {
        for layer in ["ffn", "attention"] {
            let cli = Cli::try_parse_from(["cargo xtask", "bench", "--e2e", layer, "--tokens", "64,128"]).unwrap();
            assert!(
                matches!(cli.command, Command::Bench(a) if a.e2e.map(|l| l.name()) == Some(layer) && a.tokens == [64, 128])
            );
        }
        for bad in [&["--e2e", "mlp"][..], &["--e2e"], &["--e2e", "ffn", "--tp", "16"]] {
            let argv = ["cargo xtask", "bench"].into_iter().chain(bad.iter().copied());
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn ranks_the_harness_launches_reach_bench_rank() {
        let cli = Cli::parse_from(["cargo xtask", detcoll_benches::RANK_COMMAND, "--nproc", "2"]);
        assert!(matches!(cli.command, Command::BenchRank(a) if a.nproc == 2));
    }
}
