//! What rank 0 prints on stderr while the rows run: `[k/N] ... (eta 12s)` per row and one
//! summary line. Pure formatting, so the wording is tested without running a benchmark.
use super::report::Row;
use super::table::human_bytes;

/// Fixed per-row cost in bytes-equivalent for the time estimate: a row's time grows with its
/// size, but even the smallest row costs barriers, allocation and checking.
const ROW_OVERHEAD_BYTES: f64 = 256.0 * 1024.0;

/// The weight of a row of `size` bytes in the time estimate.
pub fn weight(size: usize) -> f64 {
    size as f64 + ROW_OVERHEAD_BYTES
}

/// Seconds left, from the time spent on the weight done so far; `None` before any row finished.
pub fn eta_secs(elapsed_secs: f64, done_weight: f64, total_weight: f64) -> Option<f64> {
    (done_weight > 0.0 && elapsed_secs.is_finite())
        .then(|| (elapsed_secs / done_weight * (total_weight - done_weight)).max(0.0))
}

/// `850ms`, `12s`, `3m05s`.
pub fn duration(secs: f64) -> String {
    if !secs.is_finite() || secs < 0.0 {
        return "?".to_owned();
    }
    if secs < 1.0 {
        return format!("{:.0}ms", secs * 1e3);
    }
    let s = secs.round() as u64;
    if s < 60 { format!("{s}s") } else { format!("{}m{:02}s", s / 60, s % 60) }
}

/// `bitwise`, or `NOT BITWISE (first mismatch)`.
fn verdict(r: &Row) -> String {
    if r.bitwise() { "bitwise".to_owned() } else { format!("NOT BITWISE ({})", r.mismatch.as_deref().unwrap_or("?")) }
}

/// `[3/25] all_reduce bf16 4 KiB ipc_one_shot: 12.34 us (11.00..15.20), bitwise (eta 12s)`.
pub fn row_line(k: usize, n: usize, r: &Row, eta: Option<f64>) -> String {
    let eta = eta.map(|e| format!(" (eta {})", duration(e))).unwrap_or_default();
    format!(
        "[{k}/{n}] {} {} {} {}: {:.2} us ({:.2}..{:.2}), {}{eta}",
        r.operation,
        r.dtype,
        human_bytes(r.size_bytes),
        r.route,
        r.median_us,
        r.min_us,
        r.max_us,
        verdict(r)
    )
}

/// `[bench] 25 rows in 41s; all bitwise: yes`.
pub fn summary(rows: &[Row], elapsed_secs: f64) -> String {
    let bad = rows.iter().filter(|r| !r.bitwise()).count();
    let verdict = if bad == 0 { "yes".to_owned() } else { format!("NO ({bad} rows not bitwise)") };
    format!("[bench] {} rows in {}; all bitwise: {verdict}", rows.len(), duration(elapsed_secs))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::table::tests::row;

    #[test]
    fn durations() {
        assert_eq!(duration(0.85), "850ms");
        assert_eq!(duration(12.4), "12s");
        assert_eq!(duration(185.0), "3m05s");
        assert_eq!(duration(f64::NAN), "?");
    }

    #[test]
    fn eta_scales_the_time_spent_by_the_weight_left() {
        assert_eq!(eta_secs(1.0, 0.0, 10.0), None);
        assert_eq!(eta_secs(2.0, 1.0, 4.0), Some(6.0));
        assert_eq!(eta_secs(2.0, 4.0, 4.0), Some(0.0));
        assert!(weight(4 << 20) > 10.0 * weight(4096));
    }

    #[test]
    fn row_lines_and_summary() {
        let mut r = row("all_reduce", 4096, 12.345, None);
        assert_eq!(
            row_line(3, 25, &r, Some(12.2)),
            "[3/25] all_reduce bf16 4 KiB ipc_one_shot: 12.35 us (11.11..14.81), bitwise (eta 12s)"
        );
        assert!(!row_line(25, 25, &r, None).contains("eta"));
        let ok = summary(std::slice::from_ref(&r), 41.0);
        assert_eq!(ok, "[bench] 1 rows in 41s; all bitwise: yes");
        r.bitwise_vs_fixed_tree = Some(false);
        r.mismatch = Some("rank 1: element 0".to_owned());
        assert!(row_line(1, 1, &r, None).contains("NOT BITWISE (rank 1: element 0)"));
        assert_eq!(summary(&[r], 0.5), "[bench] 1 rows in 500ms; all bitwise: NO (1 rows not bitwise)");
        assert_eq!(summary(&[], 0.0), "[bench] 0 rows in 0ms; all bitwise: yes");
    }
}
