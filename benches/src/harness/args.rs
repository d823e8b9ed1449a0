//! Command-line arguments of `cargo xtask bench` (the seeds' benchmark script's flags).
use clap::{Args, ValueEnum};
use collective_core::{DType, Op};
use serde::Serialize;
use std::path::PathBuf;

/// Default sizes on a GPU: every power of two from 4 KiB to 64 MiB, so a plot shows where each
/// route takes over (the seeds' 4 KiB, 64 KiB, 1 MiB, 16 MiB are among them).
pub fn default_gpu_sizes() -> Vec<usize> {
    (12..=26).map(|p| 1usize << p).collect()
}

/// Default sizes on the CPU twin: 4 KiB to 4 MiB by 4x, a subset of the GPU sizes, so that the
/// default run (4 processes, often on 2 cores) stays under a minute.
pub fn default_cpu_sizes() -> Vec<usize> {
    (6..=11).map(|p| 1usize << (2 * p)).collect()
}
/// Default `--output` (an `--e2e` run left at it writes `bench-out/e2e-<layer>.json` instead).
pub const DEFAULT_OUTPUT: &str = "bench-out/bench.json";
/// Default `--samples`.
pub const DEFAULT_SAMPLES: usize = 5;
/// Default world size of a CPU-twin run (the twin is slow with many processes on few cores).
pub const DEFAULT_NPROC: usize = 4;

/// Reduction dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BenchDtype {
    Bf16,
    F16,
    F32,
}

impl BenchDtype {
    pub fn dtype(self) -> DType {
        match self {
            BenchDtype::Bf16 => DType::BF16,
            BenchDtype::F16 => DType::F16,
            BenchDtype::F32 => DType::F32,
        }
    }
}

/// A benchmarked operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize)]
pub enum BenchOp {
    #[value(name = "all_reduce")]
    #[serde(rename = "all_reduce")]
    AllReduce,
    #[value(name = "all_gather")]
    #[serde(rename = "all_gather")]
    AllGather,
    #[value(name = "reduce_scatter")]
    #[serde(rename = "reduce_scatter")]
    ReduceScatter,
    #[value(name = "reduce_scatter_many")]
    #[serde(rename = "reduce_scatter_many")]
    ReduceScatterMany,
}

impl BenchOp {
    pub const ALL: [BenchOp; 4] =
        [BenchOp::AllReduce, BenchOp::AllGather, BenchOp::ReduceScatter, BenchOp::ReduceScatterMany];

    pub fn op(self) -> Op {
        match self {
            BenchOp::AllReduce => Op::AllReduce,
            BenchOp::AllGather => Op::AllGather,
            BenchOp::ReduceScatter => Op::ReduceScatter,
            BenchOp::ReduceScatterMany => Op::ReduceScatterMany,
        }
    }

    pub fn name(self) -> &'static str {
        self.op().name()
    }

    /// Independent lanes a call carries (reduce_scatter_many: two, like the FFN gate/up lanes).
    pub fn lanes(self) -> usize {
        if self == BenchOp::ReduceScatterMany { 2 } else { 1 }
    }
}

/// Which implementation runs the collectives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum BackendChoice {
    /// NVIDIA when a CUDA GPU is present, else AMD when a HIP GPU is present, else the CPU twin.
    Auto,
    /// The CPU twin (shm-ipc): the real protocol over host shared memory.
    Cpu,
    /// NVIDIA: the factory's CUDA composition (fails when it is not available).
    Cuda,
    /// AMD: the factory's ROCm composition, the HIP IPC twin (fails when it is not available).
    Hip,
    /// The in-memory reference collective of the conformance suite (threads only; harness tests).
    #[value(hide = true)]
    Memory,
}

/// A layer the end-to-end bench (`--e2e`) times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum E2eLayer {
    /// The TP-invariant sequence-parallel FFN of `detcoll-layers`, next to the naive FFN.
    Ffn,
    /// The CP-invariant causal context-parallel attention of `detcoll-layers`.
    Attention,
}

