//! The report's picture, as SVG: what a reader should see at a glance.
//!
//! * latency vs size, one color per operation, one marker shape per route (so a route switch,
//!   e.g. all_reduce going to RS+AG above a threshold, shows), min..max as capped bars; the
//!   y range comes from the operations, so a 40 ns host copy does not stretch it over decades
//!   (copy points below it sit on the edge, hollow, and the panel says so); a point that is
//!   not bitwise has a cross over its marker;
//! * bandwidth (GB/s = size / median) vs size, the copy as a dashed reference series and, on
//!   GPUs, NVLink's nominal 900 GB/s as a dashed line;
//! * on reports with a native NCCL/RCCL reference, our latency over native default and over
//!   native Tree/Simple, with 1.0 marked.
//!
//! The title names backend, world, dtype, commit, date and host.
use super::report::{Report, Row};
use super::svg::{self, Panel, Point, RefLine, Series, esc, log_range};
use std::fmt::Write;

const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];
const COPY_COLOR: &str = "#777777";
/// NVLink 4 (H100/H200) nominal bandwidth per GPU, for scale only.
pub const NVLINK_GBPS: f64 = 900.0;

/// Label of the latency tick `us`.
fn latency_label(us: f64) -> String {
    let (v, unit) = match us {
        u if u < 1.0 => (u * 1e3, "ns"),
        u if u < 1e3 => (u, "us"),
        u if u < 1e6 => (u / 1e3, "ms"),
        u => (u / 1e6, "s"),
    };
    format!("{} {unit}", trim(v))
}

fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

fn plain_label(v: f64) -> String {
    trim(v)
}

fn is_copy(r: &Row) -> bool {
    r.operation == "memcpy"
}

/// Rows that can be plotted (a positive finite median).
fn plottable(report: &Report) -> Vec<&Row> {
    report.rows.iter().filter(|r| r.median_us.is_finite() && r.median_us > 0.0).collect()
}

/// Distinct values of `key` in first-appearance order.
fn distinct<'a>(rows: &[&'a Row], key: fn(&'a Row) -> &'a str) -> Vec<&'a str> {
    let mut v: Vec<&str> = Vec::new();
    for r in rows {
        let k = key(r);
        if !v.contains(&k) {
            v.push(k);
        }
    }
    v
}

/// Operations (not the copy) in first-appearance order, with their color.
fn operations<'a>(rows: &[&'a Row]) -> Vec<(&'a str, &'static str)> {
    distinct(rows, |r| &r.operation)
        .into_iter()
        .filter(|o| *o != "memcpy")
        .enumerate()
        .map(|(i, o)| (o, COLORS[i % COLORS.len()]))
        .collect()
}

