//! The OTLP pipeline request traces are exported through: the one part of
//! tracing that needs a transport (tonic), so it lives with the binary and
//! not in the core ([`nereid_core::trace`]).

use std::sync::Arc;
use std::time::Duration;

use nereid_core::trace::{TraceConfig, Traces};
use opentelemetry::KeyValue;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};

/// Builds the OTLP pipeline for `config`; call within the async runtime.
/// Nothing is sent until a request is traced.
pub fn start(config: &TraceConfig) -> Result<Arc<Traces>, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(config.endpoint.clone())
        .with_timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| format!("OTLP exporter for {}: {e}", config.endpoint))?;
    let mut resource = vec![KeyValue::new("service.name", "nereid-server")];
    resource.extend(config.resource.iter().map(|(k, v)| KeyValue::new(k.clone(), v.clone())));
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(config.schedule_delay)
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(batch)
        .with_resource(Resource::builder_empty().with_attributes(resource).build())
        .build();
    Ok(Traces::with_provider(provider, config.initial))
}
