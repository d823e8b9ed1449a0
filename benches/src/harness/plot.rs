//! A latency-vs-size plot of a report, as a hand-written SVG (log2 sizes, log10 latency).
use super::report::{Report, Row};
use std::fmt::Write;

const W: f64 = 820.0;
const H: f64 = 500.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 50.0;
const BOTTOM: f64 = 60.0;
const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn size_label(b: usize) -> String {
    if b >= 1 << 30 && b % (1 << 30) == 0 {
        format!("{}G", b >> 30)
    } else if b >= 1 << 20 && b % (1 << 20) == 0 {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b % (1 << 10) == 0 {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}

/// Label of the grid line at 10^`decade` microseconds.
fn decade_label(decade: i32) -> String {
    let (unit, shift) = match decade {
        i32::MIN..=-1 => ("ns", 3),
        0..=2 => ("us", 0),
        3..=5 => ("ms", -3),
        _ => ("s", -6),
    };
    let e = decade + shift;
    if e >= 0 { format!("{} {unit}", 10u64.pow(e as u32)) } else { format!("1e{e} {unit}") }
}

/// Series in first-appearance order: operations, then the copy baseline last.
fn series(rows: &[Row]) -> Vec<(String, Vec<&Row>)> {
    let mut names: Vec<String> = Vec::new();
    for r in rows {
        if !names.contains(&r.operation) {
            names.push(r.operation.clone());
        }
    }
    names.sort_by_key(|n| n == "memcpy");
    names
        .into_iter()
        .map(|n| {
            let mut pts: Vec<&Row> = rows.iter().filter(|r| r.operation == n).collect();
            pts.sort_by_key(|r| r.size_bytes);
            (n, pts)
        })
        .collect()
}

/// The SVG document.
pub fn svg(report: &Report) -> String {
    let rows: Vec<&Row> = report.rows.iter().filter(|r| r.median_us.is_finite() && r.median_us > 0.0).collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect x="0" y="0" width="{W}" height="{H}" fill="white"/>"#);
    let title = format!(
        "detcoll {} x{} ({}), {}: latency vs size (slowest rank, median; bars min..max)",
        report.backend, report.world_size, report.launch, report.dtype
    );
    let _ = writeln!(out, r#"<text x="{}" y="24" font-size="14" font-weight="bold">{}</text>"#, LEFT, esc(&title));
    if rows.is_empty() {
        let _ = writeln!(out, r#"<text x="{LEFT}" y="{}">no data</text></svg>"#, H / 2.0);
        return out;
    }
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let lx = |b: usize| (b as f64).log2();
    let (mut x0, mut x1) = rows
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), r| (a.min(lx(r.size_bytes)), b.max(lx(r.size_bytes))));
    // Half an octave of margin (a whole one around a single size) keeps markers off the frame.
    let pad = if x1 - x0 < 1.0 { 1.0 } else { 0.5 };
    x0 -= pad;
    x1 += pad;
    let ys = rows.iter().flat_map(|r| [r.min_us, r.median_us, r.max_us]).filter(|v| v.is_finite() && *v > 0.0);
    let (lo, hi) = ys.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    let (y0, mut y1) = (lo.log10().floor(), hi.log10().ceil());
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let px = |b: usize| LEFT + (lx(b) - x0) / (x1 - x0) * pw;
    let py = |us: f64| TOP + ph - (us.max(10f64.powf(y0)).log10() - y0) / (y1 - y0) * ph;

    // Axes and grid.
    let _ = writeln!(out, r##"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#444"/>"##);
    let mut d = y0 as i32;
    while d as f64 <= y1 {
        let us = 10f64.powi(d);
        let y = py(us);
        let _ = writeln!(out, r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##, LEFT + pw);
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            LEFT - 6.0,
            y + 4.0,
            esc(&decade_label(d))
        );
        d += 1;
    }
    let mut sizes: Vec<usize> = rows.iter().map(|r| r.size_bytes).collect();
    sizes.sort_unstable();
    sizes.dedup();
    for &s in &sizes {
        let x = px(s);
        let _ = writeln!(out, r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/>"##, TOP + ph);
        let _ = writeln!(
            out,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            TOP + ph + 18.0,
            size_label(s)
        );
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">size (per-rank input bytes)</text>"#,
        LEFT + pw / 2.0,
        H - 14.0
    );
    let _ = writeln!(
        out,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">latency per call</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );

    // Series.
    let all: Vec<Row> = rows.iter().map(|r| (*r).clone()).collect();
    for (i, (name, pts)) in series(&all).iter().enumerate() {
        let baseline = name == "memcpy";
        let color = if baseline { "#777" } else { COLORS[i % COLORS.len()] };
        let dash = if baseline { r#" stroke-dasharray="6 4""# } else { "" };
        let path: Vec<String> = pts.iter().map(|r| format!("{:.1},{:.1}", px(r.size_bytes), py(r.median_us))).collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2"{dash} points="{}"/>"#,
            path.join(" ")
        );
        for r in pts {
            let (x, y) = (px(r.size_bytes), py(r.median_us));
            let _ = writeln!(
                out,
                r#"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" stroke="{color}"/>"#,
                py(r.min_us),
                py(r.max_us)
            );
            let fill = if r.bitwise() { color } else { "white" };
            let _ = writeln!(
                out,
                r#"<circle cx="{x:.1}" cy="{y:.1}" r="3.5" fill="{fill}" stroke="{color}"><title>{} {} B: {:.2} us ({})</title></circle>"#,
                esc(name),
                r.size_bytes,
                r.median_us,
                esc(&r.route)
            );
        }
        let ly = TOP + 10.0 + i as f64 * 20.0;
        let lx0 = LEFT + pw + 16.0;
        let _ = writeln!(
            out,
            r#"<line x1="{lx0:.1}" y1="{ly:.1}" x2="{:.1}" y2="{ly:.1}" stroke="{color}" stroke-width="2"{dash}/>"#,
            lx0 + 24.0
        );
        let label = if baseline { format!("{name} (baseline)") } else { name.clone() };
        let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, lx0 + 30.0, ly + 4.0, esc(&label));
    }
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#555">hollow marker: not bitwise</text>"##,
        LEFT + pw + 16.0,
        TOP + ph
    );
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels() {
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(16 << 20), "16M");
        assert_eq!(size_label(1000), "1000");
        assert_eq!(decade_label(-1), "100 ns");
        assert_eq!(decade_label(-3), "1 ns");
        assert_eq!(decade_label(1), "10 us");
        assert_eq!(decade_label(4), "10 ms");
        assert_eq!(decade_label(6), "1 s");
        assert_eq!(esc("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
