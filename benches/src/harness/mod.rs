//! The deterministic-collective benchmark, run by `cargo xtask bench` and `detcoll-bench`.
//!
//! Ranks are processes by default: [`main`] re-executes this binary as [`RANK_COMMAND`] under
//! `detcoll_launch::launch` (torchrun variables and a fresh random `DETCOLL_JOB_TOKEN` set), and
//! each rank joins through `TcpBootstrap::from_env`. A process started by torchrun/mpirun (RANK
//! and WORLD_SIZE set) acts as one rank directly. `--threads` runs the ranks as threads of one
//! process.
//!
//! Backends: NVIDIA (CUDA) when libcuda and a GPU are present, else AMD (HIP) when libamdhip64
//! and a GPU are present, else the CPU twin (`shm-ipc`), so the command always does its job. A GPU backend plugs in by implementing
//! [`backend::BenchBackend`] and adding a branch to `resolve_backend` and `run_process_rank`.
//!
//! Routing: every backend routes each call by one table ([`routes`]): process runs through the
//! factory, thread runs and the CPU twin through `collective_factory::Routed` over their IPC
//! collective. `--route NAME` forces one route for every op and size (the ranks a run launches
//! get `--route` too and build the same table); rows report the route each call runs.
//!
//! `--graph` (CUDA only): each sample replays one CUDA graph of `iterations` captured calls
//! instead of making `iterations` eager calls ([`run`] says how ranks are kept apart while
//! capturing). Per size the rows are the copy baseline (`memcpy`), the launch floor
//! (`empty_kernel`, GPU backends with the kernel) and the operations, each measured the same
//! way (eager or replayed).
//!
//! ```text
//! # world 2 as threads, every call forced onto the LL push route, eager then graph replay:
//! cargo xtask bench --backend cuda --threads --nproc 2 --route ipc_push_ll --output bench-out/t2-push-eager.json
//! cargo xtask bench --backend cuda --threads --nproc 2 --route ipc_push_ll --graph --output bench-out/t2-push-graph.json
//! # world 4 as processes sharing one GPU (start MPS first: nvidia-cuda-mps-control -d):
//! cargo xtask bench --backend cuda --nproc 4 --route ipc_push_ll --output bench-out/p4-push-eager.json
//! ```
use anyhow::Context;
use collective_core::Collective;
use collective_core::bootstrap::{Bootstrap, LocalBootstrap, TcpBootstrap};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

pub mod args;
pub mod backend;
pub mod clock;
mod cpu_twin;
pub(crate) mod cuda;
pub mod e2e;
pub(crate) mod hip;
mod native;
pub mod plot;
pub mod progress;
pub mod reference;
pub mod report;
pub mod routes;
pub mod run;
pub mod stats;
pub mod svg;
pub mod table;

use args::BackendChoice;
pub use args::BenchArgs;
use collective_factory::Platform;
// xtask's `gpu-test` picks its platform with the same probes the bench backends use.
use backend::{BenchBackend, HostBackend};
pub use cuda::available as cuda_available;
pub use hip::available as hip_available;
use report::{CapabilityFlags, HostInfo, Report, Row, SCHEMA_VERSION};

/// Exit status when every row ran but some row is not bitwise.
pub const EXIT_NOT_BITWISE: u8 = 2;
/// Set by `bench` for the ranks it launches (so the report can say how ranks were started).
const LAUNCH_ENV: &str = "DETCOLL_BENCH_LAUNCH";
/// The line printed when no GPU backend can run.
pub const NO_GPU_MESSAGE: &str = "no GPU backend available on this host; running the CPU twin";
/// The hidden subcommand a launched rank is started with. Every binary that runs the harness
/// (xtask, `detcoll-bench`) accepts it, so a rank re-executes whichever binary launched it.
pub const RANK_COMMAND: &str = "bench-rank";

/// The binary the harness runs in: what its reports call it, and how it re-runs itself
/// optimised. The harness is a library, so a debug build of it only knows it is unoptimised;
/// rebuilding in release is the binary's business (xtask knows cargo, `detcoll-bench` may run
/// on a host without it).
#[derive(Debug, Clone, Copy)]
pub struct Frontend {
    /// The report's `tool` field, e.g. `cargo xtask bench`.
    pub tool: &'static str,
    /// In a debug build without `--debug-build`: runs the same benchmark from a release build
    /// and returns its exit status. `None`: measure this build (with a warning).
    pub release: Option<fn(&BenchArgs) -> anyhow::Result<ExitCode>>,
}

/// `detcoll-bench`: no rebuild (build it with `--release`).
pub const DETCOLL_BENCH: Frontend = Frontend { tool: "detcoll-bench", release: None };

/// The backend that actually runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resolved {
    CpuTwin,
    Cuda,
    Hip,
    Memory,
}

impl Resolved {
    /// Whether it runs on GPUs (which picks the default sizes).
    fn is_gpu(self) -> bool {
        matches!(self, Resolved::Cuda | Resolved::Hip)
    }