/// One series per operation (then the copy), with `y` of a row (`None`: no point).
fn series_of(
    rows: &[&Row],
    routes: &[&str],
    with_copy: bool,
    y: impl Fn(&Row) -> Option<(f64, Option<(f64, f64)>)>,
) -> Vec<Series> {
    let mut names: Vec<(&str, &'static str, bool)> = operations(rows).into_iter().map(|(o, c)| (o, c, false)).collect();
    if with_copy {
        names.push(("memcpy", COPY_COLOR, true));
    }
    names
        .into_iter()
        .map(|(name, color, dashed)| {
            let mut pts: Vec<&Row> = rows.iter().copied().filter(|r| r.operation == name).collect();
            pts.sort_by_key(|r| r.size_bytes);
            let points = pts
                .into_iter()
                .filter_map(|r| {
                    let (v, range) = y(r)?;
                    Some(Point {
                        size: r.size_bytes,
                        y: v,
                        range,
                        shape: routes.iter().position(|x| *x == r.route).unwrap_or(0),
                        not_bitwise: !r.bitwise(),
                        tip: format!("{name} {}: {} ({})", svg::size_label(r.size_bytes), trim(v), r.route),
                    })
                })
                .collect();
            Series { color, dashed, points }
        })
        .filter(|s| !s.points.is_empty())
        .collect()
}

fn latency_panel(rows: &[&Row], routes: &[&str]) -> Panel {
    let ops: Vec<&Row> = rows.iter().copied().filter(|r| !is_copy(r)).collect();
    // The operations set the range; the copy shows where it fits (one decade of slack below).
    let base = if ops.is_empty() { rows } else { &ops[..] };
    let (mut lo, hi) = log_range(base.iter().flat_map(|r| [r.min_us, r.median_us, r.max_us]));
    let copy_lo = rows.iter().filter(|r| is_copy(r)).map(|r| r.median_us).fold(f64::INFINITY, f64::min);
    if copy_lo < lo && copy_lo >= lo / 10.0 {
        lo /= 10.0;
    }
    Panel {
        title: "latency per call (slowest rank; median, bars min..max)".into(),
        y_label: "latency".into(),
        log_y: true,
        series: series_of(rows, routes, true, |r| Some((r.median_us, Some((r.min_us, r.max_us))))),
        refs: vec![],
        y_range: (lo, hi),
        y_fmt: latency_label,
    }
}

fn bandwidth_panel(rows: &[&Row], routes: &[&str], nvlink: bool) -> Panel {
    let bw = |r: &Row| {
        let g = |us: f64| r.size_bytes as f64 / (us * 1e-6) / 1e9;
        (r.input_gbps.is_finite() && r.input_gbps > 0.0).then(|| (r.input_gbps, Some((g(r.max_us), g(r.min_us)))))
    };
    let mut values: Vec<f64> = rows.iter().filter_map(|r| bw(r).map(|b| b.0)).collect();
    if nvlink {
        values.push(NVLINK_GBPS);
    }
    let refs = if nvlink { vec![RefLine { y: NVLINK_GBPS, label: "NVLink nominal 900 GB/s".into() }] } else { vec![] };
    Panel {
        title: "bandwidth: size / median (copy dashed)".into(),
        y_label: "GB/s".into(),
        log_y: true,
        series: series_of(rows, routes, true, bw),
        refs,
        y_range: log_range(values),
        y_fmt: plain_label,
    }
}

/// `None` when no row has a native reference (the CPU twin).
fn native_panel(rows: &[&Row], routes: &[&str]) -> Option<Panel> {
    let ratio = |n: Option<f64>, r: &Row| n.filter(|n| *n > 0.0).map(|n| (r.median_us / n, None));
    let mut series = series_of(rows, routes, false, |r| ratio(r.native_default_us, r));
    let tree = series_of(rows, routes, false, |r| ratio(r.native_tree_simple_us, r));
    if series.is_empty() && tree.is_empty() {
        return None;
    }
    series.extend(tree.into_iter().map(|s| Series { dashed: true, ..s }));
    let hi = series.iter().flat_map(|s| s.points.iter().map(|p| p.y)).filter(|v| v.is_finite()).fold(1.0, f64::max);
    Some(Panel {
        title: "ours / native (solid: NCCL/RCCL default, dashed: Tree/Simple); below 1 is faster".into(),
        y_label: "x of native".into(),
        log_y: false,
        series,
        refs: vec![RefLine { y: 1.0, label: "= native".into() }],
        y_range: (0.0, (hi * 1.1).ceil()),
        y_fmt: plain_label,
    })
}

/// The title line: what ran, which code, when, where.
pub fn title(r: &Report) -> String {
    format!(
        "detcoll {} x{} {} ({}, {} build) | commit {} | {} | {}",
        r.backend, r.world_size, r.dtype, r.launch, r.build_profile, r.git_commit, r.timestamp_utc, r.host.hostname
    )
}

/// The legend: operations by color, the copy, routes by shape.
fn legend(out: &mut String, rows: &[&Row], routes: &[&str], x: f64, mut y: f64) {
    for (op, color) in operations(rows) {
        svg::legend_line(out, x, y, color, false, op);
        y += 18.0;
    }
    if rows.iter().any(|r| is_copy(r)) {
        svg::legend_line(out, x, y, COPY_COLOR, true, "memcpy (baseline)");
        y += 18.0;
    }
    y += 10.0;
    let _ = writeln!(out, r#"<text x="{x:.1}" y="{y:.1}" font-weight="bold">route (marker)</text>"#);
    for (i, route) in routes.iter().enumerate() {
        y += 18.0;
        svg::legend_marker(out, i, x + 12.0, y);
        let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, x + 30.0, y + 4.0, esc(route));
    }
    y += 26.0;
    svg::legend_cross(out, x, y, "not bitwise");
    y += 18.0;
    svg::legend_hollow(out, x, y, "beyond the axis");
}

/// The SVG document.
/// `svg` rendered to PNG (pure Rust: resvg), with the system's fonts for the text; a host
/// without fonts still gets the picture, without its labels.
///
/// A picture has no tooltips: it is rendered from [`svg::static_copy`], without the hints that
/// point at them.
pub fn png(svg_text: &str) -> anyhow::Result<Vec<u8>> {
    use resvg::{tiny_skia, usvg};
    let svg_text = &svg::static_copy(svg_text);
    let mut options = usvg::Options::default();
    let db = options.fontdb_mut();
    db.load_system_fonts();
    // The plot asks for `sans-serif`, which fontdb maps to Arial: use a sans face this host has.
    let families: Vec<String> = db.faces().flat_map(|f| f.families.iter().map(|(name, _)| name.clone())).collect();
    if let Some(sans) = ["Arial", "DejaVu Sans", "Liberation Sans", "Noto Sans", "FreeSans"]
        .into_iter()
        .find(|want| families.iter().any(|f| f == want))
        .map(str::to_string)
        .or_else(|| families.first().cloned())
    {
        db.set_sans_serif_family(sans);
    }
    let tree = usvg::Tree::from_str(svg_text, &options)?;
    let size = tree.size().to_int_size();
    let mut pixmap = tiny_skia::Pixmap::new(size.width(), size.height())
        .ok_or_else(|| anyhow::anyhow!("a plot of {}x{} pixels", size.width(), size.height()))?;
    pixmap.fill(tiny_skia::Color::WHITE);
    resvg::render(&tree, tiny_skia::Transform::default(), &mut pixmap.as_mut());
    Ok(pixmap.encode_png()?)
}

pub fn svg(report: &Report) -> String {
    let rows = plottable(report);
    let routes = distinct(&rows, |r| &r.route);
    // NVLink's figure is an NVIDIA one: only CUDA backends get the line.
    let nvlink = report.backend.contains("cuda");
    let mut panels = vec![latency_panel(&rows, &routes), bandwidth_panel(&rows, &routes, nvlink)];
    panels.extend(native_panel(&rows, &routes));
    let subtitle = format!(
        "x: per-rank input bytes; reduction order {}; all bitwise: {}",
        report.reduction_order,
        if report.all_bitwise { "yes" } else { "NO" }
    );
    let sizes: Vec<usize> = rows.iter().map(|r| r.size_bytes).collect();
    svg::document(&title(report), &subtitle, &sizes, &panels, |out, x, y| legend(out, &rows, &routes, x, y))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::table::tests::{cpu_rows, row};

    fn report(rows: Vec<Row>) -> Report {
        let json = serde_json::json!({
            "schema_version": 2, "tool": "t", "backend": "cpu-twin", "build_profile": "debug", "world_size": 4,
            "launch": "processes", "dtype": "bf16", "reduction_order": "((r0+r1)+(r2+r3))", "git_commit": "abc1234",
            "capabilities": {"strict_fixed_order": true, "supports_async_overlap": false,
                "supports_compute_communication_fusion": false, "supports_graph_capture": false, "capacity_bytes": 1},
            "size_convention": "", "latency_method": "", "host": {"hostname": "box", "cpu_count": 2, "os": "linux",
                "arch": "x86_64"}, "args": {}, "timestamp_unix": 0, "timestamp_utc": "2026-12-01T00:00:00Z",
            "notes": [], "all_bitwise": true, "rows": []
        });
        Report { rows, ..serde_json::from_value(json).unwrap() }
    }

    #[test]
    fn cpu_plot_marks_routes_names_the_commit_and_has_no_native_panel() {
        let mut rows = cpu_rows();
        rows[2].route = "ipc_rs_ag".into();
        let s = svg(&report(rows));
        assert!(s.starts_with("<svg") && s.trim_end().ends_with("</svg>"));
        let png = png(&s).expect("the plot renders to PNG");
        assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 1000, "{} bytes", png.len());
        for t in ["abc1234", "box", "2026-12-01", "cpu-twin x4 bf16", "ipc_rs_ag", "ipc_one_shot", "memcpy (baseline)"]
        {
            assert!(s.contains(t), "{t} missing");
        }
        assert!(s.contains("bandwidth") && !s.contains("x of native") && !s.contains("NVLink"));
        // The 40 ns copy is below the operations' range (16.76..1080 us): drawn on the edge.
        assert!(s.contains("(outside the axis)"));
        // Two routes: a circle and a square marker in the legend and the points.
        assert!(s.contains("<rect x=") && s.contains("<circle"));
    }

    #[test]
    fn not_bitwise_has_its_own_mark_and_the_png_has_no_hover_hint() {
        let mut rows = cpu_rows();
        rows[2].bitwise_vs_fixed_tree = Some(false);
        let s = svg(&report(rows));
        // The legend tells the two marks apart; the failing all_reduce point has the cross.
        assert!(s.contains(">not bitwise<") && s.contains(">beyond the axis<"), "{s}");
        assert!(!s.contains("hollow: not bitwise"));
        assert!(s.contains("all_reduce 4M: 900 (ipc_one_shot) NOT bitwise</title></path>"), "{s}");
        assert_eq!(s.matches("NOT bitwise</title></path>").count(), 2, "one cross in each panel");
        // The SVG points at its tooltips; the PNG is rendered without that hint.
        assert!(s.contains(svg::HOVER_HINT));
        assert_eq!(png(&s).unwrap(), png(&svg::static_copy(&s)).unwrap());
    }

    #[test]
    fn gpu_plot_has_the_native_panel_and_nvlink() {
        let mut rows = cpu_rows();
        for r in rows.iter_mut().filter(|r| r.operation != "memcpy") {
            r.native_default_us = Some(r.median_us / 2.0);
            r.native_tree_simple_us = Some(r.median_us);
        }
        let mut rep = report(rows);
        rep.backend = "cuda-ipc".into();
        let s = svg(&rep);
        assert!(s.contains("x of native") && s.contains("= native") && s.contains("NVLink nominal 900 GB/s"));
    }

    #[test]
    fn odd_reports_do_not_panic() {
        assert!(svg(&report(vec![])).contains("no data"));
        let mut r = row("all_reduce", 4096, f64::NAN, None);
        r.input_gbps = f64::NAN;
        assert!(svg(&report(vec![r])).contains("no data"));
        let only_copy = svg(&report(vec![row("memcpy", 1, 0.01, None)]));
        assert!(only_copy.contains("memcpy (baseline)"));
        assert_eq!(latency_label(0.04), "40 ns");
        assert_eq!(latency_label(1500.0), "1.5 ms");
        assert_eq!(latency_label(10.0), "10 us");
    }
}
