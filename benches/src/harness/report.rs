//! The bench report: schema-versioned JSON (the markdown table is [`super::table`]).
use super::args::BenchArgs;
use serde::{Deserialize, Serialize};

/// Bumped whenever a field changes meaning or disappears (additions keep the version).
/// 2: `reduction_order` is the tree of this world (was always the 8-rank tree);
/// `args.backend_config.routing` is a JSON object (was a string of JSON); durations are numbers
/// of milliseconds (`timeouts_ms`); `git_commit` added.
pub const SCHEMA_VERSION: u32 = 2;

/// The canonical tree every reduction of a `world`-rank run evaluates, per element
/// (`fixed_tree::tree_expression`, in parentheses), e.g. `((r0+r1)+(r2+r3))` for 4 ranks (the
/// prefix of the 8-rank tree of `collective_core::REDUCTION_ORDER`) and
/// `(((r0+r1)+(r2+r3))+(r4+r5))` for 6; `r0` for one rank.
pub fn reduction_order(world: usize) -> String {
    match fixed_tree::tree_expression(world.max(1)) {
        Ok(e) if world > 1 => format!("({e})"),
        Ok(e) => e,
        Err(e) => format!("({e})"),
    }
}

/// Timeouts as numbers of milliseconds (`null` when the configured ones are invalid), the way
/// every duration in the report is written.
pub fn timeouts_ms(t: Option<collective_core::Timeouts>) -> serde_json::Value {
    collective_core::Timeouts::resolve(t).ok().map_or(
        serde_json::Value::Null,
        |t| serde_json::json!({ "peer": t.peer.as_secs_f64() * 1e3, "close": t.close.as_secs_f64() * 1e3 }),
    )
}

/// How `size_bytes` maps to buffers (the seeds' benchmark convention).
pub const SIZE_CONVENTION: &str = "size_bytes is the per-rank INPUT of every operation: all_reduce and reduce_scatter \
read size_bytes per rank; all_gather reads size_bytes per rank and writes world_size * size_bytes; \
reduce_scatter_many reads two independent lanes of size_bytes/2 each and writes two shards of size_bytes/2/world_size. \
input_gbps = size_bytes / median latency.";

/// How latencies are measured and reduced.
pub const LATENCY_METHOD: &str = "each sample: a bootstrap barrier, then `iterations` back-to-back calls timed on each rank \
(host clock around synchronous calls on the CPU twin); latency = sample time / iterations. For every sample the slowest \
rank's latency is taken; median_us/min_us/max_us are over those per-sample maxima (the seeds' 'median of the slowest-rank \
latency'). per_rank_median_us is each rank's own median. With --graph (`graph: true`) a sample is one replay of a CUDA \
graph of `iterations` captured calls (`replays` of them back to back, default 1), timed with events on each rank's \
stream; latency = sample time / (replays x iterations).";

/// One (operation, size) row. Native NCCL/RCCL fields are null unless a native reference ran
/// (never on the CPU twin); they are a non-strict performance reference only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `all_reduce`, `all_gather`, `reduce_scatter`, `reduce_scatter_many`, or a baseline:
    /// `memcpy` (the copy) or `empty_kernel` (the launch floor).
    pub operation: String,
    pub dtype: String,
    pub size_bytes: usize,
    pub input_bytes_per_rank: usize,
    pub output_bytes_per_rank: usize,
    pub lanes: usize,
    /// The route the calls ran: `Collective::route(op, bytes).name()` (under `--route`, the
    /// forced route as the backend takes it), with an `ipc_push_ll` call whose payload exceeds
    /// the LL capacity reported as the `ipc_one_shot` it falls back to; for the baselines the
    /// copy's name (`host_memcpy`, `device_copy`) or the kernel's (`detcoll_noop`).
    pub route: String,
    /// Measured by replaying a captured CUDA graph (`--graph`), not by eager calls.
    #[serde(default)]
    pub graph: bool,
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub per_rank_median_us: Vec<f64>,
    pub input_gbps: f64,
    /// The copy baseline of the same bytes in the same run, all ranks copying at once.
    pub memcpy_median_us: Option<f64>,
    pub ratio_vs_memcpy: Option<f64>,
    /// The copy baseline with only rank 0 copying (the others idle).
    pub memcpy_one_rank_median_us: Option<f64>,
    pub ratio_vs_memcpy_one_rank: Option<f64>,
    /// The empty-kernel row of the same size group (every rank launching `detcoll_noop` at
    /// once, measured the same way), where the backend has one.
    #[serde(default)]
    pub empty_kernel_median_us: Option<f64>,
    #[serde(default)]
    pub ratio_vs_empty_kernel: Option<f64>,
    /// On every rank the first and last call's outputs are identical bit for bit, and
    /// replicated outputs (all_reduce, all_gather) are identical across ranks.
    pub repeat_bitwise: bool,
    /// The output equals the fixed tree over every rank's input (`null` for the copy baseline).
    pub bitwise_vs_fixed_tree: Option<bool>,
    /// The first failure, when a bitwise check failed.
    pub mismatch: Option<String>,
    /// Largest retained staging/workspace of any rank.
    pub workspace_bytes: usize,
    /// Largest per-call temporary device allocation of any rank (0: calls allocate nothing).
    pub peak_temp_bytes: usize,
    pub native_default_us: Option<f64>,
    /// Native with `NCCL_ALGO=Tree NCCL_PROTO=Simple` (deterministic-pinned settings).
    pub native_tree_simple_us: Option<f64>,
    pub ratio_vs_native: Option<f64>,
    pub max_abs_diff_vs_native: Option<f64>,
}

