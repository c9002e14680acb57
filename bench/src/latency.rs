//! Latency percentiles over every recorded request.
//!
//! A measurement keeps each latency (microseconds) in a `Vec` and sorts it
//! once at the end: exact percentiles, and at a few bytes per request far
//! cheaper than anything the requests themselves cost.

/// Summary of one level's latencies, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LatencySummary {
    pub p50_us: u64,
    pub p90_us: u64,
    pub p95_us: u64,
    pub p99_us: u64,
    pub avg_us: f64,
}

/// Nearest-rank percentile of sorted samples: the smallest value with at
/// least `pct` percent of samples at or below it. 0 for no samples.
pub fn percentile(sorted: &[u64], pct: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (pct / 100.0 * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl LatencySummary {
    /// Sorts `samples` in place and summarises them.
    pub fn from_samples(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let sum: u128 = samples.iter().map(|&v| u128::from(v)).sum();
        LatencySummary {
            p50_us: percentile(samples, 50.0),
            p90_us: percentile(samples, 90.0),
            p95_us: percentile(samples, 95.0),
            p99_us: percentile(samples, 99.0),
            avg_us: sum as f64 / samples.len() as f64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{LatencySummary, percentile};

    #[test]
    fn nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 90.0), 90);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&v, 0.0), 1);
        assert_eq!(percentile(&[7], 99.0), 7);
        assert_eq!(percentile(&[], 50.0), 0);
        // Ten samples: p95 is the 10th (ceil(9.5)), p50 the 5th.
        let t: Vec<u64> = (1..=10).collect();
        assert_eq!(percentile(&t, 95.0), 10);
        assert_eq!(percentile(&t, 50.0), 5);
    }

    #[test]
    fn summary_sorts_and_averages() {
        let mut v = vec![30, 10, 20, 40];
        let s = LatencySummary::from_samples(&mut v);
        assert_eq!(s.p50_us, 20);
        assert_eq!(s.p99_us, 40);
        assert!((s.avg_us - 25.0).abs() < 1e-9);
        assert_eq!(LatencySummary::from_samples(&mut []), LatencySummary::default());
    }
}
