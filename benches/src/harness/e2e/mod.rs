//! `cargo xtask bench --e2e ffn|attention`: the end-to-end layers of `detcoll-layers`, timed per
//! stage and whole, at TP (FFN) or CP (attention) 1, 2, 4 and 8, with ranks as threads.
//!
//! * FFN: the TP-invariant sequence-parallel FFN (`FfnShard::forward`) next to the naive one
//!   (`forward_naive`) at the same TP in the same run; `invariance_cost` = invariant / naive
//!   whole-layer time.
//! * Attention: the CP-invariant causal attention (`attention::forward`).
//!
//! After timing, every size's output (all ranks' blocks in rank order) is compared bit for bit
//! with the smallest size's (TP/CP 1 by default): `bitwise_across_tp` in the report, and per
//! row `elements_differing` (the naive FFN's count shows what invariance buys).
//!
//! Backends: [`cpu`] (the layers' CPU path with the reference GEMM; what runs without a GPU)
//! and, where built, the CUDA path. The JSON has its own `kind` ([`report::KIND`]) and
//! schema; the markdown table goes to stdout, the plot (SVG and PNG) next to the JSON.
use super::args::{BackendChoice, BenchArgs, DEFAULT_OUTPUT};
use super::report::HostInfo;
use super::{EXIT_NOT_BITWISE, clock};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

pub mod cpu;
pub mod cuda;
pub mod report;
pub mod shapes;

pub use report::{E2eReport, E2eRow};
pub use shapes::{Plan, check_flags};

/// The backend an `--e2e` run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum E2eBackend {
    Cpu,
    Cuda,
}

/// Whether this build has the CUDA backend of `--e2e` (it always does: the layers' GPU path
/// loads CUDA at run time, so it builds without a toolkit).
pub const CUDA_BUILT: bool = true;

/// `--backend` for `--e2e`: auto takes the GPU when there is one and this build has the CUDA
/// layers, else the CPU.
pub fn resolve(choice: BackendChoice) -> anyhow::Result<E2eBackend> {
    match choice {
        BackendChoice::Cpu => Ok(E2eBackend::Cpu),
        BackendChoice::Cuda => {
            anyhow::ensure!(CUDA_BUILT, "--e2e --backend cuda: this build has no CUDA layers backend");
            anyhow::ensure!(super::cuda::available(), "--e2e --backend cuda: no CUDA driver or no CUDA device here");
            Ok(E2eBackend::Cuda)
        }
        BackendChoice::Auto => {
            if CUDA_BUILT && super::cuda::available() {
                Ok(E2eBackend::Cuda)
            } else {
                if super::cuda::available() {
                    eprintln!(
                        "[bench] a CUDA GPU is present but this build has no CUDA layers backend: running the CPU"
                    );
                }
                Ok(E2eBackend::Cpu)
            }
        }
        BackendChoice::Hip | BackendChoice::Memory => {
            anyhow::bail!("--e2e runs on --backend cpu or cuda")
        }
    }
}

/// Where the report goes: `--output`, or `bench-out/e2e-<layer>.json` when it was left at
/// the collective bench's default.
pub fn output_path(args: &BenchArgs, plan: &Plan) -> PathBuf {
    if args.output == Path::new(DEFAULT_OUTPUT) {
        PathBuf::from(format!("bench-out/e2e-{}.json", plan.layer_name()))
    } else {
        args.output.clone()
    }
}

/// The `--e2e` run (flags already checked by [`check_flags`]).
pub fn main(args: &BenchArgs, tool: &str) -> anyhow::Result<ExitCode> {
    let backend = resolve(args.backend)?;
    anyhow::ensure!(
        !args.graph || backend == E2eBackend::Cuda,
        "--graph captures CUDA graphs and needs the CUDA backend; this --e2e run uses the CPU"
    );
    let plan = Plan::new(args, backend == E2eBackend::Cuda)?;
    // Before any row runs: a report that cannot be written would lose the whole run.
    super::check_output(&output_path(args, &plan))?;
    let (rows, device, notes) = match backend {
        E2eBackend::Cpu => (cpu::run(&plan)?, format!("host CPU, {}", std::env::consts::ARCH), cpu_notes(&plan)),
        E2eBackend::Cuda => (cuda::run(&plan)?, cuda::device(), cuda_notes(&plan)),
    };
    let name = match backend {
        E2eBackend::Cpu => cpu::NAME,
        E2eBackend::Cuda => cuda::NAME,
    };
    let report = build_report(&plan, args, tool, name, device, notes, rows);
    let path = output_path(args, &plan);
    write(&report, &path)?;
    print!("{}", report::markdown(&report));
    eprintln!("[bench] wrote {} and its .svg and .png", path.display());
    if !report.bitwise_across_tp || !report.repeat_bitwise {
        eprintln!("[bench] the invariant layer is NOT bitwise across sizes or calls (see the table)");
        return Ok(ExitCode::from(EXIT_NOT_BITWISE));
    }
    Ok(ExitCode::SUCCESS)
}

