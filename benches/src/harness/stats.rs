//! Timing statistics and their reduction across ranks.
use serde::{Deserialize, Serialize};

/// Median (mean of the two middle values for an even count), min and max of `v`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// `None` for an empty slice.
    pub fn of(v: &[f64]) -> Option<Summary> {
        if v.is_empty() {
            return None;
        }
        let mut s = v.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { (s[n / 2 - 1] + s[n / 2]) / 2.0 };
        Some(Summary { median, min: s[0], max: s[n - 1] })
    }
}

/// Per-sample latencies (seconds per call) of every rank, `per_rank[r][s]`, reduced the way the
/// seeds' benchmark reports them: for each sample the slowest rank's latency, then
/// median/min/max over samples. Also returns every rank's own median.
pub fn slowest_rank(per_rank: &[Vec<f64>]) -> Option<(Summary, Vec<f64>)> {
    let samples = per_rank.iter().map(Vec::len).min()?;
    if samples == 0 {
        return None;
    }
    let slowest: Vec<f64> =
        (0..samples).map(|s| per_rank.iter().map(|r| r[s]).fold(f64::NEG_INFINITY, f64::max)).collect();
    let medians = per_rank.iter().map(|r| Summary::of(r).map_or(f64::NAN, |s| s.median)).collect();
    Some((Summary::of(&slowest)?, medians))
}

/// Bytes per second expressed in GB/s (10^9 bytes).
pub fn gbps(bytes: usize, seconds: f64) -> f64 {
    if seconds > 0.0 { bytes as f64 / seconds / 1e9 } else { 0.0 }
}

/// A 64-bit FNV-1a digest of `bytes` (word-wise, so 16 MiB hashes in milliseconds). Used to
/// compare outputs across iterations and ranks through the bootstrap.
pub fn digest(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let w = u64::from_le_bytes(c.try_into().expect("8-byte chunk"));
        h = (h ^ w).wrapping_mul(0x0000_0100_0000_01B3);
    }
    for &b in chunks.remainder() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3);
    }
    (h ^ bytes.len() as u64).wrapping_mul(0x0000_0100_0000_01B3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_odd_and_even_counts() {
        assert_eq!(Summary::of(&[3.0, 1.0, 2.0]), Some(Summary { median: 2.0, min: 1.0, max: 3.0 }));
        assert_eq!(Summary::of(&[4.0, 1.0, 3.0, 2.0]), Some(Summary { median: 2.5, min: 1.0, max: 4.0 }));
        assert_eq!(Summary::of(&[5.0]), Some(Summary { median: 5.0, min: 5.0, max: 5.0 }));
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn slowest_rank_takes_the_max_per_sample_then_the_median() {
        // Rank 1 is slow in sample 0, rank 0 in sample 2.
        let per_rank = vec![vec![1.0, 2.0, 9.0], vec![5.0, 1.0, 1.0]];
        let (s, medians) = slowest_rank(&per_rank).unwrap();
        // Slowest per sample: [5, 2, 9].
        assert_eq!(s, Summary { median: 5.0, min: 2.0, max: 9.0 });
        assert_eq!(medians, vec![2.0, 1.0]);
        // One rank: its own statistics.
        let (s, _) = slowest_rank(&[vec![3.0, 1.0]]).unwrap();
        assert_eq!(s, Summary { median: 2.0, min: 1.0, max: 3.0 });
        assert!(slowest_rank(&[]).is_none());
        assert!(slowest_rank(&[vec![], vec![1.0]]).is_none());
    }

    #[test]
    fn bandwidth_and_digest() {
        assert_eq!(gbps(1_000_000_000, 1.0), 1.0);
        assert_eq!(gbps(4096, 0.0), 0.0);
        let a = vec![1u8; 4099];
        let mut b = a.clone();
        assert_eq!(digest(&a), digest(&b));
        b[4098] = 2;
        assert_ne!(digest(&a), digest(&b));
        b[4098] = 1;
        b[7] = 0;
        assert_ne!(digest(&a), digest(&b));
        assert_ne!(digest(&[]), digest(&[0]));
    }
}