impl E2eLayer {
    pub fn name(self) -> &'static str {
        match self {
            E2eLayer::Ffn => "ffn",
            E2eLayer::Attention => "attention",
        }
    }
}

/// `cargo xtask bench` arguments. Sizes are per-rank input bytes (see `SIZE_CONVENTION`).
#[derive(Debug, Clone, PartialEq, Eq, Args, Serialize)]
pub struct BenchArgs {
    /// Ranks to start (above 8 on one host: nodes of up to 8, the hierarchical route). Ignored when
    /// RANK/WORLD_SIZE are set (torchrun/mpirun started this process as one rank).
    #[arg(long, default_value_t = DEFAULT_NPROC, value_parser = parse_world)]
    pub nproc: usize,

    /// Reduction dtype.
    #[arg(long, value_enum, default_value_t = BenchDtype::Bf16)]
    pub dtype: BenchDtype,

    /// Operations to measure.
    #[arg(long, value_enum, num_args = 1.., value_delimiter = ',',
          default_values_t = BenchOp::ALL.to_vec())]
    pub operations: Vec<BenchOp>,

    /// Message sizes: per-rank input bytes (suffixes K/KiB, M/MiB, G/GiB accepted). Default:
    /// powers of two 4 KiB..64 MiB on GPUs, 4 KiB..4 MiB by 4x on the CPU twin.
    #[arg(long = "size-bytes", num_args = 1.., value_delimiter = ',', value_parser = parse_size)]
    pub size_bytes: Vec<usize>,

    /// Staging bytes per rank, the collective's capacity (suffixes as for `--size-bytes`): calls
    /// above it run in chunks, so a capacity below the sizes measures chunked calls. Default:
    /// twice the largest size, so every route fits its frame at every size.
    #[arg(long = "capacity", value_parser = parse_capacity)]
    pub capacity_bytes: Option<usize>,

    /// Untimed calls before the samples of each row.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,

    /// Timed back-to-back calls per sample.
    #[arg(long, default_value_t = 50, value_parser = parse_positive)]
    pub iterations: usize,

    /// Samples per row (the row reports median/min/max over samples).
    #[arg(long, default_value_t = DEFAULT_SAMPLES, value_parser = parse_positive)]
    pub samples: usize,

    /// JSON report (the plot is written next to it, same name with `.svg` and `.png`).
    #[arg(long, default_value = DEFAULT_OUTPUT)]
    pub output: PathBuf,

    /// Backend.
    #[arg(long, value_enum, default_value_t = BackendChoice::Auto)]
    pub backend: BackendChoice,

    /// Run the ranks as threads of this process instead of one process per rank.
    #[arg(long)]
    pub threads: bool,

    /// Spread the ranks over N simulated hosts (processes): each gets
    /// DETCOLL_HOST_ID=virtual-node-I (I its node's index) and its node's LOCAL_RANK/LOCAL_WORLD_SIZE, so the
    /// world routes as across hosts (hierarchical with 2/4/8 ranks per node, else the flat
    /// transport route; on GPUs the step across nodes is NCCL where each node's ranks of one
    /// local rank are on different GPUs, else staged through the host).
    #[arg(long, value_parser = parse_positive)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub virtual_nodes: Option<usize>,

    /// Measure this build even when it is unoptimised (by default a debug xtask — run
    /// without the `cargo xtask` alias, which builds release — builds the release xtask and
    /// runs that).
    #[arg(long, hide = true)]
    pub debug_build: bool,

    /// Seed of the deterministic inputs (every rank rebuilds every rank's input from it).
    #[arg(long, default_value_t = 0x5EED)]
    pub seed: u64,

    /// Force every call of the run onto this route (ipc_push_ll, ipc_push, ipc_one_shot,
    /// ipc_rs_ag, transport, ipc_rs_transport_ag, hierarchical): a routing table with one rule per op replaces the
    /// built-in one and DETCOLL_ROUTING_TABLE, in thread and process runs alike (see
    /// `harness::routes::forced_table`). Rows report the route each call runs.
    #[arg(long, value_parser = super::routes::parse_route)]
    pub route: Option<String>,

    /// CUDA only: each rank captures `iterations` back-to-back calls into one CUDA graph, every
    /// rank instantiates before any replays, and each sample times one replay (per call = replay
    /// time / iterations; warm-up = one untimed replay; no native reference columns).
    #[arg(long)]
    pub graph: bool,

    /// `--graph` only: replays per sample, launched back to back (per call = sample time /
    /// (replays x iterations)). More than one keeps the launch of the next replay off the
    /// timed path, as a serving loop replaying graphs does; 1 times one replay after a barrier.
    #[arg(long, default_value_t = 1, value_parser = parse_positive)]
    pub replays: usize,

    /// Time a whole layer of `detcoll-layers` instead of the collectives: the TP-invariant FFN
    /// (next to the naive one) or the CP attention, per stage and whole, at TP/CP 1, 2, 4, 8
    /// (ranks are threads; see `harness::e2e`).
    #[arg(long, value_enum)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub e2e: Option<E2eLayer>,

    /// `--e2e` only: token counts (all ranks together) to time. Default: 64,128,256 on the CPU,
    /// 1024,4096,16384 on a GPU (attention: 256 on the CPU).
    #[arg(long, num_args = 1.., value_delimiter = ',', value_parser = parse_positive)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tokens: Vec<usize>,

    /// `--e2e` only: the TP (FFN) or CP (attention) sizes to run, each of 1, 2, 4, 8.
    #[arg(long, num_args = 1.., value_delimiter = ',', value_parser = parse_tp)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tp: Vec<usize>,

    /// `--e2e ffn` only: model width (default 128 on the CPU, 4096 on a GPU).
    #[arg(long, value_parser = parse_positive)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hidden: Option<usize>,

    /// `--e2e ffn` only: FFN width, a multiple of 8 (default 512 on the CPU, 14336 on a GPU).
    #[arg(long, value_parser = parse_positive)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ffn: Option<usize>,

    /// `--e2e ffn` only: the gated FFN (SwiGLU, `W2 · (SiLU(x · W1) ⊙ (x · W3))`, the FFN of
    /// Llama, Mistral and Qwen) instead of `W2 · SiLU(x · W1)`.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub gated: bool,

    /// `--e2e attention` only: heads (default 4 on the CPU, 32 on a GPU).
    #[arg(long, value_parser = parse_positive)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heads: Option<usize>,

    /// `--e2e attention` only: width of a head (default 64 on the CPU, 128 on a GPU).
    #[arg(long, value_parser = parse_positive)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head_dim: Option<usize>,
}