    /// What the launched ranks are told to run (they do not re-detect).
    fn choice(self) -> BackendChoice {
        match self {
            Resolved::CpuTwin => BackendChoice::Cpu,
            Resolved::Cuda => BackendChoice::Cuda,
            Resolved::Hip => BackendChoice::Hip,
            Resolved::Memory => BackendChoice::Memory,
        }
    }
}

fn resolve_backend(choice: BackendChoice, announce: bool) -> anyhow::Result<Resolved> {
    match choice {
        BackendChoice::Auto => {
            if cuda::available() {
                if announce {
                    eprintln!("[bench] NVIDIA GPU(s) found: {}", cuda::device_count());
                }
                return Ok(Resolved::Cuda);
            }
            if hip::available() {
                if announce {
                    eprintln!("[bench] AMD GPU(s) found: {}", hip::device_count());
                }
                return Ok(Resolved::Hip);
            }
            if announce {
                eprintln!("{NO_GPU_MESSAGE}");
            }
            Ok(Resolved::CpuTwin)
        }
        BackendChoice::Cpu => Ok(Resolved::CpuTwin),
        BackendChoice::Cuda => {
            anyhow::ensure!(
                cuda::available(),
                "--backend cuda: no CUDA driver or no CUDA device on this host; use --backend cpu or auto"
            );
            Ok(Resolved::Cuda)
        }
        BackendChoice::Hip => {
            anyhow::ensure!(
                hip::available(),
                "--backend hip: no HIP runtime (libamdhip64) or no AMD GPU on this host; use --backend cpu or auto"
            );
            Ok(Resolved::Hip)
        }
        BackendChoice::Memory => Ok(Resolved::Memory),
    }
}

/// `--graph` needs CUDA graphs: only the CUDA backend has them; `--replays` needs `--graph`.
fn check_graph(args: &BenchArgs, resolved: Resolved) -> anyhow::Result<()> {
    anyhow::ensure!(args.graph || args.replays == 1, "--replays {} applies to --graph runs only", args.replays);
    anyhow::ensure!(
        !args.graph || resolved == Resolved::Cuda,
        "--graph captures CUDA graphs and needs the CUDA backend; this run uses the {} backend",
        match resolved {
            Resolved::CpuTwin => "cpu",
            Resolved::Cuda => "cuda",
            Resolved::Hip => "hip",
            Resolved::Memory => "memory",
        }
    );
    Ok(())
}

/// The `--route` table for the factory's `Config::with_routing` (process runs; `None`: the
/// factory's own choice).
fn forced(args: &BenchArgs, platform: Platform) -> anyhow::Result<Option<collective_factory::Routing>> {
    args.route.as_deref().map(|r| routes::forced_routing(r, platform)).transpose()
}

/// Whether this process was started as one rank by a launcher (torchrun, mpirun, detcoll-run).
fn launched_as_rank() -> bool {
    std::env::var_os("RANK").is_some() && std::env::var_os("WORLD_SIZE").is_some()
}

/// The benchmark (`cargo xtask bench`, `detcoll-bench`): launches the ranks, or runs as one
/// when a launcher started this process.
pub fn main(args: BenchArgs, frontend: &Frontend) -> anyhow::Result<ExitCode> {
    e2e::check_flags(&args)?;
    if args.e2e.is_some() {
        anyhow::ensure!(!launched_as_rank(), "--e2e runs its ranks as threads of one process, not under a launcher");
        if cfg!(debug_assertions) && !args.debug_build {
            match frontend.release {
                Some(release) => return release(&args),
                None => {
                    eprintln!("[bench] warning: this is an unoptimised build; for real numbers build it with --release")
                }
            }
        }
        return e2e::main(&args, frontend.tool);
    }
    if launched_as_rank() && !args.threads {
        return rank_main(args, frontend);
    }
    // Before any row runs: a report that cannot be written would lose the whole run.
    check_output(&args.output)?;
    // The GPU defaults include the CPU ones: checked before the backend is known.
    args.check_world()?;
    args.clone().or_default_sizes(true).check_shapes(args.nproc)?;
    if cfg!(debug_assertions) && !args.debug_build {
        match frontend.release {
            Some(release) => return release(&args),
            None => {
                eprintln!("[bench] warning: this is an unoptimised build; for real numbers build it with --release")
            }
        }
    }
    let resolved = resolve_backend(args.backend, true)?;
    check_graph(&args, resolved)?;
    let args = args.or_default_sizes(resolved.is_gpu());
    if args.threads {
        return run_threads(&args, resolved, frontend.tool);
    }
    anyhow::ensure!(resolved != Resolved::Memory, "--backend memory runs with --threads only");
    let exe = std::env::current_exe().context("locating this executable to start the ranks")?;
    let mut rank_args = args.clone();
    rank_args.backend = resolved.choice();
    let mut spec = detcoll_launch::LaunchSpec::new(args.nproc, exe)
        .args(std::iter::once(RANK_COMMAND.to_owned()).chain(rank_args.to_cli_args()))
        .env(LAUNCH_ENV, "processes");
    spec.virtual_nodes = args.virtual_nodes;
    if resolved == Resolved::Cuda && args.nproc > cuda::device_count() {
        eprintln!(
            "[bench] {} ranks on {} GPU(s): ranks share GPUs, which runs concurrently only under MPS \
             (nvidia-cuda-mps-control -d); CUDA_DEVICE_MAX_CONNECTIONS=2 unless set (MPS's connection limit)",
            args.nproc,
            cuda::device_count()
        );
        if std::env::var_os("CUDA_DEVICE_MAX_CONNECTIONS").is_none() {
            spec = spec.env("CUDA_DEVICE_MAX_CONNECTIONS", "2");
        }
    }
    if resolved == Resolved::Hip {
        hip::check_processes(args.nproc)?;
    }
    // Ranks write straight to our stdout/stderr: only rank 0 prints progress and the table.
    spec.prefix_output = false;
    let outcome = detcoll_launch::launch(&spec).context("launching the bench ranks")?;
    if outcome.success() {
        return Ok(ExitCode::SUCCESS);
    }
    let (rank, status) = outcome.first_failure.unwrap_or((0, outcome.statuses[0]));
    if status.code() == Some(EXIT_NOT_BITWISE as i32) {
        return Ok(ExitCode::from(EXIT_NOT_BITWISE));
    }
    anyhow::bail!("bench rank {rank} failed ({status}); the other ranks were stopped")
}

