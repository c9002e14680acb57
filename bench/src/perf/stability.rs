//! When a load level has settled: perf_analyzer's rule, on throughput.
//!
//! A level is stable once the last three measurement windows' throughputs
//! are each within `pct` percent of their mean (so max and min differ by at
//! most about 2 × pct). Fewer than three windows is never stable, and a level
//! that answered nothing is not "stably zero": it is reported unstable so
//! the failure shows.

/// Windows that must agree.
pub const WINDOWS: usize = 3;

/// Whether the last [`WINDOWS`] throughputs agree within `pct` percent.
pub fn is_stable(throughputs: &[f64], pct: f64) -> bool {
    if throughputs.len() < WINDOWS {
        return false;
    }
    let last = &throughputs[throughputs.len() - WINDOWS..];
    let mean = last.iter().sum::<f64>() / WINDOWS as f64;
    if mean <= 0.0 {
        return false;
    }
    last.iter().all(|t| ((t - mean) / mean).abs() * 100.0 <= pct)
}

#[cfg(test)]
mod tests {
    use super::is_stable;

    #[test]
    fn needs_three_windows() {
        assert!(!is_stable(&[], 10.0));
        assert!(!is_stable(&[100.0, 100.0], 10.0));
        assert!(is_stable(&[100.0, 100.0, 100.0], 10.0));
    }

    #[test]
    fn only_the_last_three_count() {
        assert!(is_stable(&[1.0, 500.0, 100.0, 105.0, 95.0], 10.0));
        assert!(!is_stable(&[100.0, 100.0, 100.0, 130.0], 10.0));
    }

    #[test]
    fn within_percentage_of_mean() {
        // Mean 100: 91 and 109 are within 10 %, 88 is not.
        assert!(is_stable(&[91.0, 100.0, 109.0], 10.0));
        assert!(!is_stable(&[88.0, 100.0, 112.0], 10.0));
        assert!(is_stable(&[88.0, 100.0, 112.0], 15.0));
    }

    #[test]
    fn zero_throughput_is_not_stable() {
        assert!(!is_stable(&[0.0, 0.0, 0.0], 10.0));
    }
}
