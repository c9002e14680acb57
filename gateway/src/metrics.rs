//! The gateway's Prometheus metrics, prefixed `nereid_gateway_`.
//!
//! Per model and endpoint: requests forwarded, attempts that failed and why,
//! retries, and the latency the client saw; per port, the client
//! connections closed at one of the gateway's limits; the request bytes
//! buffered now (the memory budget's use). The load estimates
//! the picker reads are set from the registry when scraped, so they cost
//! nothing per request and never outlive an endpoint.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::Protocol;
use crate::router::Router;

/// Why a request, or one attempt of it, failed at the gateway.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// No model of that name, or an ambiguous one.
    UnknownModel,
    /// The model has no ready endpoint.
    NoReadyEndpoints,
    /// The request could not be read (malformed, too large, wrong path).
    BadRequest,
    /// The pod could not be reached: the attempt is retried elsewhere.
    Connect,
    /// The pod is starting or going away and ran nothing of the request
    /// (its not-serving answer, or HTTP/2 refusing the stream): retried.
    NotServing,
    /// The pod was reached and the exchange then broke.
    Upstream,
    /// Refused at one of the gateway's limits (the memory budget, a cap on
    /// streams) rather than for anything wrong with the request.
    Overloaded,
    /// The request's bearer token does not open the model's namespace
    /// (`--namespace-token`).
    Unauthorized,
    /// The model is waking from zero replicas and the request could not
    /// wait for it: over the held bounds, or past its activation timeout.
    Waking,
}

impl Failure {
    fn label(self) -> &'static str {
        match self {
            Failure::UnknownModel => "unknown_model",
            Failure::NoReadyEndpoints => "no_ready_endpoints",
            Failure::BadRequest => "bad_request",
            Failure::Connect => "connect",
            Failure::NotServing => "not_serving",
            Failure::Upstream => "upstream",
            Failure::Overloaded => "overloaded",
            Failure::Unauthorized => "unauthorized",
            Failure::Waking => "waking",
        }
    }
}

/// Which limit made the gateway close a client connection
/// ([`crate::limits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Closed {
    /// `--max-connections`: closed as soon as accepted.
    MaxConnections,
    /// `--handshake-timeout-secs`.
    HandshakeTimeout,
    /// `--header-read-timeout-secs`.
    HeaderReadTimeout,
    /// `--idle-timeout-secs`.
    IdleTimeout,
}

impl Closed {
    fn label(self) -> &'static str {
        match self {
            Closed::MaxConnections => "max_connections",
            Closed::HandshakeTimeout => "handshake_timeout",
            Closed::HeaderReadTimeout => "header_read_timeout",
            Closed::IdleTimeout => "idle_timeout",
        }
    }
}

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    failures: IntCounterVec,
    retries: IntCounterVec,
    connections_closed: IntCounterVec,
    buffered_bytes: IntGauge,
    duration: HistogramVec,
    outstanding: IntGaugeVec,
    queue_depth: IntGaugeVec,
    held: IntGaugeVec,
    activations: IntCounterVec,
    cold_start: HistogramVec,
}

