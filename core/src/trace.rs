//! OpenTelemetry traces of inference requests (exported over OTLP by the
//! binary, which builds the provider: the core does not depend on the
//! exporter's transport).
//!
//! A traced request gets an `InferRequest` span (a child of the client's
//! span when it sent a W3C `traceparent`, over HTTP or gRPC), with child
//! spans for its time in the queue and for compute input, infer and output;
//! each batch execution gets an `execute` span linked to every traced request
//! it served. The spans are built with explicit start and end times from the
//! instants the server measures anyway, so tracing adds no clock reads to the
//! hot path. With tracing off everywhere (the default) a request costs one
//! atomic load; otherwise one short lock and a counter update.
//!
//! ```text
//! settings    Triton's trace settings, global and per model; sampling
//! request     one traced request: its context and span times
//! ```
//!
//! `--trace-config` takes Triton's forms: `level=TIMESTAMPS`, `rate=N`,
//! `count=N`, `mode=opentelemetry`, `opentelemetry,url=<OTLP/gRPC endpoint>`,
//! `opentelemetry,resource=<key>=<value>`,
//! `opentelemetry,bsp_schedule_delay=<ms>`.

pub mod request;
pub mod settings;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{SdkTracerProvider, Tracer};
use parking_lot::Mutex;

pub use self::request::RequestTrace;
use self::settings::{Change, Effective, TraceSettings};
use crate::error::{Error, Result};

/// Where OTLP goes unless `opentelemetry,url=` says otherwise.
pub const DEFAULT_OTLP_ENDPOINT: &str = "http://localhost:4317";

/// `--trace-config`, parsed.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceConfig {
    pub initial: Effective,
    pub endpoint: String,
    pub resource: Vec<(String, String)>,
    pub schedule_delay: Duration,
}

impl Default for TraceConfig {
    fn default() -> Self {
        TraceConfig {
            initial: Effective::default(),
            endpoint: DEFAULT_OTLP_ENDPOINT.to_string(),
            resource: Vec::new(),
            schedule_delay: Duration::from_secs(5),
        }
    }
}

impl TraceConfig {
    pub fn parse(flags: &[String]) -> Result<Self, String> {
        let mut config = TraceConfig::default();
        for flag in flags {
            let (mode, setting) = match flag.split_once(',') {
                Some((mode, rest)) if !mode.contains('=') => (Some(mode), rest),
                _ => (None, flag.as_str()),
            };
            let (key, value) = setting
                .split_once('=')
                .ok_or_else(|| format!("--trace-config expects [<mode>,]<key>=<value>, got '{flag}'"))?;
            let bad = |e: Error| format!("--trace-config {flag}: {}", e.message());
            match (mode, key) {
                (None, "level") => config.initial.level = settings::parse_level_flag(value).map_err(bad)?,
                (None, "rate") => config.initial.rate = settings::parse_rate(value).map_err(bad)?,
                (None, "count") => config.initial.count = settings::parse_count(value).map_err(bad)?,
                (None, "mode") if value == "opentelemetry" => {}
                (None, "mode") => return Err(format!("--trace-config mode={value}: only opentelemetry is supported")),
                (Some("opentelemetry"), "url") => config.endpoint = endpoint(value),
                (Some("opentelemetry"), "resource") => {
                    let (k, v) = value
                        .split_once('=')
                        .ok_or_else(|| format!("--trace-config {flag}: expected resource=<key>=<value>"))?;
                    config.resource.push((k.to_string(), v.to_string()));
                }
                (Some("opentelemetry"), "bsp_schedule_delay") => {
                    let ms: u64 = value
                        .parse()
                        .map_err(|_| format!("--trace-config {flag}: expected milliseconds"))?;
                    config.schedule_delay = Duration::from_millis(ms);
                }
                (Some("triton"), _) => {
                    return Err(format!("--trace-config {flag}: Triton's file mode is not supported"));
                }
                _ => return Err(format!("--trace-config {flag}: unknown setting")),
            }
        }
        Ok(config)
    }
}