fn cpu_notes(plan: &Plan) -> Vec<String> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut notes = vec![
        "CPU backend: the layers' CPU path (FfnShard::forward / forward_naive with ReferenceGemm, \
         attention::forward) over collective_factory::cpu::thread_group, one thread per rank, host clock; \
         a performance reference for the pipeline, not for GPU numbers"
            .to_owned(),
    ];
    notes.push(match plan.layer {
        super::args::E2eLayer::Ffn => format!("stages: {}", cpu::FFN_STAGES),
        super::args::E2eLayer::Attention => format!("stages: {}", cpu::ATTENTION_STAGES),
    });
    if let Some(&most) = plan.tps.last().filter(|&&t| t > cpus) {
        notes.push(format!("{most} ranks share {cpus} CPUs: ranks time-share cores, so times include scheduling"));
    }
    notes
}

fn cuda_notes(plan: &Plan) -> Vec<String> {
    let gpus = super::cuda::device_count();
    let mut notes = vec![format!(
        "CUDA backend: detcoll_layers::cuda (cuBLAS GEMMs with reproducible settings, NVRTC kernels) over \
         collective_factory::nvidia::thread_group with {} MiB staging per rank (larger calls are chunked), one host \
         thread and one stream per rank, rank r on GPU r % {gpus}; each rank's code touches only its own context and \
         stream (what one process per GPU runs)",
        cuda::CAPACITY >> 20
    )];
    if plan.tps.iter().any(|&t| t > gpus) {
        notes.push(format!(
            "ranks share GPUs ({gpus} GPU(s), up to {} ranks): ranks sharing a GPU share its SMs and memory \
             bandwidth, so a TP/CP size above the GPU count measures the pipeline's cost, not its speed-up",
            plan.tps.iter().max().copied().unwrap_or(1)
        ));
    }
    notes.push(
        "eager: every collective is followed by a host barrier of the ranks (Lockstep: ranks that are threads \
         sharing a context must enqueue collectives in call order); stage ms from CUDA events around each stage \
         (StageEvents), whole layer from an event pair around each forward"
            .to_owned(),
    );
    if plan.graph {
        notes.push(
            "graph rows: each rank captured one forward (thread-local capture), instantiated and uploaded it, all \
             ranks met at a barrier, then one untimed and `iterations` timed replays (a barrier before each launch); \
             whole layer only (no stage times inside a graph); bits compared with the eager reference"
                .to_owned(),
        );
    }
    notes
}

/// How the times are taken (both backends: a call's time is the slowest rank's).
pub const TIMING_METHOD: &str = "whole layer: each timed call is bracketed on every rank (host clock on the CPU, an \
event pair on the rank's stream on CUDA); per call the slowest rank's time; whole_ms = median over the timed calls \
(min..max). Stage ms = the stage's total over the timed calls / calls, slowest rank. invariance_cost = invariant / \
naive whole_ms at the same tokens and size. Bitwise: every size's output (all ranks in rank order; attention out and \
lse) against the smallest size's, bit for bit";

