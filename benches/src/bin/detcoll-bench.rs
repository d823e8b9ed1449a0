//! `detcoll-bench`: the deterministic-collective benchmark without xtask, e.g. on a GPU host
//! without Rust. Same flags as `cargo xtask bench`; a debug build measures itself (with a
//! warning) instead of rebuilding in release.
use clap::{Parser, Subcommand};
use detcoll_benches::{BenchArgs, DETCOLL_BENCH};
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "detcoll-bench",
    about = "Benchmark the deterministic collectives",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// Only for ranks the benchmark launches.
    #[command(subcommand)]
    rank: Option<Rank>,
    #[command(flatten)]
    args: BenchArgs,
}

#[derive(Debug, Subcommand)]
enum Rank {
    /// One rank of a benchmark (started by `detcoll-bench` itself: the harness re-executes this
    /// binary with `bench-rank`, as it does xtask).
    #[command(name = "bench-rank", hide = true)]
    BenchRank(BenchArgs),
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
    let args = match &cli.rank {
        Some(Rank::BenchRank(args)) => args,
        None => &cli.args,
    };
    // SAFETY: the main thread, before any other thread and before CUDA starts.
    unsafe { detcoll_benches::prepare_cuda_environment(args) };
    let result = match cli.rank {
        Some(Rank::BenchRank(args)) => detcoll_benches::run_rank(args, &DETCOLL_BENCH),
        None => detcoll_benches::run(cli.args, &DETCOLL_BENCH),
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
    fn the_rank_subcommand_is_the_one_the_harness_execs() {
        let cli = Cli::parse_from(["detcoll-bench", detcoll_benches::RANK_COMMAND, "--nproc", "2"]);
        assert!(matches!(cli.rank, Some(Rank::BenchRank(a)) if a.nproc == 2));
        let cli = Cli::parse_from(["detcoll-bench", "--nproc", "8", "--threads"]);
        assert!(cli.rank.is_none() && cli.args.nproc == 8 && cli.args.threads);
    }
}
