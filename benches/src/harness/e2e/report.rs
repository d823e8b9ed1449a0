//! The `--e2e` report: its own JSON (`kind: "detcoll-bench-e2e"`, so a reader never takes its
//! rows for collective rows), the markdown table and the plot.
use crate::harness::report::HostInfo;
use crate::harness::svg::{self, Panel, Point, RefLine, Series, log_range};
use serde::{Deserialize, Serialize};
use std::fmt::Write;

/// `kind` of every e2e report.
pub const KIND: &str = "detcoll-bench-e2e";
/// Bumped whenever a field changes meaning or disappears (additions keep the version).
pub const SCHEMA_VERSION: u32 = 1;

/// Stage names in pipeline order (the names of `detcoll_layers::cuda::Stage::name`).
pub const STAGES: [&str; 7] =
    ["all_gather", "gemm1", "activation", "gemm2", "leaf_fold", "reduce_scatter", "attention"];

/// `variant` of the TP-invariant layer (attention has only this one).
pub const INVARIANT: &str = "invariant";
/// `variant` of the naive FFN.
pub const NAIVE: &str = "naive";

/// One stage's time per forward call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StageMs {
    /// One of [`STAGES`].
    pub stage: String,
    /// Milliseconds per call: this stage's total over the timed calls / calls, slowest rank.
    pub ms: f64,
}

/// One (layer variant, tokens, TP/CP size, mode) row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct E2eRow {
    /// `ffn` or `attention`.
    pub layer: String,
    /// [`INVARIANT`] or [`NAIVE`].
    pub variant: String,
    pub dtype: String,
    /// Tokens over all ranks.
    pub tokens: usize,
    pub hidden: Option<usize>,
    pub ffn: Option<usize>,
    pub heads: Option<usize>,
    pub head_dim: Option<usize>,
    /// TP size (FFN) or CP size (attention): the number of ranks.
    pub tp: usize,
    /// `eager` or `graph` (CUDA-graph replay).
    pub mode: String,
    /// Timed calls (after `warmup` untimed ones).
    pub iterations: usize,
    /// Per-stage times (empty when the mode times the whole layer only).
    pub stages: Vec<StageMs>,
    /// How the stage times were taken (see the report's notes).
    pub stage_method: String,
    /// Whole layer, milliseconds per call: median over the timed calls of the slowest rank's time.
    pub whole_ms: f64,
    pub whole_min_ms: f64,
    pub whole_max_ms: f64,
    /// Each rank's median whole-layer time.
    pub per_rank_whole_ms: Vec<f64>,
    /// The naive FFN's `whole_ms` at the same tokens, TP and mode (invariant FFN rows).
    pub naive_ms: Option<f64>,
    /// `whole_ms / naive_ms`: what TP invariance costs (invariant FFN rows).
    pub invariance_cost: Option<f64>,
    /// The size whose output this row's is compared with (the smallest of the run).
    pub reference_tp: usize,
    /// Output elements compared (attention: `out` and `lse` together).
    pub elements: usize,
    /// Elements whose bits differ from the same variant's output at `reference_tp`.
    pub elements_differing: usize,
    /// The first and last timed call gave the same bits on every rank.
    pub repeat_bitwise: bool,
}

impl E2eRow {
    /// The stage's time, if this row has it.
    pub fn stage(&self, name: &str) -> Option<f64> {
        self.stages.iter().find(|s| s.stage == name).map(|s| s.ms)
    }
}

/// The whole `--e2e` report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct E2eReport {
    /// Always [`KIND`].
    pub kind: String,
    pub schema_version: u32,
    pub tool: String,
    /// `cpu-threads` or `cuda-threads`.
    pub backend: String,
    /// What ran the ranks (the host CPU, or the GPU's name).
    pub device: String,
    pub build_profile: String,
    pub layer: String,
    pub dtype: String,
    pub git_commit: String,
    pub host: HostInfo,
    pub args: serde_json::Value,
    pub timestamp_unix: u64,
    pub timestamp_utc: String,
    /// How whole-layer and stage times are taken.
    pub timing_method: String,
    pub notes: Vec<String>,
    /// Every invariant row's output has the reference size's bits (the claim of the layers).
    pub bitwise_across_tp: bool,
    /// The same for the naive FFN (`null` for attention, which has no naive variant): false
    /// wherever some size differs from the reference.
    pub naive_bitwise_across_tp: Option<bool>,
    /// Every row's first and last timed call agreed bit for bit.
    pub repeat_bitwise: bool,
    pub rows: Vec<E2eRow>,
}

