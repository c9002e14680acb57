//! One traced request: its `InferRequest` span and the spans of its phases.
//!
//! Travels with the request (in its scheduler message) as an `Arc`, so the
//! scheduler and the instance thread can add child spans with the times
//! they measured. The request span ends when the answer is ready, or, if
//! the request is dropped first (the client went away), when it is dropped.

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use opentelemetry::trace::{Link, Span as _, SpanContext, SpanKind, Status, TraceContextExt, Tracer as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Span, Tracer};
use parking_lot::Mutex;

use crate::error::Error;
use crate::statistics::ComputeTiming;

pub struct RequestTrace {
    tracer: Tracer,
    /// A context whose span is this request's: the parent of its phases.
    cx: Context,
    span: Mutex<Option<Span>>,
    /// One instant and wall time taken together, to place other instants.
    started: Instant,
    started_at: SystemTime,
}

impl std::fmt::Debug for RequestTrace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestTrace")
            .field("trace_id", &self.span_context().trace_id())
            .finish_non_exhaustive()
    }
}

impl RequestTrace {
    pub(super) fn start(tracer: &Tracer, parent: &Context, model: &str, version: i64, request_id: &str) -> Self {
        let started = Instant::now();
        let started_at = SystemTime::now();
        let span = tracer
            .span_builder("InferRequest")
            .with_kind(SpanKind::Server)
            .with_start_time(started_at)
            .with_attributes([
                KeyValue::new("triton.model_name", model.to_string()),
                KeyValue::new("triton.model_version", version),
                KeyValue::new("triton.request_id", request_id.to_string()),
            ])
            .start_with_context(tracer, parent);
        let cx = Context::new().with_remote_span_context(span.span_context().clone());
        RequestTrace {
            tracer: tracer.clone(),
            cx,
            span: Mutex::new(Some(span)),
            started,
            started_at,
        }
    }

    /// The trace of a request this one makes to another model (an
    /// ensemble's step): its own `InferRequest` span, a child of this one's.
    pub fn child_request(&self, model: &str, version: i64, request_id: &str) -> RequestTrace {
        RequestTrace::start(&self.tracer, &self.cx, model, version, request_id)
    }

    /// This request's span as a W3C `traceparent` value, for a request it
    /// sends to another server.
    pub fn traceparent(&self) -> String {
        let cx = self.span_context();
        format!("00-{}-{}-{:02x}", cx.trace_id(), cx.span_id(), cx.trace_flags().to_u8())
    }

    pub fn span_context(&self) -> SpanContext {
        self.cx.span().span_context().clone()
    }

    /// The wall time of `instant`.
    fn at(&self, instant: Instant) -> SystemTime {
        match instant.checked_duration_since(self.started) {
            Some(after) => self.started_at + after,
            None => self.started_at - self.started.duration_since(instant),
        }
    }

    /// A finished child span of the request.
    pub fn child(&self, name: &'static str, start: Instant, end: Instant) {
        let mut span = self
            .tracer
            .span_builder(name)
            .with_kind(SpanKind::Internal)
            .with_start_time(self.at(start))
            .start_with_context(&self.tracer, &self.cx);
        span.end_with_timestamp(self.at(end));
    }

    /// The compute phases of an execution that started at `started`.
    pub fn compute(&self, started: Instant, timing: ComputeTiming) {
        let input_end = started + timing.input;
        let infer_end = input_end + timing.infer;
        self.child("compute_input", started, input_end);
        self.child("compute_infer", input_end, infer_end);
        self.child("compute_output", infer_end, infer_end + timing.output);
    }

    /// Ends the request span, with the error if it failed.
    pub fn finish(&self, error: Option<&Error>) {
        if let Some(mut span) = self.span.lock().take() {
            if let Some(e) = error {
                span.set_attribute(KeyValue::new("error.kind", e.kind().as_str()));
                span.set_status(Status::error(e.message().to_string()));
            }
            span.end();
        }
    }
}

impl Drop for RequestTrace {
    fn drop(&mut self) {
        if let Some(mut span) = self.span.get_mut().take() {
            span.set_status(Status::error("cancelled: the client went away"));
            span.end();
        }
    }
}

/// A finished `execute` span for one batch, linked to every traced request
/// it served (a batch has no single parent: it serves many traces).
pub fn batch(traces: &[&Arc<RequestTrace>], started: Instant, ended: Instant, batch_size: usize) {
    let Some(first) = traces.first() else { return };
    let links = traces.iter().map(|t| Link::with_context(t.span_context())).collect();
    let mut span = first
        .tracer
        .span_builder("execute")
        .with_kind(SpanKind::Internal)
        .with_start_time(first.at(started))
        .with_links(links)
        .with_attributes([KeyValue::new("triton.batch_size", batch_size as i64)])
        .start_with_context(&first.tracer, &Context::new());
    span.end_with_timestamp(first.at(ended));
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
    use std::time::Duration;

    #[test]
    fn phases_are_children_and_the_batch_links_every_request() {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(exporter.clone())
            .build();
        let tracer = provider.tracer("test");
        let a = Arc::new(RequestTrace::start(&tracer, &Context::new(), "m", 1, "a"));
        let b = Arc::new(RequestTrace::start(&tracer, &Context::new(), "m", 1, "b"));
        let t0 = Instant::now();
        a.child("queue", t0, t0 + Duration::from_millis(2));
        a.compute(
            t0,
            ComputeTiming {
                input: Duration::from_millis(1),
                infer: Duration::from_millis(5),
                output: Duration::from_millis(1),
            },
        );
        batch(&[&a, &b], t0, t0 + Duration::from_millis(7), 2);
        a.finish(None);
        drop(b);
        let spans = exporter.get_finished_spans().unwrap();
        let by_name = |n: &str| spans.iter().find(|s| s.name == n).unwrap();
        let request = spans
            .iter()
            .find(|s| s.name == "InferRequest" && s.span_context.trace_id() == a.span_context().trace_id())
            .unwrap();
        for child in ["queue", "compute_input", "compute_infer", "compute_output"] {
            assert_eq!(by_name(child).parent_span_id, request.span_context.span_id(), "{child}");
        }
        let infer = by_name("compute_infer");
        assert_eq!(
            infer.end_time.duration_since(infer.start_time).unwrap(),
            Duration::from_millis(5)
        );
        let execute = by_name("execute");
        assert_eq!(execute.links.links.len(), 2);
        let cancelled = spans.iter().filter(|s| s.name == "InferRequest").count();
        assert_eq!(cancelled, 2, "a dropped request's span still ends");
    }
}