/// `bench-rank`: one rank of a process world (RANK, WORLD_SIZE, ... set by the launcher).
pub fn rank_main(args: BenchArgs, frontend: &Frontend) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.e2e.is_none(), "--e2e runs its ranks as threads of one process, not as launched ranks");
    anyhow::ensure!(!args.threads, "--threads cannot be combined with a torchrun/mpirun launch");
    let boot = Arc::new(TcpBootstrap::from_env().context("joining the bench ranks (torchrun variables)")?);
    let (rank, world) = (boot.rank(), boot.world_size());
    let result = (|| {
        collective_core::check_world_size(world).with_context(|| format!("WORLD_SIZE={world}"))?;
        if rank == 0 && args.nproc != world && std::env::var_os(LAUNCH_ENV).is_none() {
            eprintln!("[bench] WORLD_SIZE={world} from the launcher overrides --nproc {}", args.nproc);
        }
        if rank == 0 && cfg!(debug_assertions) && std::env::var_os(LAUNCH_ENV).is_none() {
            eprintln!("[bench] warning: this is an unoptimised build; for real numbers launch a release build");
        }
        let resolved = resolve_backend(args.backend, rank == 0)?;
        check_graph(&args, resolved)?;
        let args = args.or_default_sizes(resolved.is_gpu());
        args.check_shapes(world)?;
        run_process_rank(&args, resolved, boot.clone(), frontend.tool)
    })();
    match result {
        Ok(true) => Ok(ExitCode::SUCCESS),
        Ok(false) => Ok(ExitCode::from(EXIT_NOT_BITWISE)),
        Err(e) => Err(e.context(format!("bench rank {rank} of {world}"))),
    }
}

fn run_process_rank(args: &BenchArgs, resolved: Resolved, boot: Arc<TcpBootstrap>, tool: &str) -> anyhow::Result<bool> {
    let launch = Launch { how: if std::env::var_os(LAUNCH_ENV).is_some() { "processes" } else { "external" }, tool };
    match resolved {
        Resolved::CpuTwin => {
            let routing = routes::run_routing(args.route.as_deref(), Platform::Cpu, boot.world_size())?;
            let cfg = cpu_twin::config(args.capacity(), &routing);
            let b = cpu_twin::process(boot.clone(), args.capacity(), &routing)?;
            let ok = run_rank(&b, &*boot, args, launch, cpu_twin::config_json(&cfg, &routing))?;
            b.comm().close().context("closing the collective")?;
            Ok(ok)
        }
        Resolved::Cuda => {
            let b = cuda::process(boot.clone(), args.capacity(), forced(args, Platform::Nvidia)?)?;
            let config = gpu_config(args, b.comm().routing(), b.natives().library(), &["NCCL_", "CUDA_"]);
            let ok = run_rank(&b, &*boot, args, launch, config)?;
            b.natives().close()?;
            b.comm().close().context("closing the collective")?;
            Ok(ok)
        }
        Resolved::Hip => {
            let b = hip::process(boot.clone(), args.capacity(), forced(args, Platform::Rocm)?)?;
            let env = ["HIP_", "ROCR_", "HSA_", "NCCL_", "RCCL_", "DETCOLL_"];
            let config = gpu_config(args, b.comm().routing(), b.natives().library(), &env);
            let ok = run_rank(&b, &*boot, args, launch, config)?;
            b.natives().close()?;
            b.comm().close().context("closing the collective")?;
            Ok(ok)
        }
        Resolved::Memory => anyhow::bail!("--backend memory runs with --threads only"),
    }
}

