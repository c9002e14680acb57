//! Triton's statistics extension: per model version counters and durations.
//!
//! The same calls record the model's Prometheus metrics ([`ModelMetrics`]),
//! so `/metrics` and the statistics API count the same events.
//!
//! Updated once per execution and once per request, under a mutex that is
//! held for a few additions (saturating: no count or duration can overflow,
//! so recording never panics on an instance thread); read by `/v2/models/.../stats` and gRPC
//! `ModelStatistics`. The meaning of each number is Triton's: `inference_count`
//! counts inferences (a request of batch 4 is 4), `execution_count` counts
//! model executions, so their ratio shows how well batching works.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

use crate::metrics::model::GaugeGuard;
use crate::metrics::{FailureReason, ModelMetrics};

/// A count and the total time it took, in nanoseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatDuration {
    pub count: u64,
    pub ns: u64,
}

impl StatDuration {
    fn add(&mut self, count: u64, d: Duration) {
        self.add_ns(count, nanos(d));
    }

    fn add_ns(&mut self, count: u64, ns: u64) {
        self.count = self.count.saturating_add(count);
        self.ns = self.ns.saturating_add(ns);
    }
}

/// Time spent in the three phases of one execution.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ComputeTiming {
    /// Copying inputs into the batch / backend buffers.
    pub input: Duration,
    pub infer: Duration,
    /// Copying outputs out of the backend.
    pub output: Duration,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InferStats {
    pub success: StatDuration,
    pub fail: StatDuration,
    pub queue: StatDuration,
    pub compute_input: StatDuration,
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    pub compute_input: StatDuration,
    pub compute_infer: StatDuration,
    pub compute_output: StatDuration,
}

/// A consistent copy of one version's statistics.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Milliseconds since the Unix epoch of the last inference; 0 if none.
    pub last_inference: u64,
    pub inference_count: u64,
    pub execution_count: u64,
    pub inference_stats: InferStats,
    /// By batch size.
    pub batch_stats: BTreeMap<u64, BatchStats>,
}

pub struct ModelStatistics {
    inner: Mutex<StatsSnapshot>,
    metrics: ModelMetrics,
}

impl Default for ModelStatistics {
    /// Statistics without metrics.
    fn default() -> Self {
        ModelStatistics::new(ModelMetrics::none())
    }
}

impl ModelStatistics {
    pub fn new(metrics: ModelMetrics) -> Self {
        ModelStatistics {
            inner: Mutex::new(StatsSnapshot::default()),
            metrics,
        }
    }

    pub fn metrics(&self) -> &ModelMetrics {
        &self.metrics
    }

    /// Requests waiting in the queue now (`None` when metrics are off: the
    /// gauge is the count).
    pub fn queue_depth(&self) -> Option<u32> {
        self.metrics.queue_depth()
    }

    /// Counts a request as waiting in the queue until the guard drops.
    pub fn pending(&self) -> GaugeGuard {
        self.metrics.pending()
    }

    /// Counts `n` requests as executing until the guard drops.
    pub fn executing(&self, n: usize) -> GaugeGuard {
        self.metrics.executing(n)
    }

    fn with<R>(&self, f: impl FnOnce(&mut StatsSnapshot) -> R) -> R {
        f(&mut self.inner.lock())
    }

    /// One model execution of `batch_size` inferences made of `requests` requests.
    pub fn record_execution(&self, batch_size: u64, requests: u64, timing: ComputeTiming) {
        self.metrics.executed(batch_size, requests, timing);
        self.with(|s| {
            s.inference_count = s.inference_count.saturating_add(batch_size);
            s.execution_count = s.execution_count.saturating_add(1);
            s.last_inference = now_ms();
            // Every request of the batch spent the whole execution.
            let stats = &mut s.inference_stats;
            stats
                .compute_input
                .add_ns(requests, nanos(timing.input).saturating_mul(requests));
            stats
                .compute_infer
                .add_ns(requests, nanos(timing.infer).saturating_mul(requests));
            stats
                .compute_output
                .add_ns(requests, nanos(timing.output).saturating_mul(requests));
            let batch = s.batch_stats.entry(batch_size).or_default();
            batch.compute_input.add(1, timing.input);
            batch.compute_infer.add(1, timing.infer);
            batch.compute_output.add(1, timing.output);
        });
    }

    /// A request's time in the queue, recorded when its batch starts.
    pub fn record_queue(&self, waited: Duration) {
        self.metrics.queued(waited);
        self.with(|s| s.inference_stats.queue.add(1, waited));
    }

    /// A request's end, from arrival to response: success, or failure and why.
    pub fn record_request(&self, failure: Option<FailureReason>, total: Duration) {
        self.metrics.request_done(failure, total);
        self.with(|s| match failure {
            None => s.inference_stats.success.add(1, total),
            Some(_) => s.inference_stats.fail.add(1, total),
        });
    }

    pub fn snapshot(&self) -> StatsSnapshot {
        self.with(|s| s.clone())
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn executions_and_requests_add_up() {
        let stats = ModelStatistics::default();
        let timing = ComputeTiming {
            input: Duration::from_micros(1),
            infer: Duration::from_micros(10),
            output: Duration::from_micros(2),
        };
        stats.record_execution(4, 3, timing);
        stats.record_execution(1, 1, timing);
        stats.record_queue(Duration::from_micros(5));
        stats.record_request(None, Duration::from_micros(20));
        stats.record_request(Some(FailureReason::Other), Duration::from_micros(7));
        let s = stats.snapshot();
        assert_eq!(s.inference_count, 5);
        assert_eq!(s.execution_count, 2);
        assert!(s.last_inference > 0);
        assert_eq!(s.inference_stats.compute_infer, StatDuration { count: 4, ns: 40_000 });
        assert_eq!(s.inference_stats.success, StatDuration { count: 1, ns: 20_000 });
        assert_eq!(s.inference_stats.fail, StatDuration { count: 1, ns: 7_000 });
        assert_eq!(s.batch_stats[&4].compute_infer, StatDuration { count: 1, ns: 10_000 });
        assert_eq!(s.batch_stats[&1].compute_input.count, 1);
    }

    #[test]
    fn huge_values_saturate_instead_of_panicking() {
        let stats = ModelStatistics::default();
        let huge = ComputeTiming {
            input: Duration::MAX,
            infer: Duration::from_secs(u64::MAX / 2),
            output: Duration::ZERO,
        };
        stats.record_execution(u64::MAX, u64::MAX, huge);
        stats.record_execution(u64::MAX, u64::MAX, huge);
        stats.record_request(None, Duration::MAX);
        stats.record_request(None, Duration::MAX);
        let s = stats.snapshot();
        assert_eq!(s.inference_count, u64::MAX);
        assert_eq!(
            s.inference_stats.compute_input,
            StatDuration {
                count: u64::MAX,
                ns: u64::MAX
            }
        );
        assert_eq!(s.inference_stats.success.ns, u64::MAX);
    }
}