impl BenchArgs {
    /// The arguments that reproduce `self` (a rank re-executes `bench-rank` with them).
    pub fn to_cli_args(&self) -> Vec<String> {
        let value = |v: &dyn ValueEnumName| v.cli_name();
        let mut a = vec![
            "--nproc".to_owned(),
            self.nproc.to_string(),
            "--dtype".to_owned(),
            value(&self.dtype),
            "--operations".to_owned(),
        ];
        a.extend(self.operations.iter().map(|o| o.name().to_owned()));
        // No sizes: the backend's defaults, chosen by whoever resolves the backend.
        if !self.size_bytes.is_empty() {
            a.push("--size-bytes".to_owned());
            a.extend(self.size_bytes.iter().map(|s| s.to_string()));
        }
        if let Some(c) = self.capacity_bytes {
            a.extend(["--capacity".to_owned(), c.to_string()]);
        }
        a.extend([
            "--warmup".to_owned(),
            self.warmup.to_string(),
            "--iterations".to_owned(),
            self.iterations.to_string(),
            "--samples".to_owned(),
            self.samples.to_string(),
            "--output".to_owned(),
            self.output.to_string_lossy().into_owned(),
            "--backend".to_owned(),
            value(&self.backend),
            "--seed".to_owned(),
            self.seed.to_string(),
        ]);
        if self.threads {
            a.push("--threads".to_owned());
        }
        if self.debug_build {
            a.push("--debug-build".to_owned());
        }
        if let Some(r) = &self.route {
            a.extend(["--route".to_owned(), r.clone()]);
        }
        if self.graph {
            a.push("--graph".to_owned());
        }
        if self.replays != 1 {
            a.extend(["--replays".to_owned(), self.replays.to_string()]);
        }
        if let Some(layer) = self.e2e {
            a.extend(["--e2e".to_owned(), layer.name().to_owned()]);
        }
        for (flag, list) in [("--tokens", &self.tokens), ("--tp", &self.tp)] {
            if !list.is_empty() {
                a.push(flag.to_owned());
                a.extend(list.iter().map(usize::to_string));
            }
        }
        if self.gated {
            a.push("--gated".to_owned());
        }
        for (flag, v) in
            [("--hidden", self.hidden), ("--ffn", self.ffn), ("--heads", self.heads), ("--head-dim", self.head_dim)]
        {
            if let Some(v) = v {
                a.extend([flag.to_owned(), v.to_string()]);
            }
        }
        a
    }

