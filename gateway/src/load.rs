//! The load estimate of one endpoint, and its passive outlier ejection.
//!
//! The estimate is what the gateway itself has in flight to the endpoint
//! plus the queue depth the pod last reported: the first is exact and
//! immediate, the second covers load from other gateway replicas and direct
//! callers. Both are plain atomics, read on every pick and written on every
//! request, without a lock.
//!
//! Ejection is passive, as in Envoy: after `threshold` consecutive failures
//! (connect errors, resets: failures that say nothing about the request) an
//! endpoint sits out for a backoff that doubles with each ejection in a row,
//! up to a maximum; one success clears the record.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// When an endpoint that keeps failing is left out, and for how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ejection {
    /// Consecutive failures that eject.
    pub threshold: u32,
    /// The first ejection's length; each one in a row doubles it.
    pub base: Duration,
    pub max: Duration,
}

impl Default for Ejection {
    fn default() -> Self {
        Ejection {
            threshold: 5,
            base: Duration::from_secs(1),
            max: Duration::from_secs(30),
        }
    }
}

/// One endpoint's load and health, shared by every request routed to it.
#[derive(Debug, Default)]
pub struct EndpointLoad {
    outstanding: AtomicU32,
    queue_depth: AtomicU32,
    /// Set while an ejection may be running, so that a pick checks a flag,
    /// not the lock, for the healthy endpoints it looks at.
    ejected: AtomicBool,
    /// Set while failures are on record, so that a success checks a flag,
    /// not the lock.
    troubled: AtomicBool,
    failures: Mutex<Failures>,
}

#[derive(Debug, Default)]
struct Failures {
    consecutive: u32,
    /// Ejections in a row, for the backoff.
    ejections: u32,
    ejected_until: Option<Instant>,
}

impl EndpointLoad {
    pub fn new() -> Arc<Self> {
        Arc::new(EndpointLoad::default())
    }

    /// Requests in flight here from this gateway, plus the pod's last
    /// reported queue depth.
    pub fn estimate(&self) -> u32 {
        self.outstanding
            .load(Ordering::Relaxed)
            .saturating_add(self.queue_depth.load(Ordering::Relaxed))
    }

    /// Requests in flight here from this gateway.
    pub fn outstanding(&self) -> u32 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Counts a request as in flight until the guard is dropped (on every
    /// path: answered, failed, or cancelled by the client).
    pub fn start(self: &Arc<Self>) -> InFlight {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        InFlight {
            endpoint: Arc::clone(self),
        }
    }

    /// The queue depth the pod reported with its last answer.
    pub fn report_queue_depth(&self, depth: u32) {
        self.queue_depth.store(depth, Ordering::Relaxed);
    }

    /// The queue depth the pod last reported.
    pub fn queue_depth(&self) -> u32 {
        self.queue_depth.load(Ordering::Relaxed)
    }

    /// A request reached the server and was answered: the record is clean.
    /// Free (one atomic read) for an endpoint with no failures on record,
    /// which is every answer of a healthy pod.
    pub fn succeeded(&self) {
        if !self.troubled.load(Ordering::Acquire) {
            return;
        }
        self.troubled.store(false, Ordering::Release);
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        *failures = Failures::default();
        self.ejected.store(false, Ordering::Release);
    }

    /// A failure that says the endpoint, not the request, is at fault.
    /// Returns true when this failure ejected it.
    pub fn failed(&self, now: Instant, policy: &Ejection) -> bool {
        let mut failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        self.troubled.store(true, Ordering::Release);
        failures.consecutive += 1;
        if failures.consecutive < policy.threshold {
            return false;
        }
        let factor = 1u32.checked_shl(failures.ejections).unwrap_or(u32::MAX);
        let backoff = policy.base.saturating_mul(factor).min(policy.max);
        failures.ejected_until = Some(now + backoff);
        failures.ejections = failures.ejections.saturating_add(1);
        failures.consecutive = 0;
        self.ejected.store(true, Ordering::Release);
        true
    }

    /// Not ejected at `now`.
    pub fn available(&self, now: Instant) -> bool {
        if !self.ejected.load(Ordering::Acquire) {
            return true;
        }
        let failures = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        failures.ejected_until.is_none_or(|until| now >= until)
    }
}

/// A request in flight to an endpoint; dropping it ends the count.
#[derive(Debug)]
pub struct InFlight {
    endpoint: Arc<EndpointLoad>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.endpoint.outstanding.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_estimate_is_in_flight_plus_reported_queue() {
        let endpoint = EndpointLoad::new();
        let first = endpoint.start();
        let second = endpoint.start();
        endpoint.report_queue_depth(3);
        assert_eq!((endpoint.outstanding(), endpoint.estimate()), (2, 5));
        drop(first);
        drop(second);
        assert_eq!(endpoint.estimate(), 3);
        endpoint.report_queue_depth(0);
        assert_eq!(endpoint.estimate(), 0);
    }

    #[test]
    fn repeated_failures_eject_with_a_doubling_backoff() {
        let policy = Ejection {
            threshold: 3,
            base: Duration::from_secs(1),
            max: Duration::from_secs(3),
        };
        let endpoint = EndpointLoad::new();
        let t0 = Instant::now();
        assert!(!endpoint.failed(t0, &policy));
        assert!(!endpoint.failed(t0, &policy));
        assert!(endpoint.failed(t0, &policy), "the third in a row ejects");
        assert!(!endpoint.available(t0));
        assert!(endpoint.available(t0 + Duration::from_secs(1)));

        // Failing again at once: twice as long, then capped.
        let t1 = t0 + Duration::from_secs(1);
        for _ in 0..3 {
            endpoint.failed(t1, &policy);
        }
        assert!(!endpoint.available(t1 + Duration::from_millis(1999)));
        assert!(endpoint.available(t1 + Duration::from_secs(2)));
        let t2 = t1 + Duration::from_secs(2);
        for _ in 0..3 {
            endpoint.failed(t2, &policy);
        }
        assert!(endpoint.available(t2 + Duration::from_secs(3)), "capped at max");
    }

    #[test]
    fn a_success_clears_the_record() {
        let policy = Ejection {
            threshold: 2,
            ..Ejection::default()
        };
        let endpoint = EndpointLoad::new();
        let now = Instant::now();
        endpoint.failed(now, &policy);
        endpoint.succeeded();
        assert!(!endpoint.failed(now, &policy), "the count started over");
        assert!(endpoint.available(now));
    }
}
