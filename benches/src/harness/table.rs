//! The markdown table printed on stdout: what a reader compares, in the order they compare it.
//!
//! Columns appear only when some row has a value for them (the CPU twin has no native NCCL/RCCL
//! columns, nor an empty kernel), and rows are grouped by size with the baselines first (the
//! copy, then the empty kernel), so each operation reads against the references just above it:
//! "x of memcpy" and "x of empty kernel" are its ratios to them. The title says whether the
//! rows are eager calls or graph replays, and the route `--route` forced, if any. Everything else (per-rank medians, workspace, the
//! one-rank copy) stays in the JSON.
use super::report::{Report, Row};

/// Below this copy time (microseconds) a copy measures call overhead, not bandwidth, so "x of
/// memcpy" compares an operation with a no-op and is left out (a 40 ns host memcpy of 4 KiB
/// made a 4 KiB all_reduce read "419x").
pub const MEANINGFUL_MEMCPY_US: f64 = 1.0;

/// One column: header, markdown alignment, and the cell of a row (`None`: no value).
struct Column {
    header: &'static str,
    align: &'static str,
    cell: fn(&Row) -> Option<String>,
}

fn is_copy(r: &Row) -> bool {
    r.operation == "memcpy"
}

fn is_empty_kernel(r: &Row) -> bool {
    r.operation == super::run::EMPTY_KERNEL
}

/// Reading order within a size: the copy, the empty kernel, the operations.
fn kind_order(r: &Row) -> u8 {
    if is_copy(r) {
        0
    } else if is_empty_kernel(r) {
        1
    } else {
        2
    }
}

fn us(x: f64) -> String {
    if x >= 100.0 { format!("{x:.0}") } else { format!("{x:.2}") }
}

fn yes_no(b: bool) -> String {
    if b { "yes".to_owned() } else { "**NO**".to_owned() }
}

/// `x` of the reference, `None` when either side is missing or not positive.
fn ratio(ours: f64, reference: Option<f64>) -> Option<String> {
    reference.filter(|r| *r > 0.0 && ours.is_finite()).map(|r| format!("{:.2}x", ours / r))
}

/// The copy reference of an operation row, when it is large enough to mean something.
fn meaningful_memcpy(r: &Row) -> Option<f64> {
    r.memcpy_median_us.filter(|m| kind_order(r) == 2 && *m >= MEANINGFUL_MEMCPY_US)
}

/// Every column, in reading order.
fn columns() -> Vec<Column> {
    vec![
        Column { header: "size", align: "---:", cell: |r| Some(human_bytes(r.size_bytes)) },
        Column { header: "operation", align: "---", cell: |r| Some(r.operation.clone()) },
        Column { header: "route", align: "---", cell: |r| Some(r.route.clone()) },
        Column {
            header: "median us (min..max)",
            align: "---:",
            cell: |r| Some(format!("{} ({}..{})", us(r.median_us), us(r.min_us), us(r.max_us))),
        },
        Column { header: "memcpy us", align: "---:", cell: |r| r.memcpy_median_us.filter(|_| !is_copy(r)).map(us) },
        Column { header: "x of memcpy", align: "---:", cell: |r| ratio(r.median_us, meaningful_memcpy(r)) },
        Column { header: "empty kernel us", align: "---:", cell: |r| r.empty_kernel_median_us.map(us) },
        Column { header: "x of empty kernel", align: "---:", cell: |r| ratio(r.median_us, r.empty_kernel_median_us) },
        Column { header: "native us", align: "---:", cell: |r| r.native_default_us.map(us) },
        Column { header: "x of native", align: "---:", cell: |r| ratio(r.median_us, r.native_default_us) },
        Column { header: "native tree/simple us", align: "---:", cell: |r| r.native_tree_simple_us.map(us) },
        Column { header: "x of tree/simple", align: "---:", cell: |r| ratio(r.median_us, r.native_tree_simple_us) },
        Column {
            header: "GB/s",
            align: "---:",
            cell: |r| (r.input_gbps.is_finite() && !is_empty_kernel(r)).then(|| format!("{:.2}", r.input_gbps)),
        },
        Column { header: "repeat bitwise", align: ":---:", cell: |r| Some(yes_no(r.repeat_bitwise)) },
        Column { header: "= fixed tree", align: ":---:", cell: |r| r.bitwise_vs_fixed_tree.map(yes_no) },
    ]
}

/// `4 KiB`, `16 MiB`, `1000 B`.
pub fn human_bytes(b: usize) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{} KiB", b >> 10)
    } else {
        format!("{b} B")
    }
}

/// The rows in reading order: by size, the copy baseline first, then the empty kernel, then the operations in the
/// order they ran (a stable sort keeps it).
pub fn ordered(rows: &[Row]) -> Vec<&Row> {
    let mut v: Vec<&Row> = rows.iter().collect();
    v.sort_by_key(|r| (r.size_bytes, kind_order(r)));
    v
}

