//! Benchmarks of detcoll: the criterion benches (`benches/`) and the deterministic-collective
//! benchmark harness ([`harness`]), run by `cargo xtask bench` and by the `detcoll-bench`
//! binary. The harness is a library so that both binaries run the same code; it is not an API
//! for users (`publish = false`, errors are `anyhow`).
use std::process::ExitCode;

pub mod harness;
pub mod host_path;

pub use harness::args::BenchArgs;
pub use harness::{DETCOLL_BENCH, Frontend, RANK_COMMAND};

/// Sets the CUDA environment a run of `args` needs, where the environment does not say
/// otherwise:
/// * `CUDA_MODULE_LOADING=EAGER`. With CUDA's default lazy loading a kernel is loaded at its
///   first launch, which can wait for the device while a peer rank's collective kernel spins
///   waiting for this rank: ranks that are threads sharing one GPU (the `--e2e` layers launch
///   cuBLAS kernels between their collectives) could then stall until the collective's timeout.
/// * `CUDA_DEVICE_MAX_CONNECTIONS=32` for runs whose ranks are threads (`--threads`, `--e2e`):
///   with fewer hardware queues than rank streams (the default is 8), a rank's queued kernel
///   can sit in front of the peer kernel it waits for. Every GPU figure under
///   `benches/results/` was measured with 32.
///
/// # Safety
/// Sets environment variables: call it in `main` before the process has other threads and
/// before CUDA is initialised.
pub unsafe fn prepare_cuda_environment(args: &BenchArgs) {
    let mut vars = vec![("CUDA_MODULE_LOADING", "EAGER")];
    if args.threads || args.e2e.is_some() {
        vars.push(("CUDA_DEVICE_MAX_CONNECTIONS", "32"));
    }
    for (name, value) in vars {
        if std::env::var_os(name).is_none() {
            // SAFETY: the caller guarantees no other thread exists (see above).
            unsafe { std::env::set_var(name, value) };
        }
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
