//! A small SVG chart panel: size on a log2 x axis, a log10 or linear y axis, series of points
//! with min..max bars, a marker shape per point, reference lines. Hand-written (no plotting or
//! font dependency: the viewer renders the text), so the harness builds anywhere.
use std::fmt::Write;

/// Marker shapes, one per route (the plot's legend maps them back).
pub const SHAPES: usize = 6;

/// One point of a series.
#[derive(Debug, Clone)]
pub struct Point {
    pub size: usize,
    pub y: f64,
    /// The min..max bar, when there is one.
    pub range: Option<(f64, f64)>,
    /// Index into the marker shapes (`% SHAPES`).
    pub shape: usize,
    /// The point failed a bitwise check: a cross over its marker (hollow markers
    /// mean "beyond the axis").
    pub not_bitwise: bool,
    /// Tooltip text.
    pub tip: String,
}

/// A line through points of one color.
#[derive(Debug, Clone)]
pub struct Series {
    pub color: &'static str,
    pub dashed: bool,
    pub points: Vec<Point>,
}

/// A horizontal reference line (e.g. NVLink's nominal bandwidth, ratio 1).
#[derive(Debug, Clone)]
pub struct RefLine {
    pub y: f64,
    pub label: String,
}

/// What one panel shows.
#[derive(Debug, Clone)]
pub struct Panel {
    pub title: String,
    pub y_label: String,
    pub log_y: bool,
    pub series: Vec<Series>,
    pub refs: Vec<RefLine>,
    /// Points whose y falls outside are drawn on the edge, hollow, and the panel says so.
    /// (Not bitwise has its own mark, a cross: [`Point::not_bitwise`].)
    pub y_range: (f64, f64),
    pub y_fmt: fn(f64) -> String,
}

/// A rectangle of the document.
#[derive(Debug, Clone, Copy)]
pub struct Rect {
    pub x: f64,
    pub y: f64,
    pub w: f64,
    pub h: f64,
}

/// Escapes text for SVG.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// `4K`, `16M`, `1000`.
pub fn size_label(b: usize) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{}G", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}K", b >> 10)
    } else {
        format!("{b}")
    }
}

/// Whole decades around the positive finite `values` (`(0, 1)` without any).
pub fn log_range(values: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values
        .into_iter()
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| (a.min(v), b.max(v)));
    if !lo.is_finite() {
        return (1.0, 10.0);
    }
    let (a, mut b) = (lo.log10().floor(), hi.log10().ceil());
    if b <= a {
        b = a + 1.0;
    }
    (10f64.powf(a), 10f64.powf(b))
}