/// An OTLP/gRPC endpoint URL from Triton's `host:port[/path]` form.
fn endpoint(value: &str) -> String {
    if value.contains("://") {
        value.to_string()
    } else {
        format!("http://{value}")
    }
}

/// The tracer, the settings, and the exporter behind them.
pub struct Traces {
    settings: Mutex<TraceSettings>,
    /// `settings.any_on()`, readable without the lock.
    any_on: AtomicBool,
    tracer: Tracer,
    provider: SdkTracerProvider,
    propagator: TraceContextPropagator,
}

impl std::fmt::Debug for Traces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Traces").finish_non_exhaustive()
    }
}

impl Traces {
    /// Traces into `provider`: the binary's OTLP pipeline, or a test's
    /// in-memory exporter.
    pub fn with_provider(provider: SdkTracerProvider, initial: Effective) -> Arc<Self> {
        let settings = TraceSettings::new(initial);
        Arc::new(Traces {
            tracer: provider.tracer("nereid-server"),
            provider,
            any_on: AtomicBool::new(settings.any_on()),
            settings: Mutex::new(settings),
            propagator: TraceContextPropagator::new(),
        })
    }

    /// Tracing that never samples (tests, in-process use).
    pub fn disabled() -> Arc<Self> {
        Self::with_provider(SdkTracerProvider::builder().build(), Effective::default())
    }

    /// Starts the trace of one request if the settings sample it. `parent`
    /// is the client's W3C trace context (header name, value pairs).
    pub fn start_request(
        &self,
        model: &str,
        version: i64,
        request_id: &str,
        parent: &[(String, String)],
    ) -> Option<Arc<RequestTrace>> {
        if !self.any_on.load(Ordering::Relaxed) || !self.settings.lock().sample(model) {
            return None;
        }
        let carrier: HashMap<String, String> = parent.iter().cloned().collect();
        let parent = self.propagator.extract(&carrier);
        Some(Arc::new(RequestTrace::start(
            &self.tracer,
            &parent,
            model,
            version,
            request_id,
        )))
    }

    /// The tracer, for spans that are not a request's (batch executions).
    pub fn tracer(&self) -> &Tracer {
        &self.tracer
    }

    pub fn settings(&self, model: Option<&str>) -> Effective {
        self.settings.lock().effective(model)
    }

    pub fn update(&self, model: Option<&str>, changes: &[(String, Change)]) -> Result<Effective> {
        let mut settings = self.settings.lock();
        let effective = settings.update(model, changes)?;
        self.any_on.store(settings.any_on(), Ordering::Relaxed);
        Ok(effective)
    }

    /// Sends what is buffered (at shutdown).
    pub fn flush(&self) {
        if let Err(e) = self.provider.force_flush() {
            tracing::warn!(error = %e, "could not flush traces");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::settings::TraceLevel;

    #[test]
    fn trace_config_takes_tritons_forms() {
        let config = TraceConfig::parse(&[
            "mode=opentelemetry".into(),
            "level=TIMESTAMPS".into(),
            "rate=1".into(),
            "count=10".into(),
            "opentelemetry,url=localhost:4317".into(),
            "opentelemetry,resource=deployment.environment=test".into(),
            "opentelemetry,bsp_schedule_delay=200".into(),
        ])
        .unwrap();
        assert_eq!(config.initial.level, TraceLevel::Timestamps);
        assert_eq!((config.initial.rate, config.initial.count), (1, 10));
        assert_eq!(config.endpoint, "http://localhost:4317");
        assert_eq!(config.resource, vec![("deployment.environment".into(), "test".into())]);
        assert_eq!(config.schedule_delay, Duration::from_millis(200));
        for bad in [
            "level=LOUD",
            "rate=0",
            "count=-5",
            "mode=triton",
            "triton,file=/tmp/t.json",
            "nonsense",
        ] {
            assert!(TraceConfig::parse(&[bad.into()]).is_err(), "{bad}");
        }
    }
}