fn build_report(
    plan: &Plan,
    args: &BenchArgs,
    tool: &str,
    backend: &str,
    device: String,
    notes: Vec<String>,
    mut rows: Vec<E2eRow>,
) -> E2eReport {
    report::pair_naive(&mut rows);
    let invariant = rows.iter().filter(|r| r.variant == report::INVARIANT);
    let bitwise_across_tp = invariant.clone().all(|r| r.elements_differing == 0);
    let naive: Vec<&E2eRow> = rows.iter().filter(|r| r.variant == report::NAIVE).collect();
    let naive_bitwise_across_tp = (!naive.is_empty()).then(|| naive.iter().all(|r| r.elements_differing == 0));
    let now = clock::unix_now();
    E2eReport {
        kind: report::KIND.to_owned(),
        schema_version: report::SCHEMA_VERSION,
        tool: tool.to_owned(),
        backend: backend.to_owned(),
        device,
        build_profile: if cfg!(debug_assertions) { "debug" } else { "release" }.to_owned(),
        layer: plan.layer_name().to_owned(),
        dtype: plan.dtype.dtype().name().to_owned(),
        git_commit: clock::git_commit(),
        host: HostInfo {
            hostname: clock::hostname(),
            cpu_count: std::thread::available_parallelism().map_or(1, |n| n.get()),
            os: std::env::consts::OS.to_owned(),
            arch: std::env::consts::ARCH.to_owned(),
        },
        args: serde_json::to_value(args).unwrap_or_default(),
        timestamp_unix: now,
        timestamp_utc: clock::utc_string(now),
        timing_method: TIMING_METHOD.to_owned(),
        notes,
        bitwise_across_tp,
        naive_bitwise_across_tp,
        repeat_bitwise: rows.iter().all(|r| r.repeat_bitwise),
        rows,
    }
}