    /// `self`, with the default sizes for a GPU (`gpu`) or the CPU twin when none were given.
    pub fn or_default_sizes(mut self, gpu: bool) -> Self {
        if self.size_bytes.is_empty() {
            // Each size rounded down to whole shards of every op at this world (reduce_scatter
            // needs a multiple of the world, reduce_scatter_many of its lanes too): the powers
            // of two are already, other worlds (3, 5, 6, 7, 12...) measure the nearest size
            // below (before 2026-12-05 their default run stopped at the first reduce_scatter).
            let unit = self.nproc.max(1) * BenchOp::ReduceScatterMany.lanes() * self.dtype.dtype().size();
            let sizes = if gpu { default_gpu_sizes() } else { default_cpu_sizes() };
            self.size_bytes = sizes.into_iter().map(|b| (b / unit).max(1) * unit).collect();
            self.size_bytes.dedup();
        }
        self
    }

    /// Checks the world the launch makes: virtual nodes spread the ranks evenly, as processes.
    /// Above 8 ranks on one host (one IPC world) the factory splits the host into nodes.
    pub fn check_world(&self) -> anyhow::Result<()> {
        match self.virtual_nodes {
            Some(n) if !self.nproc.is_multiple_of(n) => {
                anyhow::bail!("--virtual-nodes {n}: {} ranks do not spread evenly over {n} nodes", self.nproc)
            }
            Some(_) if self.threads => anyhow::bail!("--virtual-nodes runs ranks as processes, not --threads"),
            _ => Ok(()),
        }
    }

    /// Checks that every (operation, size) divides evenly for `world` ranks in this dtype.
    pub fn check_shapes(&self, world: usize) -> anyhow::Result<()> {
        let esize = self.dtype.dtype().size();
        if self.operations.is_empty() {
            anyhow::bail!("--operations: nothing to measure");
        }
        if self.size_bytes.is_empty() {
            anyhow::bail!("--size-bytes: nothing to measure");
        }
        for &size in &self.size_bytes {
            if size == 0 || size % esize != 0 {
                anyhow::bail!(
                    "--size-bytes {size}: must be a positive multiple of the {} element size ({esize} bytes)",
                    self.dtype.dtype()
                );
            }
            let elems = size / esize;
            for &op in &self.operations {
                let unit = match op {
                    BenchOp::AllReduce | BenchOp::AllGather => 1,
                    BenchOp::ReduceScatter => world,
                    BenchOp::ReduceScatterMany => world * op.lanes(),
                };
                if !elems.is_multiple_of(unit) {
                    anyhow::bail!(
                        "--size-bytes {size}: {} with {world} ranks needs a multiple of {unit} {} elements ({} bytes)",
                        op.name(),
                        self.dtype.dtype(),
                        unit * esize
                    );
                }
            }
        }
        Ok(())
    }

