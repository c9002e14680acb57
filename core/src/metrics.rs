//! Prometheus metrics with Triton's names, so dashboards, alerts and
//! prometheus-adapter rules written for Triton work unchanged.
//!
//! One [`Metrics`] is created in `main` and handed down; nothing names a
//! metric as a loose string anywhere else. Per model version, the handles
//! are resolved once at load ([`ModelMetrics`]) and recorded by the same
//! calls that record the statistics extension (`statistics.rs`), so the two
//! can never disagree.
//!
//! ```text
//! model       one model version's handles; failure reasons; queue and execution gauges
//! summary     sliding-window quantiles (the prometheus crate has no summary)
//! system      CPU utilization and memory from /proc, per interval
//! ```
//!
//! Families (labels `model`, `version`):
//!
//! - counts: `nv_inference_request_success`, `nv_inference_request_failure`
//!   (also `reason`: REJECTED, CANCELED, BACKEND, OTHER), `nv_inference_count`,
//!   `nv_inference_exec_count`;
//! - latencies per phase (request, queue, compute_input, compute_infer,
//!   compute_output), as chosen by `--metrics-config`: counters
//!   `nv_inference_<phase>_duration_us` (default), summaries
//!   `nv_inference_<phase>_summary_us`, histograms
//!   `nv_inference_<phase>_histogram_us`;
//! - gauges for autoscalers and routers: `nv_inference_pending_request_count`
//!   (waiting in the queue, Triton's) and
//!   `nereid_inference_executing_request_count` (in an execution now);
//! - `nv_model_load_duration_secs`;
//! - the server's own `nereid_requests_in_flight{protocol}` (HTTP, gRPC);
//! - `nv_cpu_utilization`, `nv_cpu_memory_total_bytes`,
//!   `nv_cpu_memory_used_bytes` (per interval).

pub mod gpu;
pub mod model;
pub mod summary;
pub mod system;

use std::time::Duration;

use nereid_proto::contract::metrics as family;
use prometheus::core::Collector;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

pub use self::model::{FailureReason, ModelMetrics};
use self::summary::SummaryVec;

/// Default histogram buckets, in microseconds: 100 us to 60 s, about three
/// per decade, covering a fast CPU model's compute and a long generation.
pub const HISTOGRAM_BUCKETS_US: [f64; 17] = [
    100.0, 250.0, 500.0, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5, 2.5e5, 5e5, 1e6, 2.5e6, 5e6, 1e7, 6e7,
];

/// Triton's default summary quantiles.
pub const SUMMARY_QUANTILES: [f64; 5] = [0.5, 0.9, 0.95, 0.99, 0.999];

/// How far back summaries look (prometheus-cpp's default, which Triton uses).
pub const SUMMARY_WINDOW: Duration = Duration::from_secs(60);

/// Triton's `--metrics-config` settings.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsConfig {
    pub counter_latencies: bool,
    pub summary_latencies: bool,
    pub summary_quantiles: Vec<f64>,
    pub histogram_latencies: bool,
    pub histogram_buckets: Vec<f64>,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        MetricsConfig {
            counter_latencies: true,
            summary_latencies: false,
            summary_quantiles: SUMMARY_QUANTILES.to_vec(),
            histogram_latencies: false,
            histogram_buckets: HISTOGRAM_BUCKETS_US.to_vec(),
        }
    }
}

impl MetricsConfig {
    /// Applies `key=value` settings in order (`--metrics-config`, repeatable).
    pub fn parse(settings: &[String]) -> Result<Self, String> {
        let mut config = MetricsConfig::default();
        for setting in settings {
            let (key, value) = setting
                .split_once('=')
                .ok_or_else(|| format!("--metrics-config expects <key>=<value>, got '{setting}'"))?;
            let flag = || match value {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err(format!("--metrics-config {key} must be true or false, got '{value}'")),
            };
            match key {
                "counter_latencies" => config.counter_latencies = flag()?,
                "summary_latencies" => config.summary_latencies = flag()?,
                "histogram_latencies" => config.histogram_latencies = flag()?,
                "summary_quantiles" => config.summary_quantiles = parse_quantiles(value)?,
                "histogram_buckets" => config.histogram_buckets = parse_buckets(value)?,
                _ => {
                    return Err(format!(
                        "unknown --metrics-config key '{key}' (known: counter_latencies, summary_latencies, summary_quantiles, histogram_latencies, histogram_buckets)"
                    ));
                }
            }
        }
        Ok(config)
    }
}

/// `0.5:0.05,0.9:0.01`: quantile and (ignored, the quantiles are exact) error.
fn parse_quantiles(value: &str) -> Result<Vec<f64>, String> {
    value
        .split(',')
        .map(|pair| {
            let quantile = pair.split(':').next().unwrap_or_default();
            quantile
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|q| (0.0..=1.0).contains(q))
                .ok_or_else(|| format!("summary_quantiles: '{pair}' is not <quantile 0..1>:<error>"))
        })
        .collect()
}

