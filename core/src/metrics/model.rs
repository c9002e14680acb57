//! One model version's metric handles, resolved once when it loads.
//!
//! The statistics extension records through these same calls
//! (`statistics.rs`), so `/metrics` and `/v2/models/stats` count the same
//! events. When the version goes away its series are removed, so an
//! unloaded model stops being reported (unless a reload of the same version
//! still uses them).

use std::sync::Arc;
use std::time::Duration;

use prometheus::{Histogram, IntCounter, IntGauge};

use super::summary::SummaryHandle;
use super::{Metrics, Phase};
use crate::error::{Error, ErrorKind};
use crate::statistics::ComputeTiming;

/// Why a request failed, as Triton's `reason` label says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// Refused by the scheduler: queue full, queue timeout, unloading.
    Rejected,
    /// The client went away before the answer.
    Canceled,
    /// The model failed while executing.
    Backend,
    /// Anything else (a request the model cannot take).
    Other,
}

impl FailureReason {
    pub const ALL: [FailureReason; 4] = [
        FailureReason::Rejected,
        FailureReason::Canceled,
        FailureReason::Backend,
        FailureReason::Other,
    ];

    pub fn label(self) -> &'static str {
        match self {
            FailureReason::Rejected => "REJECTED",
            FailureReason::Canceled => "CANCELED",
            FailureReason::Backend => "BACKEND",
            FailureReason::Other => "OTHER",
        }
    }

    /// The reason of a request's error.
    pub fn of(error: &Error) -> Self {
        match error.kind() {
            ErrorKind::Unavailable | ErrorKind::NotServing | ErrorKind::ResourceExhausted => FailureReason::Rejected,
            ErrorKind::Internal => FailureReason::Backend,
            ErrorKind::InvalidArgument
            | ErrorKind::NotFound
            | ErrorKind::Unsupported
            | ErrorKind::AlreadyExists
            | ErrorKind::PermissionDenied => FailureReason::Other,
        }
    }
}

struct PhaseHandles {
    phase: Phase,
    counter: Option<IntCounter>,
    summary: Option<SummaryHandle>,
    histogram: Option<Histogram>,
}

impl PhaseHandles {
    /// `value` observed `times` times.
    fn observe(&self, d: Duration, times: u64) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        if let Some(c) = &self.counter {
            c.inc_by(us.saturating_mul(times));
        }
        if let Some(s) = &self.summary {
            s.observe_many(us as f64, times);
        }
        if let Some(h) = &self.histogram {
            for _ in 0..times {
                h.observe(us as f64);
            }
        }
    }
}

struct Handles {
    metrics: Arc<Metrics>,
    labels: [String; 2],
    success: IntCounter,
    failure: [IntCounter; 4],
    inference_count: IntCounter,
    exec_count: IntCounter,
    pending: IntGauge,
    executing: IntGauge,
    phases: Vec<PhaseHandles>,
}

/// The handles of one model version; a no-op when metrics are off.
pub struct ModelMetrics(Option<Handles>);

/// Holds a gauge up by `n` until dropped.
#[derive(Debug)]
pub struct GaugeGuard {
    gauge: Option<IntGauge>,
    n: i64,
}

impl Drop for GaugeGuard {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.sub(self.n);
        }
    }
}

impl ModelMetrics {
    pub(super) fn new(metrics: &Arc<Metrics>, name: &str, version: i64) -> Self {
        if !metrics.enabled() {
            return ModelMetrics(None);
        }
        let version = version.to_string();
        *metrics
            .live
            .lock()
            .entry((name.to_string(), version.clone()))
            .or_insert(0) += 1;
        let labels = [name, version.as_str()];
        let failure = FailureReason::ALL.map(|r| metrics.failure.with_label_values(&[name, &version, r.label()]));
        let phases = metrics
            .phases
            .iter()
            .map(|(phase, families)| PhaseHandles {
                phase: *phase,
                counter: families.counter.as_ref().map(|c| c.with_label_values(&labels)),
                summary: families.summary.as_ref().map(|s| s.with_label_values(&labels)),
                histogram: families.histogram.as_ref().map(|h| h.with_label_values(&labels)),
            })
            .collect();
        ModelMetrics(Some(Handles {
            success: metrics.success.with_label_values(&labels),
            failure,
            inference_count: metrics.inference_count.with_label_values(&labels),
            exec_count: metrics.exec_count.with_label_values(&labels),
            pending: metrics.pending.with_label_values(&labels),
            executing: metrics.executing.with_label_values(&labels),
            phases,
            labels: [name.to_string(), version],
            metrics: Arc::clone(metrics),
        }))
    }

    /// Metrics that record nothing.
    pub fn none() -> Self {
        ModelMetrics(None)
    }

    fn phase(&self, phase: Phase) -> Option<&PhaseHandles> {
        self.0.as_ref()?.phases.iter().find(|p| p.phase == phase)
    }

    /// A request's end: success, or failure with its reason.
    pub fn request_done(&self, failure: Option<FailureReason>, total: Duration) {
        let Some(h) = &self.0 else { return };
        match failure {
            None => {
                h.success.inc();
                if let Some(p) = self.phase(Phase::Request) {
                    p.observe(total, 1);
                }
            }
            Some(reason) => h.failure[reason as usize].inc(),
        }
    }

    /// A request's time in the queue, when its execution starts.
    pub fn queued(&self, waited: Duration) {
        if let Some(p) = self.phase(Phase::Queue) {
            p.observe(waited, 1);
        }
    }