/// What a GPU rank's report records about its configuration: capacity, the agreed routing,
/// the native library, and the environment variables (by prefix) that change what runs.
fn gpu_config(
    args: &BenchArgs,
    routing: &collective_factory::Routing,
    native_library: Option<String>,
    env_prefixes: &[&str],
) -> serde_json::Value {
    serde_json::json!({
        "capacity_bytes": args.capacity(),
        // An object, not a string of JSON, so readers get typed fields.
        "routing": serde_json::from_str::<serde_json::Value>(&routing.canonical_json()).unwrap_or_default(),
        "timeouts_ms": report::timeouts_ms(None),
        "native_library": native_library,
        "native_tree_simple_env": "NCCL_ALGO=Tree NCCL_PROTO=Simple",
        "env": env_vars(env_prefixes),
    })
}

/// What a GPU thread run's report records: capacity, the routing table every rank uses, and
/// the LL push capacity it gives.
fn thread_config(args: &BenchArgs, routing: &collective_factory::Routing) -> serde_json::Value {
    serde_json::json!({
        "capacity_bytes": args.capacity(),
        "routing": serde_json::from_str::<serde_json::Value>(&routing.canonical_json()).unwrap_or_default(),
        "ll_capacity_bytes": routing.ll_capacity(detcoll_protocol::DEFAULT_LL_CAPACITY),
    })
}

