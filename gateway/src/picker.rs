//! Choosing the endpoint for one request.
//!
//! [`PowerOfTwoChoices`] samples two distinct available endpoints at random
//! and takes the one with the lower load estimate: nearly the balance of
//! "least loaded" without every request reading every endpoint, and without
//! the herd that always picking the global minimum causes when estimates are
//! a little stale. [`RoundRobin`] ignores load; it exists to measure what the
//! load estimate buys.
//!
//! Ejected endpoints are skipped; when every endpoint is ejected, all are
//! candidates again, so ejection can slow a model down but never make it
//! unroutable.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use crate::load::EndpointLoad;

/// Picks the index of the endpoint a request goes to; `None` only when
/// there is no endpoint at all.
pub trait Picker: Send + Sync {
    fn pick(&self, endpoints: &[Arc<EndpointLoad>], now: Instant) -> Option<usize>;
}

/// The indices a pick chooses among: those not ejected at `now`, or all of
/// them when every one is.
enum Candidates {
    /// Every endpoint (the usual case: nothing ejected), without allocating.
    All(usize),
    These(Vec<usize>),
}

impl Candidates {
    fn of(endpoints: &[Arc<EndpointLoad>], now: Instant) -> Candidates {
        if endpoints.iter().all(|e| e.available(now)) {
            return Candidates::All(endpoints.len());
        }
        let available: Vec<usize> = (0..endpoints.len()).filter(|&i| endpoints[i].available(now)).collect();
        if available.is_empty() {
            Candidates::All(endpoints.len())
        } else {
            Candidates::These(available)
        }
    }

    fn len(&self) -> usize {
        match self {
            Candidates::All(n) => *n,
            Candidates::These(these) => these.len(),
        }
    }

    /// The endpoint index of the `i`th candidate.
    fn get(&self, i: usize) -> usize {
        match self {
            Candidates::All(_) => i,
            Candidates::These(these) => these[i],
        }
    }
}

/// Power of two choices on [`EndpointLoad::estimate`].
#[derive(Debug)]
pub struct PowerOfTwoChoices {
    /// xorshift64* state: picks need speed and spread, not secrecy.
    state: AtomicU64,
}

impl PowerOfTwoChoices {
    /// A picker whose choices follow from `seed` (tests fix it; the gateway
    /// seeds from the clock).
    pub fn with_seed(seed: u64) -> Self {
        PowerOfTwoChoices {
            state: AtomicU64::new(seed | 1),
        }
    }

    /// A uniformly spread number below `n` (n > 0).
    fn below(&self, n: usize) -> usize {
        let mut x = self.state.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        // A lost race between two picks only repeats a number: harmless.
        self.state.store(x, Ordering::Relaxed);
        let random = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        ((u128::from(random) * n as u128) >> 64) as usize
    }
}

impl Picker for PowerOfTwoChoices {
    fn pick(&self, endpoints: &[Arc<EndpointLoad>], now: Instant) -> Option<usize> {
        let candidates = Candidates::of(endpoints, now);
        match candidates.len() {
            0 => None,
            1 => Some(candidates.get(0)),
            n => {
                let first = self.below(n);
                // A second, different one: shift by 1..n.
                let second = (first + 1 + self.below(n - 1)) % n;
                let (a, b) = (candidates.get(first), candidates.get(second));
                // Ties go to the first sample, itself random.
                Some(if endpoints[b].estimate() < endpoints[a].estimate() {
                    b
                } else {
                    a
                })
            }
        }
    }
}

/// Each available endpoint in turn, whatever its load.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl Picker for RoundRobin {
    fn pick(&self, endpoints: &[Arc<EndpointLoad>], now: Instant) -> Option<usize> {
        let candidates = Candidates::of(endpoints, now);
        if candidates.len() == 0 {
            return None;
        }
        Some(candidates.get(self.next.fetch_add(1, Ordering::Relaxed) % candidates.len()))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::load::Ejection;

    fn endpoints(loads: &[u32]) -> Vec<Arc<EndpointLoad>> {
        loads
            .iter()
            .map(|load| {
                let endpoint = EndpointLoad::new();
                endpoint.report_queue_depth(*load);
                endpoint
            })
            .collect()
    }

    fn counts(picker: &dyn Picker, endpoints: &[Arc<EndpointLoad>], picks: usize) -> Vec<usize> {
        let mut counts = vec![0; endpoints.len()];
        let now = Instant::now();
        for _ in 0..picks {
            counts[picker.pick(endpoints, now).unwrap()] += 1;
        }
        counts
    }

    #[test]
    fn equal_loads_spread_evenly() {
        let picker = PowerOfTwoChoices::with_seed(7);
        let counts = counts(&picker, &endpoints(&[0, 0, 0]), 30_000);
        for count in &counts {
            assert!((9_000..=11_000).contains(count), "{counts:?}");
        }
    }

    #[test]
    fn the_most_loaded_endpoint_never_wins_a_comparison() {
        let picker = PowerOfTwoChoices::with_seed(11);
        let counts = counts(&picker, &endpoints(&[2, 9, 2, 1]), 10_000);
        assert_eq!(counts[1], 0, "{counts:?}");
        // The least loaded wins every pair it is sampled in: about half the picks.
        assert!(counts[3] > counts[0] && counts[3] > counts[2], "{counts:?}");
    }

    #[test]
    fn requests_in_flight_count_as_load() {
        let picker = PowerOfTwoChoices::with_seed(3);
        let endpoints = endpoints(&[0, 0]);
        let _busy: Vec<_> = (0..4).map(|_| endpoints[0].start()).collect();
        let counts = counts(&picker, &endpoints, 1_000);
        assert_eq!(counts, vec![0, 1_000]);
    }

    #[test]
    fn ejected_endpoints_sit_out_unless_all_are() {
        let policy = Ejection {
            threshold: 1,
            base: Duration::from_secs(60),
            max: Duration::from_secs(60),
        };
        let endpoints = endpoints(&[0, 0, 0]);
        let now = Instant::now();
        endpoints[0].failed(now, &policy);
        for picker in [&PowerOfTwoChoices::with_seed(5) as &dyn Picker, &RoundRobin::default()] {
            assert_eq!(counts(picker, &endpoints, 300)[0], 0);
        }
        endpoints[1].failed(now, &policy);
        endpoints[2].failed(now, &policy);
        let all_out = counts(&PowerOfTwoChoices::with_seed(5), &endpoints, 300);
        assert!(
            all_out.iter().all(|c| *c > 0),
            "all ejected: all candidates again {all_out:?}"
        );
    }

    #[test]
    fn round_robin_ignores_load() {
        let counts = counts(&RoundRobin::default(), &endpoints(&[0, 50, 0]), 300);
        assert_eq!(counts, vec![100, 100, 100]);
    }

    #[test]
    fn nothing_to_pick_from() {
        let now = Instant::now();
        assert_eq!(PowerOfTwoChoices::with_seed(1).pick(&[], now), None);
        assert_eq!(RoundRobin::default().pick(&[], now), None);
        assert_eq!(PowerOfTwoChoices::with_seed(1).pick(&endpoints(&[4]), now), Some(0));
    }
}