impl Metrics {
    pub fn new() -> Self {
        let valid = "metric options are valid";
        let requests = IntCounterVec::new(
            Opts::new(
                "nereid_gateway_requests_total",
                "Requests forwarded, by model, endpoint and protocol.",
            ),
            &["model", "endpoint", "protocol"],
        )
        .expect(valid);
        let failures = IntCounterVec::new(
            Opts::new(
                "nereid_gateway_failures_total",
                "Requests or attempts that failed at the gateway, by model and reason.",
            ),
            &["model", "reason"],
        )
        .expect(valid);
        let retries = IntCounterVec::new(
            Opts::new(
                "nereid_gateway_retries_total",
                "Attempts made again on another endpoint after a pod could not be reached.",
            ),
            &["model"],
        )
        .expect(valid);
        let connections_closed = IntCounterVec::new(
            Opts::new(
                "nereid_gateway_connections_closed_total",
                "Client connections the gateway closed at one of its limits, by port and limit.",
            ),
            &["port", "limit"],
        )
        .expect(valid);
        let buffered_bytes = IntGauge::new(
            "nereid_gateway_buffered_request_bytes",
            "Request body bytes the gateway holds now, all requests together (at most --max-in-flight-bytes).",
        )
        .expect(valid);
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "nereid_gateway_request_duration_seconds",
                "Time from a request's arrival to the end of its answer, through the gateway.",
            )
            .buckets(vec![
                0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
            ]),
            &["model", "protocol"],
        )
        .expect(valid);
        let outstanding = IntGaugeVec::new(
            Opts::new(
                "nereid_gateway_endpoint_outstanding_requests",
                "Requests this gateway has in flight to an endpoint.",
            ),
            &["model", "endpoint"],
        )
        .expect(valid);
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "nereid_gateway_endpoint_queue_depth",
                "The queue depth the endpoint reported with its last answer.",
            ),
            &["model", "endpoint"],
        )
        .expect(valid);
        let held = IntGaugeVec::new(
            Opts::new(
                "nereid_gateway_held_requests",
                "Requests held for a model waking from zero replicas, by model.",
            ),
            &["model"],
        )
        .expect(valid);
        let activations = IntCounterVec::new(
            Opts::new(
                "nereid_gateway_activations_total",
                "Wake-ups of models scaled to zero: times the gateway set a model's replicas from 0 to 1.",
            ),
            &["model"],
        )
        .expect(valid);
        let cold_start = HistogramVec::new(
            HistogramOpts::new(
                "nereid_gateway_cold_start_seconds",
                "Time from the arrival of a request held for a model waking from zero to its answer's head.",
            )
            .buckets(vec![
                0.5, 1.0, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0, 120.0, 300.0, 600.0,
            ]),
            &["model", "protocol"],
        )
        .expect(valid);
        let registry = Registry::new();
        for collector in [
            Box::new(held.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(activations.clone()),
            Box::new(cold_start.clone()),
            Box::new(requests.clone()),
            Box::new(failures.clone()),
            Box::new(retries.clone()),
            Box::new(connections_closed.clone()),
            Box::new(buffered_bytes.clone()),
            Box::new(duration.clone()),
            Box::new(outstanding.clone()),
            Box::new(queue_depth.clone()),
        ] {
            registry.register(collector).expect("metric names are unique");
        }
        Metrics {
            registry,
            requests,
            failures,
            retries,
            connections_closed,
            buffered_bytes,
            duration,
            outstanding,
            queue_depth,
            held,
            activations,
            cold_start,
        }
    }

    /// The gauge of requests held for `model` while it wakes.
    pub fn held(&self, model: &str) -> prometheus::IntGauge {
        self.held.with_label_values(&[model])
    }

    /// The gateway set `model`'s replicas from 0 to 1.
    pub fn activated(&self, model: &str) {
        self.activations.with_label_values(&[model]).inc();
    }

    /// A request held while `model` woke got its answer's head after `seconds`.
    pub fn cold_start(&self, model: &str, protocol: Protocol, seconds: f64) {
        self.cold_start
            .with_label_values(&[model, protocol.label()])
            .observe(seconds);
    }

    pub fn forwarded(&self, model: &str, endpoint: &str, protocol: Protocol) {
        self.requests
            .with_label_values(&[model, endpoint, protocol.label()])
            .inc();
    }

    pub fn failed(&self, model: &str, failure: Failure) {
        self.failures.with_label_values(&[model, failure.label()]).inc();
    }

    pub fn retried(&self, model: &str) {
        self.retries.with_label_values(&[model]).inc();
    }

    /// A client connection on `port` closed at a limit.
    pub fn connection_closed(&self, port: &str, why: Closed) {
        self.connections_closed.with_label_values(&[port, why.label()]).inc();
    }

    /// The histogram a request's latency goes to once its answer ends.
    pub fn duration(&self, model: &str, protocol: Protocol) -> prometheus::Histogram {
        self.duration.with_label_values(&[model, protocol.label()])
    }

    /// The text exposition, with the load estimates and the request bytes
    /// buffered (`buffered_bytes`) read now.
    pub fn render(&self, router: &Router, buffered_bytes: usize) -> String {
        self.buffered_bytes
            .set(i64::try_from(buffered_bytes).unwrap_or(i64::MAX));
        self.outstanding.reset();
        self.queue_depth.reset();
        router.read(|registry| {
            for (model, entry) in registry.models() {
                let model = model.to_string();
                for endpoint in entry.all_endpoints() {
                    let address = endpoint.address.to_string();
                    let labels = [model.as_str(), address.as_str()];
                    let outstanding = endpoint.load.outstanding();
                    self.outstanding.with_label_values(&labels).set(i64::from(outstanding));
                    self.queue_depth
                        .with_label_values(&labels)
                        .set(i64::from(endpoint.load.queue_depth()));
                }
            }
        });
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut text)
            .expect("the text encoder writes to memory");
        String::from_utf8(text).expect("the exposition is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
