//! The operator's own Prometheus metrics: reconciles, their errors and
//! durations, and whether this replica leads.
//!
//! One registry, created in `main` and passed down; names are prefixed
//! `nereid_operator_` so they never collide with the serving pods' metrics.

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    failures: IntCounterVec,
    duration: HistogramVec,
    leader: IntGauge,
}

impl Metrics {
    pub fn new() -> Self {
        let reconciles = IntCounterVec::new(
            Opts::new(
                "nereid_operator_reconcile_total",
                "Reconciles started, by resource kind.",
            ),
            &["kind"],
        )
        .expect("metric options are valid");
        let failures = IntCounterVec::new(
            Opts::new(
                "nereid_operator_reconcile_errors_total",
                "Reconciles that failed, by kind and error.",
            ),
            &["kind", "error"],
        )
        .expect("metric options are valid");
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "nereid_operator_reconcile_duration_seconds",
                "Time spent in one reconcile.",
            )
            .buckets(vec![0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0]),
            &["kind"],
        )
        .expect("metric options are valid");
        let leader = IntGauge::new("nereid_operator_leader", "1 while this replica holds the leader lease.")
            .expect("metric options are valid");
        let registry = Registry::new();
        for collector in [
            Box::new(reconciles.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(failures.clone()),
            Box::new(duration.clone()),
            Box::new(leader.clone()),
        ] {
            registry.register(collector).expect("each metric is registered once");
        }
        Metrics {
            registry,
            reconciles,
            failures,
            duration,
            leader,
        }
    }

    pub fn reconcile_started(&self, kind: &str) {
        self.reconciles.with_label_values(&[kind]).inc();
    }

    pub fn reconcile_failed(&self, kind: &str, error_kind: &str) {
        self.failures.with_label_values(&[kind, error_kind]).inc();
    }

    pub fn reconcile_duration(&self, kind: &str, seconds: f64) {
        self.duration.with_label_values(&[kind]).observe(seconds);
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buffer)
            .expect("encoding into memory cannot fail");
        String::from_utf8(buffer).expect("the text format is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_what_was_counted() {
        let metrics = Metrics::new();
        metrics.reconcile_started("InferenceModel");
        metrics.reconcile_failed("InferenceModel", "kube");
        metrics.reconcile_duration("InferenceModel", 0.02);
        metrics.set_leader(true);
        let text = metrics.render();
        assert!(
            text.contains("nereid_operator_reconcile_total{kind=\"InferenceModel\"} 1"),
            "{text}"
        );
        assert!(text.contains("nereid_operator_reconcile_errors_total{error=\"kube\",kind=\"InferenceModel\"} 1"));
        assert!(text.contains("nereid_operator_leader 1"));
        assert!(text.contains("nereid_operator_reconcile_duration_seconds_count{kind=\"InferenceModel\"} 1"));
    }
}
