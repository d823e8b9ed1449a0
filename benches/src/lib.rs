//! Benchmarks of detcoll: the criterion benches (`benches/`) and the deterministic-collective
//! benchmark harness ([`harness`]), run by `cargo xtask bench` and by the `detcoll-bench`
//! binary. The harness is a library so that both binaries run the same code; it is not an API
//! for users (`publish = false`, errors are `anyhow`).
use std::process::ExitCode;

pub mod harness;
pub mod host_path;

pub use harness::args::BenchArgs;
pub use harness::{DETCOLL_BENCH, Frontend, RANK_COMMAND};

/// Sets `CUDA_MODULE_LOADING=EAGER` unless the environment says otherwise. With CUDA's default
/// lazy loading a kernel is loaded at its first launch, which can wait for the device while a
/// peer rank's collective kernel spins waiting for this rank: ranks that are threads sharing
/// one GPU (the `--e2e` layers launch cuBLAS kernels between their collectives) could then
/// stall until the collective's timeout.
///
/// # Safety
/// Sets an environment variable: call it first thing in `main`, before the process has other
/// threads and before CUDA is initialised.
pub unsafe fn prefer_eager_module_loading() {
    if std::env::var_os("CUDA_MODULE_LOADING").is_none() {
        // SAFETY: the caller guarantees no other thread exists (see above).
        unsafe { std::env::set_var("CUDA_MODULE_LOADING", "EAGER") };
    }
}

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
