//! Benchmarks of detcoll: the criterion benches (`benches/`) and the deterministic-collective
//! benchmark harness ([`harness`]), run by `cargo xtask bench` and by the `detcoll-bench`
//! binary. The harness is a library so that both binaries run the same code; it is not an API
//! for users (`publish = false`, errors are `anyhow`).
use std::process::ExitCode;

pub mod harness;
pub mod host_path;

pub use harness::args::BenchArgs;
pub use harness::{DETCOLL_BENCH, Frontend, RANK_COMMAND};

/// The benchmark: launches `args.nproc` ranks (re-executing this binary as [`RANK_COMMAND`]),
/// runs them as threads with `--threads`, or runs as one rank when a launcher (torchrun, mpirun,
/// detcoll-run) started this process.
pub fn run(args: BenchArgs, frontend: &Frontend) -> anyhow::Result<ExitCode> {
    harness::main(args, frontend)
}

/// [`RANK_COMMAND`]: one rank of a process world (RANK, WORLD_SIZE, ... set by the launcher).
pub fn run_rank(args: BenchArgs, frontend: &Frontend) -> anyhow::Result<ExitCode> {
    harness::rank_main(args, frontend)
}