    /// Staging bytes per rank: `--capacity`, else twice the largest per-rank input, so the bulk
    /// push route's receive slots (about twice the message for all_reduce) fit its frame at
    /// every size.
    pub fn capacity(&self) -> usize {
        self.capacity_bytes.unwrap_or_else(|| self.size_bytes.iter().copied().max().unwrap_or(0).saturating_mul(2))
    }
}

trait ValueEnumName {
    fn cli_name(&self) -> String;
}

impl<T: ValueEnum> ValueEnumName for T {
    fn cli_name(&self) -> String {
        self.to_possible_value().map(|v| v.get_name().to_owned()).unwrap_or_default()
    }
}

fn parse_positive(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!("`{s}`: expected an integer >= 1")),
    }
}

fn parse_world(s: &str) -> Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|_| format!("`{s}` is not a number"))?;
    if collective_core::check_world_size(n).is_ok() {
        Ok(n)
    } else {
        Err(format!("{n} ranks: expected 1 to {}", collective_core::MAX_WORLD_SIZE))
    }
}

/// A TP/CP size of the invariant layers: a power of two up to 8 (cross-TP invariance holds
/// for those only, docs/contract.md).
fn parse_tp(s: &str) -> Result<usize, String> {
    let n: usize = s.trim().parse().map_err(|_| format!("`{s}` is not a number"))?;
    if collective_core::SUPPORTED_WORLD_SIZES.contains(&n) {
        Ok(n)
    } else {
        Err(format!("TP/CP size {n}: expected 1, 2, 4 or 8 (cross-TP invariance is a power-of-two property)"))
    }
}

/// Parses `4096`, `4K`, `4KiB`, `16M`, `16MiB`, `1G` (binary multiples).
/// `--capacity`: a size of at least `MIN_CAPACITY` (128) bytes, the staging every op, dtype and
/// world can chunk through (what the collectives refuse below; before 2026-12-05 the flag took
/// 16 and every rank then failed).
fn parse_capacity(s: &str) -> Result<usize, String> {
    let c = parse_size(s)?;
    let min = detcoll_protocol::MIN_CAPACITY;
    if c < min { Err(format!("--capacity {s}: at least {min} bytes of staging are needed")) } else { Ok(c) }
}

pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, suffix) = t.split_at(split);
    let n: usize = num.parse().map_err(|_| format!("`{s}` is not a size in bytes"))?;
    let mult: usize = match suffix.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        _ => return Err(format!("`{s}`: unknown size suffix `{suffix}` (use K, M or G)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("`{s}` is too large"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Wrap {
        #[command(flatten)]
        args: BenchArgs,
    }

    /// `a` (without the program name) as the bench parses it.
    pub(crate) fn parse(a: &[&str]) -> Result<BenchArgs, clap::Error> {
        Wrap::try_parse_from(std::iter::once("bench").chain(a.iter().copied())).map(|w| w.args)
    }

    #[test]
    fn defaults_match_the_seeds_script() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.nproc, DEFAULT_NPROC);
        assert_eq!(a.dtype, BenchDtype::Bf16);
        assert_eq!(a.operations, BenchOp::ALL.to_vec());
        assert!(a.size_bytes.is_empty(), "chosen per backend");
        let cpu = a.clone().or_default_sizes(false).size_bytes;
        assert_eq!(cpu, [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20]);
        let gpu = a.clone().or_default_sizes(true).size_bytes;
        assert_eq!((gpu.len(), gpu[0], gpu[14]), (15, 4096, 64 << 20));
        assert!(cpu.iter().all(|s| gpu.contains(s)), "CPU sizes are GPU sizes (shapes checked once)");
        for s in [4096, 65536, 1 << 20, 16 << 20] {
            assert!(gpu.contains(&s), "the seeds' size {s}");
        }
        assert_eq!(parse(&["--size-bytes", "8K"]).unwrap().or_default_sizes(true).size_bytes, [8192]);
        assert!(!a.to_cli_args().contains(&"--size-bytes".to_owned()));
        assert_eq!(parse(&a.to_cli_args().iter().map(String::as_str).collect::<Vec<_>>()).unwrap(), a);
        assert_eq!((a.warmup, a.iterations, a.samples), (10, 50, 5));
        assert_eq!(a.output, PathBuf::from("bench-out/bench.json"));
        assert_eq!(a.backend, BackendChoice::Auto);
        assert!(!a.threads);
    }

    #[test]
    fn seeds_command_line_parses() {
        let a = parse(&[
            "--dtype",
            "f16",
            "--operations",
            "all_reduce",
            "all_gather",
            "reduce_scatter",
            "--size-bytes",
            "4096",
            "64KiB",
            "1M",
            "16MiB",
            "--warmup",
            "20",
            "--iterations",
            "100",
            "--samples",
            "10",
            "--output",
            "x.json",
            "--nproc",
            "8",
        ])
        .unwrap();
        assert_eq!(a.dtype, BenchDtype::F16);
        assert_eq!(a.operations, vec![BenchOp::AllReduce, BenchOp::AllGather, BenchOp::ReduceScatter]);
        assert_eq!(a.size_bytes, vec![4096, 65536, 1 << 20, 16 << 20]);
        assert_eq!((a.warmup, a.iterations, a.samples, a.nproc), (20, 100, 10, 8));
        // Comma-separated lists work too.
        let b = parse(&["--operations", "reduce_scatter_many,all_reduce", "--size-bytes", "4K,8K"]).unwrap();
        assert_eq!(b.operations, vec![BenchOp::ReduceScatterMany, BenchOp::AllReduce]);
        assert_eq!(b.size_bytes, vec![4096, 8192]);
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(parse(&["--nproc", "0"]).is_err());
        assert!(parse(&["--nproc", "5000"]).is_err());
        for w in 1..=8 {
            assert!(parse(&["--nproc", &w.to_string()]).is_ok(), "--nproc {w}");
            assert!(parse(&["--nproc", &w.to_string()]).unwrap().check_world().is_ok(), "--nproc {w}");
        }
        // Virtual nodes spread evenly, as processes; above 8 ranks on one host the factory
        // splits the host into nodes.
        assert!(parse(&["--nproc", "16", "--virtual-nodes", "2"]).unwrap().check_world().is_ok());
        assert!(parse(&["--nproc", "16"]).unwrap().check_world().is_ok());
        assert!(parse(&["--nproc", "12", "--virtual-nodes", "5"]).unwrap().check_world().is_err());
        assert!(parse(&["--nproc", "16", "--virtual-nodes", "2", "--threads"]).unwrap().check_world().is_err());
        assert!(parse(&["--virtual-nodes", "0"]).is_err());
        assert!(parse(&["--dtype", "f64"]).is_err());
        assert!(parse(&["--operations", "broadcast"]).is_err());
        assert!(parse(&["--size-bytes", "12X"]).is_err());
        assert!(parse(&["--iterations", "0"]).is_err());
        assert!(parse(&["--samples", "0"]).is_err());
        assert!(parse(&["--route", "local"]).is_err());
        assert!(parse(&["--route", "push"]).is_err());
        assert!(parse(&["--route"]).is_err());
        assert!(parse(&["--graph", "yes"]).is_err());
    }

    #[test]
    fn route_and_graph_parse_and_reach_the_ranks() {
        let d = parse(&[]).unwrap();
        assert_eq!((d.route.as_deref(), d.graph), (None, false));
        assert!(!d.to_cli_args().iter().any(|a| a == "--route" || a == "--graph"));
        for route in ["ipc_push_ll", "ipc_one_shot", "ipc_rs_ag", "transport", "ipc_rs_transport_ag"] {
            let a = parse(&["--route", route, "--graph"]).unwrap();
            assert_eq!((a.route.as_deref(), a.graph), (Some(route), true));
            let args = a.to_cli_args();
            assert!(args.windows(2).any(|w| w[0] == "--route" && w[1] == route), "{args:?}");
            assert!(args.iter().any(|x| x == "--graph"), "{args:?}");
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            assert_eq!(parse(&refs).unwrap(), a);
        }
        // The report's args carry both.
        let v = serde_json::to_value(parse(&["--route", "ipc_rs_ag"]).unwrap()).unwrap();
        assert_eq!((v["route"].as_str(), v["graph"].as_bool()), (Some("ipc_rs_ag"), Some(false)));
    }

    #[test]
    fn cli_args_round_trip() {
        let a = parse(&[
            "--nproc",
            "2",
            "--dtype",
            "f32",
            "--operations",
            "reduce_scatter_many",
            "--size-bytes",
            "4096",
            "--warmup",
            "1",
            "--iterations",
            "3",
            "--samples",
            "2",
            "--output",
            "out dir/b.json",
            "--backend",
            "cpu",
            "--threads",
            "--seed",
            "7",
            "--debug-build",
            "--route",
            "ipc_push_ll",
            "--graph",
            "--capacity",
            "1K",
            "--replays",
            "4",
        ])
        .unwrap();
        assert_eq!(a.replays, 4);
        assert_eq!(a.capacity(), 1024);
        assert_eq!((a.route.as_deref(), a.graph), (Some("ipc_push_ll"), true));
        let args = a.to_cli_args();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(parse(&refs).unwrap(), a);
        let d = parse(&[]).unwrap();
        let args = d.to_cli_args();
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        assert_eq!(parse(&refs).unwrap(), d);
        for backend in ["auto", "cpu", "cuda", "hip", "memory"] {
            let b = parse(&["--backend", backend]).unwrap();
            let args = b.to_cli_args();
            assert!(args.windows(2).any(|w| w[0] == "--backend" && w[1] == backend), "{args:?}");
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            assert_eq!(parse(&refs).unwrap(), b);
        }
    }

    #[test]
    fn shapes_are_checked_per_world() {
        let a = parse(&["--size-bytes", "4096", "65536"]).unwrap();
        for w in [1, 2, 4, 8] {
            a.check_shapes(w).unwrap();
        }
        // 6 bf16 elements: all_reduce fine, reduce_scatter over 4 ranks not.
        let b = parse(&["--size-bytes", "12", "--operations", "all_reduce"]).unwrap();
        b.check_shapes(4).unwrap();
        let c = parse(&["--size-bytes", "12", "--operations", "reduce_scatter"]).unwrap();
        assert!(c.check_shapes(4).is_err());
        c.check_shapes(2).unwrap();
        let d = parse(&["--size-bytes", "3"]).unwrap();
        assert!(d.check_shapes(1).is_err());
        // Twice the largest size: the bulk push route's slots fit the frame at every size.
        assert_eq!(parse(&["--size-bytes", "4096", "1M"]).unwrap().capacity(), 2 << 20);
        // Or what --capacity says, below the sizes too (the calls then run in chunks).
        assert_eq!(parse(&["--size-bytes", "1M", "--capacity", "64K"]).unwrap().capacity(), 64 << 10);
        assert!(parse(&["--capacity", "8"]).is_err());
    }

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("2KiB"), Ok(2048));
        assert_eq!(parse_size("16MiB"), Ok(16 << 20));
        assert_eq!(parse_size("1G"), Ok(1 << 30));
        assert!(parse_size("").is_err());
        assert!(parse_size("MiB").is_err());
        assert!(parse_size("1T").is_err());
    }
}