/// Pairs every invariant FFN row with the naive row of the same tokens, size and mode: sets
/// `naive_ms` and `invariance_cost`.
pub fn pair_naive(rows: &mut [E2eRow]) {
    let naive: Vec<(usize, usize, String, f64)> =
        rows.iter().filter(|r| r.variant == NAIVE).map(|r| (r.tokens, r.tp, r.mode.clone(), r.whole_ms)).collect();
    for r in rows.iter_mut().filter(|r| r.variant == INVARIANT) {
        if let Some(&(.., ms)) = naive.iter().find(|(t, tp, m, _)| (*t, *tp, m) == (r.tokens, r.tp, &r.mode)) {
            r.naive_ms = Some(ms);
            r.invariance_cost = (ms > 0.0).then(|| r.whole_ms / ms);
        }
    }
}

/// Median, min and max of `v` (NaN for an empty one).
pub fn median_min_max(v: &[f64]) -> (f64, f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN, f64::NAN);
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
    (median, s[0], s[n - 1])
}

fn ms(x: f64) -> String {
    if !x.is_finite() {
        "-".to_owned()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else if x >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// The bitwise cell: the reference row, no difference, or how many elements differ.
fn bitwise_cell(r: &E2eRow) -> String {
    let repeat = if r.repeat_bitwise { "" } else { ", **repeat NOT bitwise**" };
    let body = if r.tp == r.reference_tp {
        "reference".to_owned()
    } else if r.elements_differing == 0 {
        format!("= {} {}", if r.layer.starts_with("ffn") { "tp" } else { "cp" }, r.reference_tp)
    } else if r.variant == INVARIANT {
        format!("**NO**: {} of {} differ", r.elements_differing, r.elements)
    } else {
        format!("{} of {} differ", r.elements_differing, r.elements)
    };
    body + repeat
}

/// The table: one line per row, by tokens, size, mode and variant (invariant first); stage
/// columns only for the stages some row has.
pub fn table(rows: &[E2eRow]) -> String {
    if rows.is_empty() {
        return "(no rows)\n".to_owned();
    }
    let mut order: Vec<&E2eRow> = rows.iter().collect();
    order.sort_by_key(|r| (r.tokens, r.tp, r.mode.clone(), r.variant != INVARIANT));
    let stages: Vec<&str> = STAGES.into_iter().filter(|s| rows.iter().any(|r| r.stage(s).is_some())).collect();
    let par = if rows.iter().all(|r| r.layer == "attention") { "cp" } else { "tp" };
    let with_naive = rows.iter().any(|r| r.naive_ms.is_some());
    let mut header: Vec<String> =
        ["layer", "variant", "dtype", "tokens", par, "mode"].iter().map(|s| (*s).to_owned()).collect();
    header.extend(stages.iter().map(|s| format!("{s} ms")));
    header.push("whole layer ms (min..max)".to_owned());
    if with_naive {
        header.extend(["naive ms".to_owned(), "invariance cost".to_owned()]);
    }
    header.push("bitwise across sizes".to_owned());
    let mut align = vec!["---", "---", "---", "---:", "---:", "---"];
    align.extend(stages.iter().map(|_| "---:"));
    align.push("---:");
    if with_naive {
        align.extend(["---:", "---:"]);
    }
    align.push("---");
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let mut s = line(header);
    s.push_str(&line(align.into_iter().map(str::to_owned).collect()));
    for r in order {
        let mut cells = vec![
            r.layer.clone(),
            r.variant.clone(),
            r.dtype.clone(),
            r.tokens.to_string(),
            r.tp.to_string(),
            r.mode.clone(),
        ];
        cells.extend(stages.iter().map(|st| r.stage(st).map_or_else(|| "-".to_owned(), ms)));
        cells.push(format!("{} ({}..{})", ms(r.whole_ms), ms(r.whole_min_ms), ms(r.whole_max_ms)));
        if with_naive {
            cells.push(r.naive_ms.map_or_else(|| "-".to_owned(), ms));
            cells.push(r.invariance_cost.map_or_else(|| "-".to_owned(), |c| format!("{c:.2}x")));
        }
        cells.push(bitwise_cell(r));
        s.push_str(&line(cells));
    }
    s
}

/// What `cargo xtask bench --e2e` prints on stdout: title, table, how to read it.
pub fn markdown(r: &E2eReport) -> String {
    let mut s = format!(
        "### detcoll e2e bench: {} {} on {} ({}, {} build), commit {}, {} ({} CPUs)\n\n",
        r.layer, r.dtype, r.backend, r.device, r.build_profile, r.git_commit, r.host.hostname, r.host.cpu_count
    );
    s.push_str(&table(&r.rows));
    let _ = writeln!(
        s,
        "\n{}\n\nbitwise across {} sizes (invariant): {}{}; every call repeatable bit for bit: {}",
        r.timing_method,
        if r.layer.starts_with("ffn") { "TP" } else { "CP" },
        if r.bitwise_across_tp { "yes" } else { "NO" },
        r.naive_bitwise_across_tp.map_or(String::new(), |n| format!("; naive: {}", if n { "yes" } else { "no" })),
        if r.repeat_bitwise { "yes" } else { "NO" }
    );
    for n in &r.notes {
        let _ = writeln!(s, "* {n}");
    }
    s
}

const COLORS: [&str; 4] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"];

fn sizes_of(rows: &[E2eRow]) -> Vec<usize> {
    let mut v: Vec<usize> = rows.iter().map(|r| r.tp).collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn color(tps: &[usize], tp: usize) -> &'static str {
    COLORS[tps.iter().position(|t| *t == tp).unwrap_or(0) % COLORS.len()]
}

/// One series per (size, variant, mode): x tokens, y from `y`; naive dashed, graph replays as
/// square markers.
fn series(rows: &[E2eRow], y: impl Fn(&E2eRow) -> Option<(f64, Option<(f64, f64)>)>) -> Vec<Series> {
    let tps = sizes_of(rows);
    let mut keys: Vec<(usize, &str, &str)> = Vec::new();
    for r in rows {
        let k = (r.tp, r.variant.as_str(), r.mode.as_str());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .map(|(tp, variant, mode)| {
            let mut pts: Vec<&E2eRow> =
                rows.iter().filter(|r| (r.tp, r.variant.as_str(), r.mode.as_str()) == (tp, variant, mode)).collect();
            pts.sort_by_key(|r| r.tokens);
            let points = pts
                .into_iter()
                .filter_map(|r| {
                    let (v, range) = y(r).filter(|(v, _)| v.is_finite() && *v > 0.0)?;
                    Some(Point {
                        size: r.tokens,
                        y: v,
                        range,
                        shape: usize::from(mode == "graph"),
                        not_bitwise: r.variant == INVARIANT && r.elements_differing > 0,
                        tip: format!("{variant} {} {tp}, {} tokens, {mode}: {}", r.layer, r.tokens, ms(v)),
                    })
                })
                .collect();
            Series { color: color(&tps, tp), dashed: variant == NAIVE, points }
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

/// An axis tick: `10 ms`, `1.5 ms`, `100 us`.
fn ms_label(v: f64) -> String {
    let trim = |x: f64| {
        let s = format!("{x:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    };
    if v >= 1.0 { format!("{} ms", trim(v)) } else { format!("{} us", trim(v * 1e3)) }
}

/// The plot: whole-layer time vs tokens per TP/CP size (invariant solid, naive dashed), and for
/// the FFN the invariance cost.
pub fn svg(r: &E2eReport) -> String {
    let rows: Vec<E2eRow> = r.rows.iter().filter(|x| x.whole_ms.is_finite() && x.whole_ms > 0.0).cloned().collect();
    let par = if r.layer.starts_with("ffn") { "TP" } else { "CP" };
    let mut panels = vec![Panel {
        title: format!("whole layer per call (slowest rank; median, bars min..max); {par} by color, naive dashed"),
        y_label: "whole layer".into(),
        log_y: true,
        series: series(&rows, |x| Some((x.whole_ms, Some((x.whole_min_ms, x.whole_max_ms))))),
        refs: vec![],
        y_range: log_range(rows.iter().flat_map(|x| [x.whole_min_ms, x.whole_max_ms])),
        y_fmt: ms_label,
    }];
    let cost = series(&rows, |x| x.invariance_cost.map(|c| (c, None)));
    if !cost.is_empty() {
        let hi = cost.iter().flat_map(|s| s.points.iter().map(|p| p.y)).fold(1.0, f64::max);
        panels.push(Panel {
            title: "cost of invariance: invariant / naive whole-layer time".into(),
            y_label: "x of naive".into(),
            log_y: false,
            series: cost,
            refs: vec![RefLine { y: 1.0, label: "= naive".into() }],
            y_range: (0.0, (hi * 1.1).ceil()),
            y_fmt: |v| format!("{v:.1}"),
        });
    }
    let title = format!(
        "detcoll e2e {} {} on {} ({}) | commit {} | {} | {}",
        r.layer, r.dtype, r.backend, r.device, r.git_commit, r.timestamp_utc, r.host.hostname
    );
    let subtitle = format!(
        "x: tokens (all ranks); bitwise across {par} sizes: {}",
        if r.bitwise_across_tp { "yes" } else { "NO" }
    );
    let tokens: Vec<usize> = rows.iter().map(|x| x.tokens).collect();
    svg::document(&title, &subtitle, &tokens, &panels, |out, x, y| legend(out, &rows, par, x, y))
}

fn legend(out: &mut String, rows: &[E2eRow], par: &str, x: f64, mut y: f64) {
    let tps = sizes_of(rows);
    for &tp in &tps {
        svg::legend_line(out, x, y, color(&tps, tp), false, &format!("{par} {tp}"));
        y += 18.0;
    }
    y += 8.0;
    svg::legend_line(out, x, y, "#444", false, INVARIANT);
    if rows.iter().any(|r| r.variant == NAIVE) {
        y += 18.0;
        svg::legend_line(out, x, y, "#444", true, "naive (dashed)");
    }
    y += 28.0;
    for (shape, mode) in [(0, "eager"), (1, "graph")] {
        if rows.iter().any(|r| r.mode == mode) {
            svg::legend_marker(out, shape, x + 12.0, y);
            let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}">{mode}</text>"#, x + 30.0, y + 4.0);
            y += 18.0;
        }
    }
    svg::legend_cross(out, x, y + 8.0, "invariant, not bitwise");
    svg::legend_hollow(out, x, y + 26.0, "beyond the axis");
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn row(variant: &str, tokens: usize, tp: usize, whole: f64, differing: usize) -> E2eRow {
        let stages: Vec<StageMs> = ["all_gather", "gemm1", "activation", "gemm2", "leaf_fold", "reduce_scatter"]
            .into_iter()
            .filter(|s| variant == INVARIANT || *s != "leaf_fold")
            .map(|s| StageMs { stage: s.to_owned(), ms: whole / 6.0 })
            .collect();
        E2eRow {
            layer: "ffn".into(),
            variant: variant.into(),
            dtype: "bf16".into(),
            tokens,
            hidden: Some(256),
            ffn: Some(1024),
            heads: None,
            head_dim: None,
            tp,
            mode: "eager".into(),
            iterations: 3,
            stages,
            stage_method: "staged".into(),
            whole_ms: whole,
            whole_min_ms: whole * 0.9,
            whole_max_ms: whole * 1.1,
            per_rank_whole_ms: vec![whole; tp],
            naive_ms: None,
            invariance_cost: None,
            reference_tp: 1,
            elements: tokens * 256,
            elements_differing: differing,
            repeat_bitwise: true,
        }
    }

    #[test]
    fn naive_rows_pair_with_invariant_rows_and_the_table_reads() {
        let mut rows = vec![row(NAIVE, 64, 2, 4.0, 17), row(INVARIANT, 64, 2, 5.0, 0), row(INVARIANT, 64, 1, 8.0, 0)];
        rows.push(row(NAIVE, 64, 1, 8.0, 0));
        pair_naive(&mut rows);
        assert_eq!((rows[1].naive_ms, rows[1].invariance_cost), (Some(4.0), Some(1.25)));
        assert_eq!(rows[0].invariance_cost, None);
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].contains("| all_gather ms | gemm1 ms | activation ms | gemm2 ms | leaf_fold ms |"), "{t}");
        assert!(lines[0].contains("naive ms | invariance cost | bitwise across sizes |"), "{t}");
        // tp 1 first (invariant, then naive), then tp 2.
        assert!(lines[2].starts_with("| ffn | invariant | bf16 | 64 | 1 | eager |") && lines[2].contains("reference"));
        assert!(lines[3].starts_with("| ffn | naive |"));
        assert!(lines[4].contains("1.25x") && lines[4].contains("= tp 1"), "{}", lines[4]);
        assert!(lines[5].contains("17 of 16384 differ") && lines[5].contains("| - |"), "{}", lines[5]);
        // The naive row has no leaf fold.
        assert_eq!(lines.len(), 6);
        assert_eq!(table(&[]), "(no rows)\n");
        let mut bad = row(INVARIANT, 64, 4, 1.0, 3);
        bad.repeat_bitwise = false;
        assert!(bitwise_cell(&bad).contains("**NO**: 3 of") && bitwise_cell(&bad).contains("repeat NOT bitwise"));
    }

    #[test]
    fn stats() {
        assert_eq!(median_min_max(&[3.0, 1.0, 2.0]), (2.0, 1.0, 3.0));
        assert_eq!(median_min_max(&[4.0, 1.0]), (2.5, 1.0, 4.0));
        assert!(median_min_max(&[]).0.is_nan());
    }
}