impl Row {
    /// Whether every bitwise check of this row passed.
    pub fn bitwise(&self) -> bool {
        self.repeat_bitwise && self.bitwise_vs_fixed_tree != Some(false)
    }
}

/// `capabilities()` of the collective, as reported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityFlags {
    pub strict_fixed_order: bool,
    pub supports_async_overlap: bool,
    pub supports_compute_communication_fusion: bool,
    pub supports_graph_capture: bool,
    pub capacity_bytes: usize,
}

impl From<collective_core::Capabilities> for CapabilityFlags {
    fn from(c: collective_core::Capabilities) -> Self {
        CapabilityFlags {
            strict_fixed_order: c.strict_fixed_order,
            supports_async_overlap: c.supports_async_overlap,
            supports_compute_communication_fusion: c.supports_compute_communication_fusion,
            supports_graph_capture: c.supports_graph_capture,
            capacity_bytes: c.capacity_bytes,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostInfo {
    pub hostname: String,
    pub cpu_count: usize,
    pub os: String,
    pub arch: String,
}

/// The whole report (written by rank 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub schema_version: u32,
    pub tool: String,
    /// `cpu-twin`, `cuda-ipc`, ...
    pub backend: String,
    /// `release`, or `debug` (an unoptimised measurement, `--debug-build`).
    pub build_profile: String,
    pub world_size: usize,
    /// `processes` (launched by xtask), `external` (torchrun/mpirun), `threads`.
    pub launch: String,
    pub dtype: String,
    /// [`reduction_order`] of `world_size`.
    pub reduction_order: String,
    /// `git rev-parse --short HEAD` where the bench ran (`-dirty` with local changes), or
    /// `unknown` (no git, e.g. a GPU bundle; also what a schema-1 report reads back as).
    #[serde(default = "unknown")]
    pub git_commit: String,
    pub capabilities: CapabilityFlags,
    pub size_convention: String,
    pub latency_method: String,
    /// Every row was measured by CUDA-graph replay (`--graph`).
    #[serde(default)]
    pub graph: bool,
    /// The route `--route` forced onto every call, if any.
    #[serde(default)]
    pub forced_route: Option<String>,
    pub host: HostInfo,
    pub args: serde_json::Value,
    pub timestamp_unix: u64,
    pub timestamp_utc: String,
    pub notes: Vec<String>,
    /// Every row passed every bitwise check.
    pub all_bitwise: bool,
    pub rows: Vec<Row>,
}

fn unknown() -> String {
    "unknown".to_owned()
}

impl Report {
    pub fn args_value(args: &BenchArgs) -> serde_json::Value {
        serde_json::to_value(args).unwrap_or(serde_json::Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reduction_order_is_the_prefix_of_the_eight_rank_tree() {
        assert_eq!(reduction_order(1), "r0");
        assert_eq!(reduction_order(2), "(r0+r1)");
        assert_eq!(reduction_order(4), "((r0+r1)+(r2+r3))");
        assert_eq!(reduction_order(8), format!("({})", collective_core::REDUCTION_ORDER));
        assert_eq!(reduction_order(0), "r0");
        assert_eq!(reduction_order(3), "((r0+r1)+r2)");
        assert_eq!(reduction_order(6), "(((r0+r1)+(r2+r3))+(r4+r5))");
    }

    #[test]
    fn timeouts_are_milliseconds() {
        use collective_core::Timeouts;
        use std::time::Duration;
        let t = Timeouts { peer: Duration::from_millis(1500), close: Duration::from_secs(2) };
        let v = timeouts_ms(Some(t));
        assert_eq!(v["peer"].as_f64(), Some(1500.0));
        assert_eq!(v["close"].as_f64(), Some(2000.0));
    }
}