/// The marker of `shape` at (x, y).
fn marker(out: &mut String, shape: usize, x: f64, y: f64, fill: &str, color: &str, tip: &str) {
    let r = 4.5;
    let body = match shape % SHAPES {
        0 => format!(r#"<circle cx="{x:.1}" cy="{y:.1}" r="{r}""#),
        1 => format!(r#"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}""#, x - r, y - r, 2.0 * r, 2.0 * r),
        2 => format!(r#"<polygon points="{x:.1},{:.1} {:.1},{:.1} {:.1},{:.1}""#, y - r, x - r, y + r, x + r, y + r),
        3 => format!(
            r#"<polygon points="{x:.1},{:.1} {:.1},{y:.1} {x:.1},{:.1} {:.1},{y:.1}""#,
            y - r,
            x + r,
            y + r,
            x - r
        ),
        4 => format!(r#"<polygon points="{x:.1},{:.1} {:.1},{:.1} {:.1},{:.1}""#, y + r, x - r, y - r, x + r, y - r),
        _ => format!(
            r#"<polygon points="{:.1},{y:.1} {x:.1},{:.1} {:.1},{y:.1} {x:.1},{:.1}" transform="rotate(45 {x:.1} {y:.1})""#,
            x - r,
            y - r * 0.4,
            x + r,
            y + r * 0.4
        ),
    };
    let _ = writeln!(
        out,
        r#"{body} fill="{fill}" stroke="{color}" stroke-width="1.5"><title>{}</title></{}>"#,
        esc(tip),
        {
            match shape % SHAPES {
                0 => "circle",
                1 => "rect",
                _ => "polygon",
            }
        }
    );
}

/// The not-bitwise mark at (x, y): a black cross over the point's marker, larger than it, so
/// it reads on a filled and on a hollow marker alike.
fn cross(out: &mut String, x: f64, y: f64, tip: &str) {
    let r = 6.5;
    let _ = writeln!(
        out,
        r##"<path d="M{:.1},{:.1}L{:.1},{:.1}M{:.1},{:.1}L{:.1},{:.1}" stroke="#000" stroke-width="2" fill="none"><title>{}</title></path>"##,
        x - r,
        y - r,
        x + r,
        y + r,
        x - r,
        y + r,
        x + r,
        y - r,
        esc(tip)
    );
}

/// A legend entry for the not-bitwise mark: a grey marker with the cross over it, and `label`.
pub fn legend_cross(out: &mut String, x: f64, y: f64, label: &str) {
    marker(out, 0, x + 12.0, y, "#888", "#444", "");
    cross(out, x + 12.0, y, "");
    let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, x + 30.0, y + 4.0, esc(label));
}

/// A legend entry for points beyond the axis: a hollow marker, and `label`.
pub fn legend_hollow(out: &mut String, x: f64, y: f64, label: &str) {
    marker(out, 0, x + 12.0, y, "white", "#444", "");
    let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, x + 30.0, y + 4.0, esc(label));
}

/// The hint in a panel with points beyond the axis that their value is in the tooltip: for the
/// SVG, where a viewer shows tooltips; [`static_copy`] removes it for a picture (the PNG).
pub const HOVER_HINT: &str = " (hover for the value)";

/// `svg` for a static picture (the PNG): without the hints that point at tooltips, which a
/// picture has none of.
pub fn static_copy(svg: &str) -> String {
    svg.replace(HOVER_HINT, "")
}

/// A legend entry's line sample at (x, y) and its label; `dashed` as a dashed series is drawn.
pub fn legend_line(out: &mut String, x: f64, y: f64, color: &str, dashed: bool, label: &str) {
    let dash = if dashed { r#" stroke-dasharray="6 4""# } else { "" };
    let _ = writeln!(
        out,
        r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="2"{dash}/>"#,
        x + 24.0
    );
    let _ = writeln!(out, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, x + 30.0, y + 4.0, esc(label));
}

/// Page layout of [`document`]: width, margins, header, panel height and the gap between panels.
const PAGE_W: f64 = 1000.0;
const PAGE_LEFT: f64 = 90.0;
const PAGE_RIGHT: f64 = 240.0;
const PAGE_HEADER: f64 = 70.0;
const PANEL_H: f64 = 300.0;
const PANEL_GAP: f64 = 70.0;

/// A whole SVG page: the `title` and `subtitle` lines, `panels` stacked over one log2 x axis
/// whose ticks are `xs` (`no data` without any), and the legend, which `legend` draws at the
/// (x, y) it is given, right of the panels.
pub fn document(
    title: &str,
    subtitle: &str,
    xs: &[usize],
    panels: &[Panel],
    legend: impl FnOnce(&mut String, f64, f64),
) -> String {
    let h = PAGE_HEADER + panels.len() as f64 * (PANEL_H + PANEL_GAP);
    let w = PAGE_W;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect x="0" y="0" width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(out, r#"<text x="20" y="24" font-size="15" font-weight="bold">{}</text>"#, esc(title));
    let _ = writeln!(out, r##"<text x="20" y="42" font-size="11" fill="#444">{}</text>"##, esc(subtitle));
    let mut xs = xs.to_vec();
    xs.sort_unstable();
    xs.dedup();
    let (Some(&first), Some(&last)) = (xs.first(), xs.last()) else {
        let _ = writeln!(out, r#"<text x="{PAGE_LEFT}" y="{:.1}">no data</text>"#, PAGE_HEADER + 40.0);
        out.push_str("</svg>\n");
        return out;
    };
    let lx = |b: usize| (b.max(1) as f64).log2();
    let (a, b) = (lx(first), lx(last));
    let pad = if b - a < 1.0 { 1.0 } else { 0.5 };
    let pw = PAGE_W - PAGE_LEFT - PAGE_RIGHT;
    for (i, p) in panels.iter().enumerate() {
        let top = PAGE_HEADER + 20.0 + i as f64 * (PANEL_H + PANEL_GAP);
        panel(&mut out, Rect { x: PAGE_LEFT, y: top, w: pw, h: PANEL_H }, (a - pad, b + pad), &xs, p);
    }
    legend(&mut out, PAGE_LEFT + pw + 20.0, PAGE_HEADER + 30.0);
    out.push_str("</svg>\n");
    out
}

/// A legend entry's marker (no tooltip).
pub fn legend_marker(out: &mut String, shape: usize, x: f64, y: f64) {
    marker(out, shape, x, y, "#888", "#444", "");
}

/// Draws `p` into `area`; `x_range` is the log2 size domain, `sizes` the x ticks.
pub fn panel(out: &mut String, area: Rect, x_range: (f64, f64), sizes: &[usize], p: &Panel) {
    let Rect { x: left, y: top, w, h } = area;
    let (x0, x1) = x_range;
    let (y0, y1) = p.y_range;
    let fy = |v: f64| {
        if p.log_y {
            (v.max(f64::MIN_POSITIVE).log10() - y0.log10()) / (y1.log10() - y0.log10())
        } else {
            (v - y0) / (y1 - y0)
        }
    };
    let px = |s: usize| left + ((s.max(1) as f64).log2() - x0) / (x1 - x0) * w;
    // Clamped into the frame; `true` when it had to be.
    let py = |v: f64| {
        let f = fy(v);
        if !f.is_finite() {
            return (top + h, true);
        }
        (top + h - f.clamp(0.0, 1.0) * h, !(0.0..=1.0).contains(&f))
    };
    let _ = writeln!(out, r#"<text x="{left}" y="{:.1}" font-weight="bold">{}</text>"#, top - 8.0, esc(&p.title));
    let _ = writeln!(out, r##"<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="none" stroke="#444"/>"##);
    // Y grid: decades on a log axis, 5 steps on a linear one.
    let ticks: Vec<f64> = if p.log_y {
        let (a, b) = (y0.log10().round() as i32, y1.log10().round() as i32);
        (a..=b).map(|d| 10f64.powi(d)).collect()
    } else {
        (0..=5).map(|i| y0 + (y1 - y0) * f64::from(i) / 5.0).collect()
    };
    for t in ticks {
        let (y, _) = py(t);
        let _ = writeln!(out, r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/>"##, left + w);
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            left - 6.0,
            y + 4.0,
            esc(&(p.y_fmt)(t))
        );
    }
    for &s in sizes {
        let x = px(s);
        let _ = writeln!(out, r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#eee"/>"##, top + h);
        let _ = writeln!(
            out,
            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle" font-size="10">{}</text>"#,
            top + h + 14.0,
            size_label(s)
        );
    }
    let cy = top + h / 2.0;
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{cy:.1}" text-anchor="middle" transform="rotate(-90 {:.1} {cy:.1})">{}</text>"#,
        left - 58.0,
        left - 58.0,
        esc(&p.y_label)
    );
    for r in &p.refs {
        let (y, out_of_range) = py(r.y);
        if out_of_range {
            continue;
        }
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#000" stroke-dasharray="8 4" stroke-width="1"/>"##,
            left + w
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" font-size="10" fill="#000">{}</text>"##,
            left + w - 4.0,
            y - 4.0,
            esc(&r.label)
        );
    }
    let mut clamped_any = false;
    for s in &p.series {
        let dash = if s.dashed { r#" stroke-dasharray="6 4""# } else { "" };
        let path: Vec<String> = s.points.iter().map(|q| format!("{:.1},{:.1}", px(q.size), py(q.y).0)).collect();
        let _ = writeln!(
            out,
            r#"<polyline fill="none" stroke="{}" stroke-width="1.8"{dash} points="{}"/>"#,
            s.color,
            path.join(" ")
        );
        for q in &s.points {
            let x = px(q.size);
            let (y, clamped) = py(q.y);
            if let Some((lo, hi)) = q.range.filter(|_| !clamped) {
                let (ylo, yhi) = (py(lo).0, py(hi).0);
                // Caps make a short bar visible; the bar spans at least 2 px.
                let (ylo, yhi) = (ylo.max(y + 1.0), yhi.min(y - 1.0));
                let _ = writeln!(
                    out,
                    r#"<path d="M{x:.1},{ylo:.1}V{yhi:.1}M{:.1},{ylo:.1}h8M{:.1},{yhi:.1}h8" stroke="{}" stroke-width="1.2" fill="none"/>"#,
                    x - 4.0,
                    x - 4.0,
                    s.color
                );
            }
            let fill = if clamped { "white" } else { s.color };
            let mut tip = if clamped { format!("{} (outside the axis)", q.tip) } else { q.tip.clone() };
            if q.not_bitwise {
                tip.push_str(" NOT bitwise");
            }
            marker(out, q.shape, x, y, fill, s.color, &tip);
            if q.not_bitwise {
                cross(out, x, y, &tip);
            }
            clamped_any |= clamped;
        }
    }
    if clamped_any {
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" font-size="10" fill="#555">hollow on the edge: beyond the axis{HOVER_HINT}</text>"##,
            left + 6.0,
            top + 12.0
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_ranges() {
        assert_eq!(size_label(4096), "4K");
        assert_eq!(size_label(16 << 20), "16M");
        assert_eq!(size_label(1000), "1000");
        assert_eq!(esc("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
        assert_eq!(log_range([0.5, 30.0]), (0.1, 100.0));
        assert_eq!(log_range([10.0]), (10.0, 100.0));
        assert_eq!(log_range([f64::NAN, 0.0]), (1.0, 10.0));
    }

    #[test]
    fn points_outside_the_range_are_clamped_and_marked() {
        let p = Panel {
            title: "t".into(),
            y_label: "y".into(),
            log_y: true,
            series: vec![Series {
                color: "#123456",
                dashed: false,
                points: vec![
                    Point {
                        size: 4096,
                        y: 10.0,
                        range: Some((9.0, 12.0)),
                        shape: 1,
                        not_bitwise: false,
                        tip: "in".into(),
                    },
                    Point {
                        size: 8192,
                        y: 0.001,
                        range: Some((0.0009, 0.002)),
                        shape: 0,
                        not_bitwise: false,
                        tip: "low".into(),
                    },
                ],
            }],
            refs: vec![RefLine { y: 50.0, label: "ref".into() }, RefLine { y: 1e9, label: "gone".into() }],
            y_range: (1.0, 100.0),
            y_fmt: |v| format!("{v}"),
        };
        let mut s = String::new();
        panel(&mut s, Rect { x: 80.0, y: 40.0, w: 400.0, h: 200.0 }, (11.0, 14.0), &[4096, 8192], &p);
        assert!(s.contains("low (outside the axis)") && s.contains("beyond the axis"));
        assert!(s.contains("<rect x=\"") && s.contains("<title>in</title>"));
        assert!(s.contains(">ref<") && !s.contains(">gone<"));
        // One min..max bar: the clamped point has none.
        assert_eq!(s.matches("h8M").count(), 1);
        // The SVG points at the tooltips; its static copy (the PNG) does not.
        assert!(s.contains("beyond the axis (hover for the value)"));
        let still = static_copy(&s);
        assert!(still.contains("beyond the axis<") && !still.contains("hover"), "{still}");
        // Both points are bitwise: no cross.
        assert!(!s.contains("NOT bitwise") && !s.contains(r##"stroke="#000" stroke-width="2""##));
    }

    #[test]
    fn not_bitwise_is_a_cross_and_beyond_the_axis_is_hollow() {
        let point =
            |size, y, not_bitwise| Point { size, y, range: None, shape: 0, not_bitwise, tip: format!("p{size}") };
        let p = Panel {
            title: "t".into(),
            y_label: "y".into(),
            log_y: true,
            series: vec![Series {
                color: "#123456",
                dashed: false,
                // In range and bitwise; in range, not bitwise; beyond the axis, bitwise.
                points: vec![point(4096, 10.0, false), point(8192, 10.0, true), point(16384, 0.001, false)],
            }],
            refs: vec![],
            y_range: (1.0, 100.0),
            y_fmt: |v| format!("{v}"),
        };
        let mut s = String::new();
        panel(&mut s, Rect { x: 80.0, y: 40.0, w: 400.0, h: 200.0 }, (11.0, 15.0), &[4096, 8192, 16384], &p);
        let circles: Vec<&str> = s.lines().filter(|l| l.starts_with("<circle")).collect();
        assert_eq!(circles.len(), 3, "{s}");
        // The not-bitwise point keeps its filled route marker and gets one cross; only the point
        // beyond the axis is hollow.
        assert!(circles[0].contains(r##"fill="#123456""##) && circles[1].contains(r##"fill="#123456""##));
        assert!(circles[2].contains(r#"fill="white""#) && !circles[2].contains("NOT bitwise"));
        let crosses: Vec<&str> =
            s.lines().filter(|l| l.starts_with("<path") && l.contains(r##"stroke="#000""##)).collect();
        assert_eq!(crosses.len(), 1, "{s}");
        assert!(crosses[0].contains("p8192 NOT bitwise"));
        // The legend entries draw the same marks.
        let mut legend = String::new();
        legend_cross(&mut legend, 0.0, 0.0, "not bitwise");
        legend_hollow(&mut legend, 0.0, 20.0, "beyond the axis");
        assert!(legend.contains(r##"stroke="#000""##) && legend.contains(r#"fill="white""#), "{legend}");
    }
}