/// The variables of this process whose names start with one of `prefixes` (NCCL_*, CUDA_*,
/// HIP_*, ...: they change what a GPU run measures).
fn env_vars(prefixes: &[&str]) -> serde_json::Value {
    let vars: serde_json::Map<String, serde_json::Value> = std::env::vars()
        .filter(|(k, _)| prefixes.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    serde_json::Value::Object(vars)
}

fn run_threads(args: &BenchArgs, resolved: Resolved, tool: &str) -> anyhow::Result<ExitCode> {
    let world = args.nproc;
    let boots = LocalBootstrap::group(world);
    let results: Vec<anyhow::Result<bool>> = match resolved {
        Resolved::CpuTwin => {
            let routing = routes::run_routing(args.route.as_deref(), Platform::Cpu, world)?;
            let cfg = cpu_twin::config(args.capacity(), &routing);
            let ranks = cpu_twin::group(world, args.capacity(), &routing)?;
            run_thread_ranks(ranks, boots, args, tool, &cpu_twin::config_json(&cfg, &routing))
        }
        Resolved::Cuda => {
            let routing = routes::run_routing(args.route.as_deref(), Platform::Nvidia, world)?;
            let ranks = cuda::group(world, args.capacity(), &routing)?;
            run_thread_ranks(ranks, boots, args, tool, &thread_config(args, &routing))
        }
        Resolved::Hip => {
            let routing = routes::run_routing(args.route.as_deref(), Platform::Rocm, world)?;
            let ranks = hip::group(world, args.capacity(), &routing)?;
            run_thread_ranks(ranks, boots, args, tool, &thread_config(args, &routing))
        }
        Resolved::Memory => {
            anyhow::ensure!(args.route.is_none(), "--route: the memory reference collective has no routes");
            use collective_core::conformance::memory::{Flaw, MemoryCollective};
            let ranks = LocalBootstrap::group(world)
                .into_iter()
                .map(|b| HostBackend::new(MemoryCollective::new(b, args.capacity(), Flaw::None), "memory-reference"))
                .collect();
            run_thread_ranks(ranks, boots, args, tool, &serde_json::json!({ "capacity_bytes": args.capacity() }))
        }
    };
    let mut all_ok = true;
    let mut errors = Vec::new();
    for (r, res) in results.into_iter().enumerate() {
        match res {
            Ok(ok) => all_ok &= ok,
            Err(e) => errors.push(format!("rank {r}: {e:#}")),
        }
    }
    if !errors.is_empty() {
        anyhow::bail!("bench failed:\n{}", errors.join("\n"));
    }
    Ok(if all_ok { ExitCode::SUCCESS } else { ExitCode::from(EXIT_NOT_BITWISE) })
}

fn run_thread_ranks<B>(
    ranks: Vec<B>,
    boots: Vec<LocalBootstrap>,
    args: &BenchArgs,
    tool: &str,
    config: &serde_json::Value,
) -> Vec<anyhow::Result<bool>>
where
    B: BenchBackend + Send,
{
    std::thread::scope(|s| {
        let handles: Vec<_> = ranks
            .into_iter()
            .zip(boots)
            .map(|(b, boot)| {
                s.spawn(move || {
                    let ok = run_rank(&b, &boot, args, Launch { how: "threads", tool }, config.clone())?;
                    b.comm().close().context("closing the collective")?;
                    Ok(ok)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("rank thread panicked")))).collect()
    })
}

/// How this rank was started, for its report: `how` is `processes`, `external` or `threads`;
/// `tool` is [`Frontend::tool`].
#[derive(Debug, Clone, Copy)]
struct Launch<'a> {
    how: &'a str,
    tool: &'a str,
}

/// Runs every row on this rank; rank 0 writes the JSON report and the SVG plot and prints the
/// markdown table. Returns whether every row is bitwise (same on every rank).
fn run_rank<B: BenchBackend>(
    b: &B,
    boot: &dyn Bootstrap,
    args: &BenchArgs,
    launch: Launch<'_>,
    backend_config: serde_json::Value,
) -> anyhow::Result<bool> {
    let rows = run::run_rows(b, boot, args)?;
    let all_bitwise = rows.iter().all(Row::bitwise);
    if b.comm().rank() == 0 {
        let report = build_report(b, args, launch, backend_config, rows);
        let svg = write_report(&report, &args.output)?;
        print!("{}", table::markdown(&report));
        eprintln!("[bench] wrote {}, {} and its .png", args.output.display(), svg.display());
        if !all_bitwise {
            eprintln!("[bench] some rows are NOT bitwise (see `mismatch` in the report)");
        }
    }
    Ok(all_bitwise)
}

fn build_report<B: BenchBackend>(
    b: &B,
    args: &BenchArgs,
    launch: Launch<'_>,
    backend_config: serde_json::Value,
    rows: Vec<Row>,
) -> Report {
    let world = b.comm().world_size();
    let host = host_info();
    let native_ran = rows.iter().any(|r| r.native_default_us.is_some());
    let mut notes = vec![
        "peak_temp_bytes is 0: calls allocate nothing; staging is retained (workspace_bytes)".to_owned(),
        if native_ran {
            "native_* fields: the native library's own all_reduce/reduce_scatter (NOT deterministic: a non-strict \
             performance reference) and ncclAllGather, on the same buffers in the same run; native_default_us with the \
             library's defaults, native_tree_simple_us with NCCL_ALGO=Tree NCCL_PROTO=Simple set at that \
             communicator's creation (all_reduce only: NCCL has no Tree algorithm for the others); ratio_vs_native = median_us / native_default_us; max_abs_diff_vs_native is the \
             native default output against the fixed tree"
                .to_owned()
        } else {
            "native_* fields are null: no native NCCL/RCCL reference ran (it needs a GPU per rank and the library)"
                .to_owned()
        },
        "memcpy rows: the same bytes copied with a plain copy in the same run; memcpy_median_us with all ranks copying \
         at once, memcpy_one_rank_median_us with rank 0 alone"
            .to_owned(),
    ];
    if rows.iter().any(|r| r.operation == run::EMPTY_KERNEL) {
        notes.push(
            "empty_kernel rows: the empty kernel detcoll_noop launched once per iteration on every rank's stream at once \
             (the launch floor), measured per size next to the copy; ratio_vs_empty_kernel = median_us / \
             empty_kernel_median_us"
                .to_owned(),
        );
    }
    if args.graph {
        notes.push(
            "graph: each rank captured `iterations` calls into one CUDA graph (every rank instantiated before any \
             replayed); a sample is one replay timed with events, per call = replay time / iterations; warm-up = one \
             untimed replay; no native reference under --graph"
                .to_owned(),
        );
    }
    if let Some(r) = &args.route {
        notes.push(format!(
            "forced route: every call was routed to {r} (--route; a table with one rule per op); `route` is what each \
             call ran (ipc_push_ll calls whose payload exceeds the LL capacity run ipc_one_shot, ops that cannot take \
             ipc_rs_ag run ipc_one_shot, all_gather under ipc_rs_transport_ag runs transport)"
        ));
    }
    if host.cpu_count < world {
        notes.push(format!(
            "{world} ranks share {} CPUs: ranks time-share cores, so latencies include scheduling delays",
            host.cpu_count
        ));
    }
    let mut args_value = Report::args_value(args);
    if let Some(o) = args_value.as_object_mut() {
        o.insert("backend_config".to_owned(), backend_config);
    }
    let now = clock::unix_now();
    Report {
        schema_version: SCHEMA_VERSION,
        tool: launch.tool.to_owned(),
        backend: b.name().to_owned(),
        build_profile: if cfg!(debug_assertions) { "debug" } else { "release" }.to_owned(),
        world_size: world,
        launch: launch.how.to_owned(),
        dtype: args.dtype.dtype().name().to_owned(),
        reduction_order: report::reduction_order(world),
        git_commit: clock::git_commit(),
        capabilities: CapabilityFlags::from(b.comm().capabilities()),
        size_convention: report::SIZE_CONVENTION.to_owned(),
        latency_method: report::LATENCY_METHOD.to_owned(),
        graph: args.graph,
        forced_route: args.route.clone(),
        host,
        args: args_value,
        timestamp_unix: now,
        timestamp_utc: clock::utc_string(now),
        notes,
        all_bitwise: rows.iter().all(Row::bitwise),
        rows,
    }
}

fn host_info() -> HostInfo {
    HostInfo {
        hostname: clock::hostname(),
        cpu_count: std::thread::available_parallelism().map_or(1, |n| n.get()),
        os: std::env::consts::OS.to_owned(),
        arch: std::env::consts::ARCH.to_owned(),
    }
}

/// Writes `report` as JSON to `path` and the plot next to it; returns the plot's path.
fn write_report(report: &Report, path: &Path) -> anyhow::Result<PathBuf> {
    write_outputs(path, &serde_json::to_string_pretty(report)?, &plot::svg(report))
}

/// Refuses a report path the run could not write, before the run: the JSON must not be one of
/// the plot's files (`--output x.svg` overwrote the report with the plot), its folder must be
/// creatable and the three files openable for writing. Files that did not exist are not left
/// behind.
pub(crate) fn check_output(path: &Path) -> anyhow::Result<()> {
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    anyhow::ensure!(
        !matches!(ext.as_deref(), Some("svg" | "png")),
        "--output {}: that is the JSON report's path; the plot is written next to it (.svg and .png): \
         give a .json path",
        path.display()
    );
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("--output: creating {}", dir.display()))?;
    }
    for p in [path.to_path_buf(), path.with_extension("svg"), path.with_extension("png")] {
        let existed = p.exists();
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(&p)
            .with_context(|| format!("--output: {} cannot be written", p.display()))?;
        if !existed {
            let _ = std::fs::remove_file(&p);
        }
    }
    Ok(())
}

