//! The operator's own Prometheus metrics: reconciles, their errors and
//! durations, whether this replica leads, the scrapes of the serving pods,
//! and the autoscaling figures computed from them.
//!
//! One registry, created in `main` and passed down. The operator's own
//! metrics are prefixed `nereid_operator_`; the figures carry the names the
//! external metrics API gives them (`nereid_queue_time_microseconds`, ...),
//! with `namespace` and `model` labels, so a dashboard shows what the HPA sees.

use std::collections::BTreeMap;

use nereid_crds::AutoscalingMetric;
use prometheus::{
    Encoder, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

use crate::autoscaling::figures::{Figures, ModelKey};

pub struct Metrics {
    registry: Registry,
    reconciles: IntCounterVec,
    failures: IntCounterVec,
    duration: HistogramVec,
    leader: IntGauge,
    scrapes: IntCounterVec,
    scrape_round: Histogram,
    pods_scraped: GaugeVec,
    figures: Vec<(AutoscalingMetric, GaugeVec)>,
    scaled_to_zero: IntCounterVec,
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
        let scrapes = IntCounterVec::new(
            Opts::new(
                "nereid_operator_pod_scrapes_total",
                "Scrapes of ready serving pods' /metrics, by namespace, model and result (ok, failed: \
                 timed out, refused or not a server's metrics).",
            ),
            &["namespace", "model", "result"],
        )
        .expect("metric options are valid");
        let scrape_round = Histogram::with_opts(
            HistogramOpts::new(
                "nereid_operator_scrape_round_duration_seconds",
                "Time to list and scrape every serving pod once.",
            )
            .buckets(vec![0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0]),
        )
        .expect("metric options are valid");
        let pods_scraped = GaugeVec::new(
            Opts::new(
                "nereid_operator_pods_scraped",
                "Ready serving pods of a model whose /metrics answered in the latest round.",
            ),
            &["namespace", "model"],
        )
        .expect("metric options are valid");
        let figures: Vec<(AutoscalingMetric, GaugeVec)> = AutoscalingMetric::ALL
            .into_iter()
            .map(|metric| {
                let gauge = GaugeVec::new(
                    Opts::new(metric.external_name(), figure_help(metric)),
                    &["namespace", "model"],
                )
                .expect("metric options are valid");
                (metric, gauge)
            })
            .collect();
        let scaled_to_zero = IntCounterVec::new(
            Opts::new(
                "nereid_operator_scaled_to_zero_total",
                "Models the operator scaled to zero after their scaleToZeroAfter without requests.",
            ),
            &["namespace", "model"],
        )
        .expect("metric options are valid");
        let registry = Registry::new();
        let mut collectors = vec![
            Box::new(scaled_to_zero.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(reconciles.clone()),
            Box::new(failures.clone()),
            Box::new(duration.clone()),
            Box::new(leader.clone()),
            Box::new(scrapes.clone()),
            Box::new(scrape_round.clone()),
            Box::new(pods_scraped.clone()),
        ];
        collectors.extend(
            figures
                .iter()
                .map(|(_, g)| Box::new(g.clone()) as Box<dyn prometheus::core::Collector>),
        );
        for collector in collectors {
            registry.register(collector).expect("each metric is registered once");
        }
        Metrics {
            registry,
            reconciles,
            failures,
            duration,
            leader,
            scrapes,
            scrape_round,
            pods_scraped,
            figures,
            scaled_to_zero,
        }
    }

    pub fn scaled_to_zero(&self, namespace: &str, model: &str) {
        self.scaled_to_zero.with_label_values(&[namespace, model]).inc();
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

    /// Counts one scrape of a ready pod of `namespace`/`model`.
    pub fn pod_scraped(&self, namespace: &str, model: &str, ok: bool) {
        let result = if ok { "ok" } else { "failed" };
        self.scrapes.with_label_values(&[namespace, model, result]).inc();
    }

    pub fn scrape_round(&self, seconds: f64) {
        self.scrape_round.observe(seconds);
    }

    /// Replaces the figures with the latest round's: a model gone from the
    /// cluster leaves no stale series behind.
    pub fn set_model_figures(&self, figures: &BTreeMap<ModelKey, Figures>) {
        self.pods_scraped.reset();
        for (_, gauge) in &self.figures {
            gauge.reset();
        }
        for (key, figures) in figures {
            let labels = [key.namespace.as_str(), key.model.as_str()];
            self.pods_scraped
                .with_label_values(&labels)
                .set(f64::from(figures.scraped_pods));
            for (metric, gauge) in &self.figures {
                if let Some(value) = figures.value(*metric) {
                    gauge.with_label_values(&labels).set(value);
                }
            }
        }
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

fn figure_help(metric: AutoscalingMetric) -> &'static str {
    match metric {
        AutoscalingMetric::QueueTimeMicros => {
            "Average queue time per request over the scrape window, microseconds, per model."
        }
        AutoscalingMetric::PendingRequests => "Requests queued or executing now, summed over the model's pods.",
        AutoscalingMetric::InferenceRate => {
            "Inferences per second over the scrape window, summed over the model's pods."
        }
        AutoscalingMetric::GpuUtilization => "Mean GPU utilisation of the model's pods, percent.",
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