/// Writes the JSON to `path`, the plot next to it (`.svg`, `.png`).
pub fn write(report: &E2eReport, path: &Path) -> anyhow::Result<()> {
    super::write_outputs(path, &serde_json::to_string_pretty(report)?, &report::svg(report)).map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::args::tests::parse;

    fn tmp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("detcoll-e2e-test-{}-{name}", std::process::id())).join("e2e.json")
    }

    /// Runs `--e2e` on the CPU with `extra` flags; returns the report as JSON and typed.
    fn run_cpu(name: &str, extra: &[&str]) -> (serde_json::Value, E2eReport) {
        let out = tmp(name);
        let o = out.to_string_lossy().into_owned();
        let mut a = vec!["--backend", "cpu", "--warmup", "1", "--iterations", "2", "--output", &o];
        a.extend_from_slice(extra);
        let args = parse(&a).unwrap();
        check_flags(&args).unwrap();
        assert_eq!(main(&args, "test").unwrap(), ExitCode::SUCCESS);
        let text = std::fs::read_to_string(&out).unwrap();
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let typed: E2eReport = serde_json::from_str(&text).unwrap();
        let svg = std::fs::read_to_string(out.with_extension("svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(std::fs::read(out.with_extension("png")).unwrap().starts_with(b"\x89PNG"));
        let _ = std::fs::remove_dir_all(out.parent().unwrap());
        (v, typed)
    }

    fn stages(r: &E2eRow) -> Vec<&str> {
        r.stages.iter().map(|s| s.stage.as_str()).collect()
    }

    #[test]
    fn cpu_ffn_rows_have_every_stage_and_only_the_invariant_ffn_is_bitwise_across_tp() {
        let (v, r) = run_cpu("ffn", &["--e2e", "ffn", "--tokens", "32", "--hidden", "16", "--ffn", "64"]);
        assert_eq!((v["kind"].as_str(), v["schema_version"].as_u64()), (Some(report::KIND), Some(1)));
        assert_eq!((r.layer.as_str(), r.backend.as_str(), r.dtype.as_str()), ("ffn", cpu::NAME, "bf16"));
        assert!(r.bitwise_across_tp && r.repeat_bitwise);
        assert_eq!(r.naive_bitwise_across_tp, Some(false));
        assert_eq!(r.rows.len(), 8, "4 TP sizes x (invariant, naive)");
        for row in &r.rows {
            assert_eq!((row.tokens, row.hidden, row.ffn, row.mode.as_str()), (32, Some(16), Some(64), "eager"));
            assert_eq!((row.reference_tp, row.elements, row.iterations), (1, 32 * 16, 2));
            assert!(row.whole_ms > 0.0 && row.whole_min_ms <= row.whole_ms && row.whole_ms <= row.whole_max_ms);
            assert_eq!(row.per_rank_whole_ms.len(), row.tp);
            assert!(row.stages.iter().all(|s| s.ms >= 0.0 && s.ms.is_finite()), "{row:?}");
            if row.variant == report::INVARIANT {
                assert_eq!(stages(row), ["all_gather", "gemm1", "activation", "gemm2", "leaf_fold", "reduce_scatter"]);
                assert_eq!(row.elements_differing, 0, "invariant at tp {}", row.tp);
                assert!(row.naive_ms.is_some() && row.invariance_cost.unwrap() > 0.0);
            } else {
                assert_eq!(stages(row), ["all_gather", "gemm1", "activation", "gemm2", "reduce_scatter"]);
                assert_eq!(row.elements_differing > 0, row.tp > 1, "naive at tp {}", row.tp);
                assert_eq!(row.invariance_cost, None);
            }
        }
        let md = report::markdown(&r);
        assert!(md.contains("| layer | variant | dtype | tokens | tp | mode | all_gather ms |"), "{md}");
        assert!(md.contains("bitwise across TP sizes (invariant): yes; naive: no"), "{md}");
        assert_eq!(md.matches("| ffn | ").count(), 8);
    }

    /// `--gated`: the gated FFN's rows, its layer name, the invariant layer bitwise across TP
    /// (its staged re-run, checked against the layer's bits, gates as the layer does) and the
    /// naive one not.
    #[test]
    fn cpu_gated_ffn_rows_are_bitwise_across_tp() {
        let (_, r) =
            run_cpu("ffn-gated", &["--e2e", "ffn", "--gated", "--tokens", "32", "--hidden", "16", "--ffn", "64"]);
        assert_eq!(r.layer, "ffn-gated");
        assert!(r.bitwise_across_tp && r.repeat_bitwise);
        assert_eq!(r.naive_bitwise_across_tp, Some(false));
        assert_eq!(r.rows.len(), 8);
        assert!(r.rows.iter().all(|row| row.layer == "ffn-gated"));
        let md = report::markdown(&r);
        assert_eq!(md.matches("| ffn-gated | ").count(), 8, "{md}");
        assert!(md.contains("bitwise across TP sizes (invariant): yes; naive: no"), "{md}");
    }

    #[test]
    fn cpu_attention_out_and_lse_are_bitwise_across_cp() {
        let (v, r) = run_cpu("attention", &["--e2e", "attention", "--tokens", "16", "--heads", "2", "--head-dim", "4"]);
        assert_eq!(v["naive_bitwise_across_tp"], serde_json::Value::Null);
        assert!(r.bitwise_across_tp && r.repeat_bitwise);
        assert_eq!(r.rows.len(), 4);
        for row in &r.rows {
            assert_eq!(stages(row), ["all_gather", "attention"]);
            // out (16 x 2 x 4) and lse (16 x 2).
            assert_eq!((row.elements, row.elements_differing), (16 * 8 + 16 * 2, 0));
            assert_eq!((row.heads, row.head_dim, row.hidden), (Some(2), Some(4), None));
        }
        assert!(report::markdown(&r).contains("| attention | invariant | bf16 | 16 | 8 | eager |"));
    }

    #[test]
    fn the_default_output_gets_the_layers_name_and_graph_needs_cuda() {
        let args = parse(&["--e2e", "attention"]).unwrap();
        let plan = Plan::new(&args, false).unwrap();
        assert_eq!(output_path(&args, &plan), PathBuf::from("bench-out/e2e-attention.json"));
        let mine = parse(&["--e2e", "ffn", "--output", "o/x.json"]).unwrap();
        assert_eq!(output_path(&mine, &Plan::new(&mine, false).unwrap()), PathBuf::from("o/x.json"));
        let graph = parse(&["--e2e", "ffn", "--graph", "--backend", "auto"]).unwrap();
        if !(CUDA_BUILT && crate::harness::cuda::available()) {
            let e = main(&graph, "test").unwrap_err().to_string();
            assert!(e.contains("--graph"), "{e}");
        }
        assert_eq!(resolve(BackendChoice::Cpu).unwrap(), E2eBackend::Cpu);
        assert!(resolve(BackendChoice::Hip).is_err());
        if !crate::harness::cuda::available() {
            let e = resolve(BackendChoice::Cuda).unwrap_err().to_string();
            assert!(e.contains("--backend cuda") && e.contains("no CUDA"), "{e}");
            assert_eq!(resolve(BackendChoice::Auto).unwrap(), E2eBackend::Cpu);
        }
    }
}