/// Writes `json` to `path` and the plot `svg` next to it as `.svg` and `.png` (creating the
/// folder); returns the SVG's path.
pub(crate) fn write_outputs(path: &Path, json: &str, svg_text: &str) -> anyhow::Result<PathBuf> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, format!("{json}\n")).with_context(|| format!("writing {}", path.display()))?;
    let svg = path.with_extension("svg");
    std::fs::write(&svg, svg_text).with_context(|| format!("writing {}", svg.display()))?;
    let png = path.with_extension("png");
    std::fs::write(&png, plot::png(svg_text)?).with_context(|| format!("writing {}", png.display()))?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct W {
        #[command(flatten)]
        a: BenchArgs,
    }

    fn small_args(out: &Path, backend: &str, world: usize) -> BenchArgs {
        let o = out.to_string_lossy().into_owned();
        W::parse_from([
            "x",
            "--threads",
            "--backend",
            backend,
            "--nproc",
            &world.to_string(),
            "--size-bytes",
            "4096",
            "65536",
            "--warmup",
            "1",
            "--iterations",
            "2",
            "--samples",
            "2",
            "--output",
            &o,
        ])
        .a
    }

    fn check_report(path: &Path, world: usize, backend: &str) {
        let text = std::fs::read_to_string(path).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["schema_version"], SCHEMA_VERSION);
        assert_schema(&v);
        assert_eq!(v["world_size"], world);
        assert_eq!(v["backend"], backend);
        assert_eq!(v["reduction_order"], report::reduction_order(world));
        assert_eq!(v["capabilities"]["supports_async_overlap"], false);
        assert_eq!(v["capabilities"]["supports_compute_communication_fusion"], false);
        assert_eq!(v["all_bitwise"], true);
        let rows = v["rows"].as_array().unwrap();
        // 2 sizes x (4 ops + memcpy).
        assert_eq!(rows.len(), 10);
        for r in rows {
            for key in [
                "operation",
                "size_bytes",
                "route",
                "median_us",
                "min_us",
                "max_us",
                "input_gbps",
                "repeat_bitwise",
                "bitwise_vs_fixed_tree",
                "workspace_bytes",
                "peak_temp_bytes",
                "ratio_vs_memcpy",
                "native_default_us",
                "native_tree_simple_us",
                "ratio_vs_native",
            ] {
                assert!(r.get(key).is_some(), "row lacks {key}: {r}");
            }
            assert_eq!(r["repeat_bitwise"], true);
            assert!(r["median_us"].as_f64().unwrap() > 0.0);
            assert!(r["native_default_us"].is_null());
            if r["operation"] != "memcpy" {
                assert_eq!(r["bitwise_vs_fixed_tree"], true);
                assert!(r["ratio_vs_memcpy"].as_f64().unwrap() > 0.0);
            }
        }
        // The typed report reads back.
        let back: Report = serde_json::from_str(&text).unwrap();
        assert_eq!(back.rows.len(), 10);
        let svg = std::fs::read_to_string(path.with_extension("svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("all_reduce") && svg.contains("memcpy (baseline)"));
    }

    /// JSON types a field may have: `s` string, `n` number, `b` bool, `o` object, `a` array,
    /// `0` null.
    fn assert_type(path: &str, v: &serde_json::Value, allowed: &str) {
        let t = match v {
            serde_json::Value::String(_) => 's',
            serde_json::Value::Number(_) => 'n',
            serde_json::Value::Bool(_) => 'b',
            serde_json::Value::Object(_) => 'o',
            serde_json::Value::Array(_) => 'a',
            serde_json::Value::Null => '0',
        };
        assert!(allowed.contains(t), "{path}: {v} is not one of {allowed:?}");
    }

    /// Walks the whole report: every field has its documented type, and there is no field this
    /// list does not know (a new field must be added here, with its type).
    fn assert_schema(v: &serde_json::Value) {
        let walk = |path: &str, v: &serde_json::Value, spec: &[(&str, &str)]| {
            let o = v.as_object().unwrap_or_else(|| panic!("{path} is not an object: {v}"));
            for (k, t) in spec {
                assert_type(&format!("{path}.{k}"), o.get(*k).unwrap_or_else(|| panic!("{path} lacks {k}")), t);
            }
            for k in o.keys() {
                assert!(spec.iter().any(|(s, _)| s == k), "{path}.{k}: a field the schema test does not know");
            }
        };
        let top = [
            ("schema_version", "n"),
            ("tool", "s"),
            ("backend", "s"),
            ("build_profile", "s"),
            ("world_size", "n"),
            ("launch", "s"),
            ("dtype", "s"),
            ("reduction_order", "s"),
            ("git_commit", "s"),
            ("capabilities", "o"),
            ("size_convention", "s"),
            ("latency_method", "s"),
            ("graph", "b"),
            ("forced_route", "s0"),
            ("host", "o"),
            ("args", "o"),
            ("timestamp_unix", "n"),
            ("timestamp_utc", "s"),
            ("notes", "a"),
            ("all_bitwise", "b"),
            ("rows", "a"),
        ];
        walk("", v, &top);
        let caps = [
            ("strict_fixed_order", "b"),
            ("supports_async_overlap", "b"),
            ("supports_compute_communication_fusion", "b"),
            ("supports_graph_capture", "b"),
            ("capacity_bytes", "n"),
        ];
        walk("capabilities", &v["capabilities"], &caps);
        walk("host", &v["host"], &[("hostname", "s"), ("cpu_count", "n"), ("os", "s"), ("arch", "s")]);
        let args = [
            ("nproc", "n"),
            ("dtype", "s"),
            ("operations", "a"),
            ("size_bytes", "a"),
            ("warmup", "n"),
            ("iterations", "n"),
            ("samples", "n"),
            ("output", "s"),
            ("backend", "s"),
            ("threads", "b"),
            ("debug_build", "b"),
            ("seed", "n"),
            ("route", "s0"),
            ("graph", "b"),
            ("replays", "n"),
            ("capacity_bytes", "n0"),
            ("backend_config", "o"),
        ];
        walk("args", &v["args"], &args);
        let cfg = &v["args"]["backend_config"];
        assert_type("args.backend_config.capacity_bytes", &cfg["capacity_bytes"], "n");
        if let Some(t) = cfg.get("timeouts_ms") {
            walk("args.backend_config.timeouts_ms", t, &[("peer", "n"), ("close", "n")]);
        }
        if let Some(r) = cfg.get("routing") {
            assert_type("args.backend_config.routing", r, "o");
        }
        for n in v["notes"].as_array().unwrap() {
            assert_type("notes[]", n, "s");
        }
        let row = [
            ("operation", "s"),
            ("dtype", "s"),
            ("size_bytes", "n"),
            ("input_bytes_per_rank", "n"),
            ("output_bytes_per_rank", "n"),
            ("lanes", "n"),
            ("route", "s"),
            ("graph", "b"),
            ("median_us", "n"),
            ("min_us", "n"),
            ("max_us", "n"),
            ("per_rank_median_us", "a"),
            ("input_gbps", "n"),
            ("memcpy_median_us", "n0"),
            ("ratio_vs_memcpy", "n0"),
            ("memcpy_one_rank_median_us", "n0"),
            ("ratio_vs_memcpy_one_rank", "n0"),
            ("empty_kernel_median_us", "n0"),
            ("ratio_vs_empty_kernel", "n0"),
            ("repeat_bitwise", "b"),
            ("bitwise_vs_fixed_tree", "b0"),
            ("mismatch", "s0"),
            ("workspace_bytes", "n"),
            ("peak_temp_bytes", "n"),
            ("native_default_us", "n0"),
            ("native_tree_simple_us", "n0"),
            ("ratio_vs_native", "n0"),
            ("max_abs_diff_vs_native", "n0"),
        ];
        for (i, r) in v["rows"].as_array().unwrap().iter().enumerate() {
            walk(&format!("rows[{i}]"), r, &row);
            for m in r["per_rank_median_us"].as_array().unwrap() {
                assert_type(&format!("rows[{i}].per_rank_median_us[]"), m, "n");
            }
        }
    }

    #[test]
    fn the_schema_walk_catches_a_string_where_a_number_belongs() {
        let r = std::panic::catch_unwind(|| assert_type("x", &serde_json::json!("10s"), "n"));
        assert!(r.is_err());
        assert_type("x", &serde_json::json!(10.0), "n0");
    }

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("detcoll-bench-test-{}-{name}", std::process::id())).join("bench.json")
    }

    #[test]
    fn threads_with_the_memory_reference_collective() {
        let out = tmp("memory");
        let a = small_args(&out, "memory", 2);
        assert_eq!(run_threads(&a, Resolved::Memory, "test").unwrap(), ExitCode::SUCCESS);
        check_report(&out, 2, "memory-reference");
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    }

    #[test]
    fn hip_without_the_runtime_is_an_error_and_auto_falls_back() {
        if hip::available() {
            eprintln!("skipped: an AMD GPU is present");
            return;
        }
        let e = resolve_backend(BackendChoice::Hip, false).unwrap_err().to_string();
        assert!(e.contains("--backend hip"), "{e}");
        if !cuda::available() {
            assert_eq!(resolve_backend(BackendChoice::Auto, false).unwrap(), Resolved::CpuTwin);
        }
        let out = tmp("hip");
        assert!(run_threads(&small_args(&out, "hip", 2), Resolved::Hip, "test").is_err());
        assert_eq!(Resolved::Hip.choice(), BackendChoice::Hip);
    }

    fn rows_of(path: &Path) -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
    }

    #[test]
    fn threads_with_a_forced_route_route_every_op_there() {
        for world in [2, 4] {
            let out = tmp(&format!("push{world}"));
            let mut a = small_args(&out, "cpu", world);
            a.size_bytes = vec![4096, 1 << 20];
            a.route = Some("ipc_push_ll".to_owned());
            assert_eq!(run_threads(&a, Resolved::CpuTwin, "test").unwrap(), ExitCode::SUCCESS);
            let v = rows_of(&out);
            assert_schema(&v);
            assert_eq!((v["forced_route"].as_str(), v["graph"].as_bool()), (Some("ipc_push_ll"), Some(false)));
            assert_eq!(v["args"]["route"], "ipc_push_ll");
            assert_eq!(v["all_bitwise"], true);
            let rules = v["args"]["backend_config"]["routing"]["rules"].as_array().unwrap();
            assert_eq!(rules.len(), 4);
            assert!(rules.iter().all(|r| r["route"] == "ipc_push_ll"), "{rules:?}");
            assert!(v["args"]["backend_config"]["ll_capacity_bytes"].as_u64().unwrap() > 0);
            assert!(v["notes"].as_array().unwrap().iter().any(|n| n.as_str().unwrap().contains("forced route")));
            for r in v["rows"].as_array().unwrap() {
                let (op, size) = (r["operation"].as_str().unwrap(), r["size_bytes"].as_u64().unwrap());
                // The push payload of a 1 MiB all_reduce or all_gather exceeds the 512 KiB LL
                // capacity: those calls run (and report) the one-shot pull route.
                let want = match (op, size) {
                    ("memcpy", _) => "host_memcpy",
                    ("all_reduce" | "all_gather", s) if s > 512 << 10 => "ipc_one_shot",
                    _ => "ipc_push_ll",
                };
                assert_eq!(r["route"], want, "{op} {size} at world {world}");
                assert_eq!(r["graph"], false);
            }
            let md = table::markdown(&serde_json::from_value(v).unwrap());
            assert!(md.contains("eager, route ipc_push_ll forced)"), "{md}");
            let _ = std::fs::remove_dir_all(out.parent().unwrap());
        }
    }

    #[test]
    fn a_forced_rs_ag_route_applies_to_all_reduce_only() {
        let out = tmp("rsag");
        let mut a = small_args(&out, "cpu", 2);
        a.route = Some("ipc_rs_ag".to_owned());
        assert_eq!(run_threads(&a, Resolved::CpuTwin, "test").unwrap(), ExitCode::SUCCESS);
        for r in rows_of(&out)["rows"].as_array().unwrap() {
            let want = match r["operation"].as_str().unwrap() {
                "memcpy" => "host_memcpy",
                "all_reduce" => "ipc_rs_ag",
                _ => "ipc_one_shot",
            };
            assert_eq!(r["route"], want, "{r}");
        }
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
    }

    #[test]
    fn routes_and_graphs_a_backend_cannot_take_are_errors() {
        let out = tmp("refused");
        let mut a = small_args(&out, "cpu", 2);
        a.route = Some("transport".to_owned());
        let e = run_threads(&a, Resolved::CpuTwin, "test").unwrap_err().to_string();
        assert!(e.contains("transport") && e.contains("has none"), "{e}");
        a.route = Some("ipc_push_ll".to_owned());
        assert!(run_threads(&a, Resolved::Memory, "test").unwrap_err().to_string().contains("--route"));
        a.route = None;
        a.graph = true;
        for r in [Resolved::CpuTwin, Resolved::Hip, Resolved::Memory] {
            let e = check_graph(&a, r).unwrap_err().to_string();
            assert!(e.contains("--graph") && e.contains("CUDA"), "{e}");
        }
        check_graph(&a, Resolved::Cuda).unwrap();
        // Past the front door the harness refuses too (the CPU twin captures no graphs).
        let e = run_threads(&a, Resolved::CpuTwin, "test").unwrap_err().to_string();
        assert!(e.contains("--graph"), "{e}");
        assert!(!out.exists());
    }

    #[test]
    fn threads_with_the_cpu_twin() {
        for world in [1, 4] {
            let out = tmp(&format!("cpu{world}"));
            let a = small_args(&out, "cpu", world);
            assert_eq!(run_threads(&a, Resolved::CpuTwin, "test").unwrap(), ExitCode::SUCCESS);
            check_report(&out, world, "cpu-twin");
            let _ = std::fs::remove_dir_all(out.parent().unwrap());
        }
    }
}