    /// One execution of `batch_size` inferences made of `requests` requests;
    /// each request spent the whole execution.
    pub fn executed(&self, batch_size: u64, requests: u64, timing: ComputeTiming) {
        let Some(h) = &self.0 else { return };
        h.inference_count.inc_by(batch_size);
        h.exec_count.inc();
        for (phase, d) in [
            (Phase::ComputeInput, timing.input),
            (Phase::ComputeInfer, timing.infer),
            (Phase::ComputeOutput, timing.output),
        ] {
            if let Some(p) = self.phase(phase) {
                p.observe(d, requests);
            }
        }
    }

    /// Counts one request waiting in the queue until the guard drops.
    pub fn pending(&self) -> GaugeGuard {
        self.hold(|h| &h.pending, 1)
    }

    /// The pending gauge's value.
    pub fn queue_depth(&self) -> Option<u32> {
        self.0.as_ref().map(|h| u32::try_from(h.pending.get()).unwrap_or(0))
    }

    /// Counts `n` requests in an execution until the guard drops.
    pub fn executing(&self, n: usize) -> GaugeGuard {
        self.hold(|h| &h.executing, i64::try_from(n).unwrap_or(i64::MAX))
    }

    fn hold(&self, gauge: impl Fn(&Handles) -> &IntGauge, n: i64) -> GaugeGuard {
        let gauge = self.0.as_ref().map(|h| gauge(h).clone());
        if let Some(g) = &gauge {
            g.add(n);
        }
        GaugeGuard { gauge, n }
    }

    pub fn load_duration(&self, d: Duration) {
        if let Some(h) = &self.0 {
            let labels = [h.labels[0].as_str(), h.labels[1].as_str()];
            h.metrics.load_duration.with_label_values(&labels).set(d.as_secs_f64());
        }
    }
}

impl Drop for ModelMetrics {
    fn drop(&mut self) {
        let Some(h) = &self.0 else { return };
        let key = (h.labels[0].clone(), h.labels[1].clone());
        let mut live = h.metrics.live.lock();
        let Some(count) = live.get_mut(&key) else { return };
        *count -= 1;
        if *count > 0 {
            return;
        }
        live.remove(&key);
        let labels = [h.labels[0].as_str(), h.labels[1].as_str()];
        let m = &h.metrics;
        let _ = m.success.remove_label_values(&labels);
        let _ = m.inference_count.remove_label_values(&labels);
        let _ = m.exec_count.remove_label_values(&labels);
        let _ = m.pending.remove_label_values(&labels);
        let _ = m.executing.remove_label_values(&labels);
        let _ = m.load_duration.remove_label_values(&labels);
        for reason in FailureReason::ALL {
            let _ = m.failure.remove_label_values(&[labels[0], labels[1], reason.label()]);
        }
        for (_, families) in &m.phases {
            if let Some(c) = &families.counter {
                let _ = c.remove_label_values(&labels);
            }
            if let Some(s) = &families.summary {
                s.remove_label_values(&labels);
            }
            if let Some(hist) = &families.histogram {
                let _ = hist.remove_label_values(&labels);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::MetricsConfig;

    fn value(metrics: &Metrics, line_start: &str) -> Option<f64> {
        metrics
            .encode()
            .lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    #[test]
    fn records_counts_reasons_and_gauges() {
        let metrics = Metrics::new(&MetricsConfig::default(), true);
        let m = metrics.model("m", 2);
        m.request_done(None, Duration::from_micros(10));
        m.request_done(Some(FailureReason::Rejected), Duration::from_micros(10));
        m.request_done(Some(FailureReason::Canceled), Duration::from_micros(10));
        m.executed(8, 3, ComputeTiming::default());
        let pending = m.pending();
        let executing = m.executing(3);
        let labels = "{model=\"m\",version=\"2\"}";
        assert_eq!(
            value(&metrics, &format!("nv_inference_request_success{labels}")),
            Some(1.0)
        );
        assert_eq!(
            value(
                &metrics,
                "nv_inference_request_failure{model=\"m\",reason=\"REJECTED\",version=\"2\"}"
            ),
            Some(1.0)
        );
        assert_eq!(value(&metrics, &format!("nv_inference_count{labels}")), Some(8.0));
        assert_eq!(
            value(&metrics, &format!("nv_inference_pending_request_count{labels}")),
            Some(1.0)
        );
        assert_eq!(
            value(&metrics, &format!("nereid_inference_executing_request_count{labels}")),
            Some(3.0)
        );
        drop((pending, executing));
        assert_eq!(
            value(&metrics, &format!("nv_inference_pending_request_count{labels}")),
            Some(0.0)
        );
        assert_eq!(
            value(&metrics, &format!("nereid_inference_executing_request_count{labels}")),
            Some(0.0)
        );
    }

    #[test]
    fn a_reload_of_the_same_version_keeps_its_series() {
        let metrics = Metrics::new(&MetricsConfig::default(), true);
        let old = metrics.model("m", 1);
        let new = metrics.model("m", 1);
        drop(old);
        new.request_done(None, Duration::ZERO);
        assert!(
            metrics
                .encode()
                .contains("nv_inference_request_success{model=\"m\",version=\"1\"} 1")
        );
    }

    #[test]
    fn errors_map_to_tritons_reasons() {
        assert_eq!(
            FailureReason::of(&Error::unavailable("queue full")),
            FailureReason::Rejected
        );
        assert_eq!(
            FailureReason::of(&Error::internal("onnx failed")),
            FailureReason::Backend
        );
        assert_eq!(FailureReason::of(&Error::invalid("bad shape")), FailureReason::Other);
    }
}