/// The table's header, separator and body lines (no title or footer).
pub fn table(rows: &[Row]) -> String {
    let rows = ordered(rows);
    let cols: Vec<Column> = columns().into_iter().filter(|c| rows.iter().any(|r| (c.cell)(r).is_some())).collect();
    if cols.is_empty() {
        return "(no rows)\n".to_owned();
    }
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let mut s = line(cols.iter().map(|c| c.header.to_owned()).collect());
    s.push_str(&line(cols.iter().map(|c| c.align.to_owned()).collect()));
    for r in rows {
        s.push_str(&line(cols.iter().map(|c| (c.cell)(r).unwrap_or_else(|| "-".to_owned())).collect()));
    }
    s
}

/// The markdown printed on stdout: title, table, and how to read it.
pub fn markdown(r: &Report) -> String {
    let mode = if r.graph { "graph replay" } else { "eager" };
    let forced = r.forced_route.as_ref().map(|f| format!(", route {f} forced")).unwrap_or_default();
    let mut s = format!(
        "### detcoll bench: {} x{} ({}, {}, {} build, {mode}{forced}), {} ({}, {} CPUs)\n\n",
        r.backend,
        r.world_size,
        r.launch,
        r.dtype,
        r.build_profile,
        r.reduction_order,
        r.host.hostname,
        r.host.cpu_count
    );
    s.push_str(&table(&r.rows));
    s.push_str(&format!(
        "\nsizes are per-rank input bytes; latency = slowest rank per sample, median over {} samples of {} calls{}; \
         GB/s = size / median; \"x of memcpy\" only where the copy takes at least {MEANINGFUL_MEMCPY_US} us; \
         per-rank medians, workspace and the one-rank copy are in the JSON; all bitwise: {}\n",
        r.args.get("samples").and_then(|v| v.as_u64()).unwrap_or(0),
        r.args.get("iterations").and_then(|v| v.as_u64()).unwrap_or(0),
        match (r.graph, r.args.get("replays").and_then(|v| v.as_u64()).unwrap_or(1)) {
            (false, _) => String::new(),
            (true, 1) => " (one graph replay / iterations)".to_owned(),
            (true, n) => format!(" ({n} graph replays back to back / ({n} x iterations))"),
        },
        if r.all_bitwise { "yes" } else { "NO" }
    ));
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A row as the harness assembles it (CPU-twin-like: no native fields).
    pub(crate) fn row(op: &str, size: usize, median: f64, memcpy: Option<f64>) -> Row {
        Row {
            operation: op.to_owned(),
            dtype: "bf16".to_owned(),
            size_bytes: size,
            input_bytes_per_rank: size,
            output_bytes_per_rank: size,
            lanes: 1,
            route: if op == "memcpy" { "host_memcpy" } else { "ipc_one_shot" }.to_owned(),
            graph: false,
            median_us: median,
            min_us: median * 0.9,
            max_us: median * 1.2,
            per_rank_median_us: vec![median],
            input_gbps: size as f64 / (median * 1e-6) / 1e9,
            memcpy_median_us: memcpy,
            ratio_vs_memcpy: memcpy.map(|m| median / m),
            memcpy_one_rank_median_us: memcpy,
            ratio_vs_memcpy_one_rank: memcpy.map(|m| median / m),
            empty_kernel_median_us: None,
            ratio_vs_empty_kernel: None,
            repeat_bitwise: true,
            bitwise_vs_fixed_tree: (op != "memcpy").then_some(true),
            mismatch: None,
            workspace_bytes: 0,
            peak_temp_bytes: 0,
            native_default_us: None,
            native_tree_simple_us: None,
            ratio_vs_native: None,
            max_abs_diff_vs_native: None,
        }
    }

    /// Rows in the order the harness produced them before: ops first, the copy last.
    pub(crate) fn cpu_rows() -> Vec<Row> {
        vec![
            row("all_reduce", 4096, 16.76, Some(0.04)),
            row("memcpy", 4096, 0.04, Some(0.04)),
            row("all_reduce", 4 << 20, 900.0, Some(150.0)),
            row("memcpy", 4 << 20, 150.0, Some(150.0)),
        ]
    }

    fn header(t: &str) -> Vec<String> {
        t.lines().next().unwrap().trim_matches('|').split('|').map(|c| c.trim().to_owned()).collect()
    }

    fn body(t: &str) -> Vec<Vec<String>> {
        t.lines().skip(2).map(|l| l.trim_matches('|').split('|').map(|c| c.trim().to_owned()).collect()).collect()
    }

    #[test]
    fn cpu_twin_table_drops_native_columns_and_puts_the_copy_first() {
        let t = table(&cpu_rows());
        let h = header(&t);
        assert_eq!(
            h,
            [
                "size",
                "operation",
                "route",
                "median us (min..max)",
                "memcpy us",
                "x of memcpy",
                "GB/s",
                "repeat bitwise",
                "= fixed tree"
            ]
        );
        let b = body(&t);
        let ops: Vec<&str> = b.iter().map(|r| r[1].as_str()).collect();
        assert_eq!(ops, ["memcpy", "all_reduce", "memcpy", "all_reduce"]);
        // 4 KiB: a 40 ns copy is no reference; 4 MiB: 900 / 150 = 6x.
        assert_eq!(b[1][5], "-");
        assert_eq!(b[3][5], "6.00x");
        assert_eq!(b[3][3], "900 (810..1080)");
        // The copy row is the reference, not compared with itself.
        assert_eq!((b[0][4].as_str(), b[0][5].as_str(), b[0][8].as_str()), ("-", "-", "-"));
        assert_eq!(b[1][8], "yes");
    }

    #[test]
    fn gpu_table_keeps_native_ratios() {
        let mut rows = cpu_rows();
        for r in rows.iter_mut().filter(|r| r.operation != "memcpy") {
            r.native_default_us = Some(r.median_us / 2.0);
            r.native_tree_simple_us = Some(r.median_us * 2.0);
        }
        rows[0].repeat_bitwise = false;
        let t = table(&rows);
        let h = header(&t);
        for c in ["native us", "x of native", "native tree/simple us", "x of tree/simple"] {
            assert!(h.iter().any(|x| x == c), "{c} missing: {h:?}");
        }
        let i = h.iter().position(|x| x == "x of native").unwrap();
        let j = h.iter().position(|x| x == "x of tree/simple").unwrap();
        let b = body(&t);
        assert_eq!((b[1][i].as_str(), b[1][j].as_str()), ("2.00x", "0.50x"));
        assert_eq!(b[0][i], "-", "the copy has no native reference");
        let rb = h.iter().position(|x| x == "repeat bitwise").unwrap();
        assert_eq!(b[1][rb], "**NO**");
    }

    #[test]
    fn gpu_table_has_the_empty_kernel_and_its_ratio() {
        let mut rows = cpu_rows();
        let mut empty = row(crate::harness::run::EMPTY_KERNEL, 4096, 2.0, None);
        empty.input_gbps = 0.0;
        empty.bitwise_vs_fixed_tree = None;
        rows.push(empty);
        for r in rows.iter_mut().filter(|r| r.size_bytes == 4096 && r.operation != "empty_kernel") {
            r.empty_kernel_median_us = Some(2.0);
        }
        let t = table(&rows);
        let h = header(&t);
        let (e, x) = (
            h.iter().position(|c| c == "empty kernel us").unwrap(),
            h.iter().position(|c| c == "x of empty kernel").unwrap(),
        );
        let gb = h.iter().position(|c| c == "GB/s").unwrap();
        let b = body(&t);
        let ops: Vec<&str> = b.iter().map(|r| r[1].as_str()).collect();
        assert_eq!(ops, ["memcpy", "empty_kernel", "all_reduce", "memcpy", "all_reduce"]);
        // 16.76 us all_reduce over a 2 us empty kernel.
        assert_eq!((b[2][e].as_str(), b[2][x].as_str()), ("2.00", "8.38x"));
        assert_eq!((b[1][e].as_str(), b[1][x].as_str(), b[1][gb].as_str()), ("-", "-", "-"));
        assert_eq!(b[4][x], "-", "no empty kernel at 4 MiB");
    }

    #[test]
    fn the_title_says_graph_and_the_forced_route() {
        let v = serde_json::json!({
            "schema_version": 2, "tool": "t", "backend": "cuda-ipc-threads", "build_profile": "release",
            "world_size": 2, "launch": "threads", "dtype": "bf16", "reduction_order": "(r0+r1)",
            "git_commit": "abc", "capabilities": { "strict_fixed_order": true, "supports_async_overlap": false,
            "supports_compute_communication_fusion": false, "supports_graph_capture": true, "capacity_bytes": 4096 },
            "size_convention": "", "latency_method": "", "host": { "hostname": "h", "cpu_count": 2, "os": "linux",
            "arch": "x86_64" }, "args": { "samples": 5, "iterations": 50 }, "timestamp_unix": 0, "timestamp_utc": "",
            "notes": [], "all_bitwise": true, "rows": []
        });
        // A report without the fields (written before them) reads as eager and unforced.
        let mut r: Report = serde_json::from_value(v).unwrap();
        assert!(!r.graph && r.forced_route.is_none());
        assert!(markdown(&r).contains("release build, eager), "), "{}", markdown(&r));
        r.graph = true;
        r.forced_route = Some("ipc_push_ll".to_owned());
        let m = markdown(&r);
        assert!(m.contains("release build, graph replay, route ipc_push_ll forced), "), "{m}");
        assert!(m.contains("(one graph replay / iterations)"), "{m}");
        r.args.as_object_mut().unwrap().insert("replays".into(), 4.into());
        assert!(markdown(&r).contains("(4 graph replays back to back / (4 x iterations))"), "{}", markdown(&r));
    }

    #[test]
    fn odd_reports_do_not_panic() {
        assert_eq!(table(&[]), "(no rows)\n");
        let mut r = row("all_gather", 1000, f64::NAN, None);
        r.input_gbps = f64::NAN;
        let t = table(&[r]);
        assert!(!header(&t).contains(&"GB/s".to_owned()) && !header(&t).contains(&"memcpy us".to_owned()), "{t}");
        assert_eq!(human_bytes(1000), "1000 B");
        assert_eq!(human_bytes(16 << 20), "16 MiB");
    }
}
