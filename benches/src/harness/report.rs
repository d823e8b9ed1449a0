//! The bench report: schema-versioned JSON (the markdown table is [`super::table`]).
use super::args::BenchArgs;
use serde::{Deserialize, Serialize};

/// Bumped whenever a field changes meaning or disappears (additions keep the version).
pub const SCHEMA_VERSION: u32 = 1;

/// How `size_bytes` maps to buffers (the seeds' benchmark convention).
pub const SIZE_CONVENTION: &str = "size_bytes is the per-rank INPUT of every operation: all_reduce and reduce_scatter \
read size_bytes per rank; all_gather reads size_bytes per rank and writes world_size * size_bytes; \
reduce_scatter_many reads two independent lanes of size_bytes/2 each and writes two shards of size_bytes/2/world_size. \
input_gbps = size_bytes / median latency.";

/// How latencies are measured and reduced.
pub const LATENCY_METHOD: &str = "each sample: a bootstrap barrier, then `iterations` back-to-back calls timed on each rank \
(host clock around synchronous calls on the CPU twin); latency = sample time / iterations. For every sample the slowest \
rank's latency is taken; median_us/min_us/max_us are over those per-sample maxima (the seeds' 'median of the slowest-rank \
latency'). per_rank_median_us is each rank's own median.";

/// One (operation, size) row. Native NCCL/RCCL fields are null unless a native reference ran
/// (never on the CPU twin); they are a non-strict performance reference only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// `all_reduce`, `all_gather`, `reduce_scatter`, `reduce_scatter_many`, or `memcpy` (baseline).
    pub operation: String,
    pub dtype: String,
    pub size_bytes: usize,
    pub input_bytes_per_rank: usize,
    pub output_bytes_per_rank: usize,
    pub lanes: usize,
    /// `Collective::route(op, bytes).name()`; for the baseline the copy's name (`host_memcpy`).
    pub route: String,
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
    pub reduction_order: String,
    pub capabilities: CapabilityFlags,
    pub size_convention: String,
    pub latency_method: String,
    pub host: HostInfo,
    pub args: serde_json::Value,
    pub timestamp_unix: u64,
    pub timestamp_utc: String,
    pub notes: Vec<String>,
    /// Every row passed every bitwise check.
    pub all_bitwise: bool,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn args_value(args: &BenchArgs) -> serde_json::Value {
        serde_json::to_value(args).unwrap_or(serde_json::Value::Null)
    }
}