fn parse_buckets(value: &str) -> Result<Vec<f64>, String> {
    let buckets: Vec<f64> = value
        .split(',')
        .map(|b| {
            b.trim()
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .ok_or_else(|| format!("histogram_buckets: '{b}' is not a finite number"))
        })
        .collect::<Result<_, _>>()?;
    if buckets.windows(2).any(|w| w[0] >= w[1]) {
        return Err("histogram_buckets must be increasing microsecond bounds".into());
    }
    Ok(buckets)
}

/// A latency phase, in Triton's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    Request,
    Queue,
    ComputeInput,
    ComputeInfer,
    ComputeOutput,
}

impl Phase {
    pub const ALL: [Phase; 5] = [
        Phase::Request,
        Phase::Queue,
        Phase::ComputeInput,
        Phase::ComputeInfer,
        Phase::ComputeOutput,
    ];

    /// Its families' names, from the contract other processes read them by.
    fn families(self) -> family::Latency {
        match self {
            Phase::Request => family::REQUEST_LATENCY,
            Phase::Queue => family::QUEUE_LATENCY,
            Phase::ComputeInput => family::COMPUTE_INPUT_LATENCY,
            Phase::ComputeInfer => family::COMPUTE_INFER_LATENCY,
            Phase::ComputeOutput => family::COMPUTE_OUTPUT_LATENCY,
        }
    }

    fn what(self) -> &'static str {
        match self {
            Phase::Request => "end-to-end inference request handling",
            Phase::Queue => "waiting in the scheduling queue",
            Phase::ComputeInput => "processing inference inputs",
            Phase::ComputeInfer => "executing the inference model",
            Phase::ComputeOutput => "processing inference outputs",
        }
    }
}

/// The latency families of one phase, each present when configured.
#[derive(Clone)]
pub(crate) struct PhaseFamilies {
    counter: Option<IntCounterVec>,
    summary: Option<SummaryVec>,
    histogram: Option<HistogramVec>,
}

/// Every family of the server, registered once.
pub struct Metrics {
    registry: Registry,
    enabled: bool,
    pub(crate) success: IntCounterVec,
    pub(crate) failure: IntCounterVec,
    pub(crate) inference_count: IntCounterVec,
    pub(crate) exec_count: IntCounterVec,
    pub(crate) pending: IntGaugeVec,
    pub(crate) executing: IntGaugeVec,
    pub(crate) load_duration: GaugeVec,
    pub(crate) phases: Vec<(Phase, PhaseFamilies)>,
    in_flight: IntGaugeVec,
    /// Label sets in use, so that a reload sharing a version's labels does
    /// not lose them when the old copy goes away.
    pub(crate) live: parking_lot::Mutex<std::collections::HashMap<(String, String), usize>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

const MODEL_LABELS: [&str; 2] = [family::MODEL_LABEL, family::VERSION_LABEL];

fn counter(name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    IntCounterVec::new(Opts::new(name, help), labels).expect("metric options are valid")
}

fn gauge(name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    IntGaugeVec::new(Opts::new(name, help), labels).expect("metric options are valid")
}

impl Metrics {
    /// Every family, registered; `enabled: false` (`--allow-metrics=false`)
    /// records nothing.
    pub fn new(config: &MetricsConfig, enabled: bool) -> std::sync::Arc<Self> {
        let registry = Registry::new();
        let register = |c: Box<dyn Collector>| registry.register(c).expect("each metric is registered once");
        let success = counter(
            family::REQUEST_SUCCESS,
            "Number of successful inference requests, all batch sizes",
            &MODEL_LABELS,
        );
        let failure = counter(
            family::REQUEST_FAILURE,
            "Number of failed inference requests, all batch sizes",
            &[family::MODEL_LABEL, family::VERSION_LABEL, "reason"],
        );
        let inference_count = counter(
            family::INFERENCE_COUNT,
            "Number of inferences performed (does not include cached requests)",
            &MODEL_LABELS,
        );
        let exec_count = counter(
            family::EXEC_COUNT,
            "Number of model executions performed (does not include cached requests)",
            &MODEL_LABELS,
        );
        let pending = gauge(
            family::PENDING_REQUEST_COUNT,
            "Instantaneous number of pending requests awaiting execution per-model.",
            &MODEL_LABELS,
        );
        let executing = gauge(
            family::EXECUTING_REQUEST_COUNT,
            "Instantaneous number of requests in an execution per-model.",
            &MODEL_LABELS,
        );
        let load_duration = GaugeVec::new(
            Opts::new(family::MODEL_LOAD_DURATION, "Model load time in seconds"),
            &MODEL_LABELS,
        )
        .expect("metric options are valid");
        let in_flight = gauge(
            family::REQUESTS_IN_FLIGHT,
            "Requests being handled by a front end, from routing to the last byte of the response.",
            &["protocol"],
        );
        for family in [&success, &failure, &inference_count, &exec_count] {
            register(Box::new(family.clone()));
        }
        for family in [&pending, &executing, &in_flight] {
            register(Box::new(family.clone()));
        }
        register(Box::new(load_duration.clone()));
        let mut phases = Vec::new();
        for phase in Phase::ALL {
            let families = PhaseFamilies {
                counter: config.counter_latencies.then(|| {
                    counter(
                        phase.families().duration,
                        &format!("Cumulative inference {} duration in microseconds", phase.what()),
                        &MODEL_LABELS,
                    )
                }),
                summary: config.summary_latencies.then(|| {
                    SummaryVec::new(
                        phase.families().summary,
                        &format!("Summary of inference {} duration in microseconds", phase.what()),
                        &MODEL_LABELS,
                        config.summary_quantiles.clone(),
                        SUMMARY_WINDOW,
                    )
                }),
                histogram: config.histogram_latencies.then(|| {
                    HistogramVec::new(
                        HistogramOpts::new(
                            phase.families().histogram,
                            format!("Histogram of inference {} duration in microseconds", phase.what()),
                        )
                        .buckets(config.histogram_buckets.clone()),
                        &MODEL_LABELS,
                    )
                    .expect("metric options are valid")
                }),
            };
            if let Some(c) = &families.counter {
                register(Box::new(c.clone()));
            }
            if let Some(s) = &families.summary {
                register(Box::new(s.clone()));
            }
            if let Some(h) = &families.histogram {
                register(Box::new(h.clone()));
            }
            phases.push((phase, families));
        }
        std::sync::Arc::new(Metrics {
            registry,
            enabled,
            success,
            failure,
            inference_count,
            exec_count,
            pending,
            executing,
            load_duration,
            phases,
            in_flight,
            live: Default::default(),
        })
    }

