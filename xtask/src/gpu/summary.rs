//! What a suite's libtest output says ([`Counts`], also for a binary killed before its
//! summary) and the table `gpu-test` prints at the end.

/// Counts from libtest output: the `test result:` lines, and the per-test lines as a fallback
/// for a binary that died before its summary.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    pub skipped: u64,
    /// `test result:` lines seen.
    pub results: u64,
    /// Per-test lines (`test NAME ... ok|FAILED|ignored`) seen: passed, failed, ignored.
    pub lines: [u64; 3],
    /// `skipped: <reason>` lines the tests wrote (to stderr): our GPU tests pass without a GPU
    /// after saying so, and are counted skipped, not passed (one line per test).
    pub said_skipped: u64,
}

impl Counts {
    /// Adds the counts of one output line.
    pub fn add_line(&mut self, line: &str) {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("test result: ") {
            self.results += 1;
            for part in rest.split([';', '.']) {
                let mut w = part.split_whitespace();
                let (Some(n), Some(what)) = (w.next(), w.next()) else { continue };
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => self.passed += n,
                    "failed" => self.failed += n,
                    "ignored" => self.skipped += n,
                    _ => {}
                }
            }
        } else if let Some((_, verdict)) = line.strip_prefix("test ").and_then(|r| r.rsplit_once(" ... ")) {
            match verdict {
                "ok" => self.lines[0] += 1,
                "FAILED" => self.lines[1] += 1,
                v if v.starts_with("ignored") => self.lines[2] += 1,
                _ => {}
            }
        }
    }
    /// Counts a line the tests wrote to stderr.
    pub fn add_stderr_line(&mut self, line: &str) {
        if line.trim_start().starts_with("skipped:") {
            self.said_skipped += 1;
        }
    }
    /// (passed, failed, skipped): from the summaries, or from the per-test lines without one;
    /// a test that passed after saying `skipped:` is skipped.
    pub fn totals(&self) -> (u64, u64, u64) {
        let (passed, failed, skipped) = if self.results > 0 {
            (self.passed, self.failed, self.skipped)
        } else {
            (self.lines[0], self.lines[1], self.lines[2])
        };
        let said = self.said_skipped.min(passed);
        (passed - said, failed, skipped + said)
    }
    pub fn failed(&self) -> u64 {
        self.totals().1
    }
}

pub(super) struct SuiteResult {
    pub(super) name: String,
    pub(super) ok: bool,
    pub(super) status: String,
    pub(super) counts: Counts,
    pub(super) secs: f64,
}

/// The summary table printed at the end.
pub(super) fn summary_table(results: &[SuiteResult]) -> String {
    let mut s = String::from(
        "| suite | result | passed | failed | skipped | seconds |\n| --- | --- | ---: | ---: | ---: | ---: |\n",
    );
    let mut total = (0, 0, 0);
    for r in results {
        let (p, f, k) = r.counts.totals();
        s.push_str(&format!("| {} | {} | {p} | {f} | {k} | {:.1} |\n", r.name, r.status, r.secs));
        total = (total.0 + p, total.1 + f, total.2 + k);
    }
    let ok = results.iter().all(|r| r.ok);
    s.push_str(&format!(
        "| **total** | {} | {} | {} | {} | {:.1} |\n",
        if ok { "ok" } else { "FAILED" },
        total.0,
        total.1,
        total.2,
        results.iter().map(|r| r.secs).sum::<f64>()
    ));
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libtest_result_lines_are_counted() {
        let mut c = Counts::default();
        c.add_line("running 5 tests");
        c.add_line("test a ... ok");
        c.add_line("test result: ok. 3 passed; 0 failed; 2 ignored; 0 measured; 1 filtered out; finished in 0.01s");
        c.add_line("test result: FAILED. 1 passed; 2 failed; 0 ignored; 0 measured; 0 filtered out; finished in 1.50s");
        assert_eq!(c.totals(), (4, 2, 2));
        assert_eq!(c.results, 2);
        // Killed before its summary: the per-test lines count.
        let mut k = Counts::default();
        for l in
            ["test a::world1 ... ok", "test a::world2 ... FAILED", "test b ... ignored, needs a GPU", "test c ... ok"]
        {
            k.add_line(l);
        }
        assert_eq!(k.totals(), (2, 1, 1));
        assert_eq!(k.failed(), 1);
    }

    #[test]
    fn tests_that_said_skipped_count_as_skipped_not_passed() {
        // A GPU test without a GPU passes after writing `skipped: <reason>` to stderr.
        let mut c = Counts::default();
        c.add_line("test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out; finished in 0.1s");
        for _ in 0..12 {
            c.add_stderr_line("skipped: no CUDA device (cuInit: CUDA_ERROR_NO_DEVICE)");
        }
        c.add_stderr_line("[rank 0] a line that is not a skip");
        assert_eq!(c.totals(), (0, 0, 12));
        // Some skipped, some ran.
        c.said_skipped = 5;
        assert_eq!(c.totals(), (7, 0, 5));
    }

    #[test]
    fn summary_table_totals() {
        let r = vec![
            SuiteResult {
                name: "a".into(),
                ok: true,
                status: "ok".into(),
                counts: Counts { passed: 2, failed: 0, skipped: 1, results: 1, lines: [0; 3], said_skipped: 0 },
                secs: 1.0,
            },
            SuiteResult {
                name: "b".into(),
                ok: false,
                status: "FAILED".into(),
                counts: Counts { passed: 0, failed: 0, skipped: 0, results: 0, lines: [1, 1, 0], said_skipped: 0 },
                secs: 2.0,
            },
        ];
        let t = summary_table(&r);
        assert!(t.contains("| **total** | FAILED | 3 | 1 | 1 | 3.0 |"), "{t}");
    }
}