    /// Metrics that record nothing (tests, in-process use).
    pub fn disabled() -> std::sync::Arc<Self> {
        Self::new(&MetricsConfig::default(), false)
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The handles of one model version (see [`ModelMetrics`]).
    pub fn model(self: &std::sync::Arc<Self>, name: &str, version: i64) -> ModelMetrics {
        ModelMetrics::new(self, name, version)
    }

    /// The in-flight gauge of one front end (`http` or `grpc`).
    pub fn in_flight(&self, protocol: &str) -> IntGauge {
        self.in_flight.with_label_values(&[protocol])
    }

    /// Adds a collector (the system metrics) to the registry.
    pub fn register(&self, collector: Box<dyn Collector>) {
        self.registry
            .register(collector)
            .expect("each metric is registered once");
    }

    /// The registry, for families a backend defines at run time (a Python
    /// model's `pb_utils.MetricFamily`): they are exported beside these.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The Prometheus text exposition of every family.
    pub fn encode(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("the text encoder writes into memory");
        String::from_utf8(out).expect("the text exposition is UTF-8")
    }
}

/// Calls `refresh` every `interval` (at least 100 ms) on the async
/// runtime, forever: the loop of the per-interval families (CPU, GPU).
async fn refresh_every(interval: Duration, mut refresh: impl FnMut()) {
    let mut ticks = tokio::time::interval(interval.max(Duration::from_millis(100)));
    loop {
        ticks.tick().await;
        refresh();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_config_takes_tritons_keys() {
        let config = MetricsConfig::parse(&[
            "summary_latencies=true".into(),
            "summary_quantiles=0.5:0.05,0.99:0.001".into(),
            "counter_latencies=false".into(),
            "histogram_latencies=true".into(),
        ])
        .unwrap();
        assert!(config.summary_latencies && config.histogram_latencies && !config.counter_latencies);
        assert_eq!(config.summary_quantiles, vec![0.5, 0.99]);
        for bad in [
            "nope=true",
            "summary_latencies=yes",
            "summary_quantiles=2:0.1",
            "histogram_buckets=5,1",
            "histogram_buckets=1,NaN",
            "histogram_buckets=1,inf",
        ] {
            assert!(MetricsConfig::parse(&[bad.into()]).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_configured_family_is_exposed_with_tritons_names() {
        let config =
            MetricsConfig::parse(&["summary_latencies=true".into(), "histogram_latencies=true".into()]).unwrap();
        let metrics = Metrics::new(&config, true);
        let model = metrics.model("m", 1);
        model.request_done(None, Duration::from_micros(150));
        let text = metrics.encode();
        for name in [
            "nv_inference_request_success{model=\"m\",version=\"1\"} 1",
            "nv_inference_request_duration_us{model=\"m\",version=\"1\"} 150",
            "nv_inference_request_summary_us_count{model=\"m\",version=\"1\"} 1",
            "nv_inference_request_histogram_us_bucket{model=\"m\",version=\"1\",le=\"250\"} 1",
            "# TYPE nv_inference_request_summary_us summary",
        ] {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        drop(model);
        assert!(
            !metrics.encode().contains("model=\"m\""),
            "an unloaded model's series go"
        );
    }
}
