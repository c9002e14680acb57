//! The HTTP/REST front end: KServe v2 with Triton's extensions, on axum.
//!
//! Thin by design: each handler decodes, calls [`InferenceServer`], encodes.
//! Status codes come from [`error::status`], in one place.

pub mod compression;
pub mod error;
pub mod infer_codec;
pub mod json_tensor;

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tokio::net::TcpListener;

use self::error::{HttpError, with_status};
use crate::error::Error;
use crate::in_flight::{InFlight, InFlightLayer};
use crate::model_config::json as config_json;
use crate::server::{InferenceServer, TensorMetadata, VersionStatistics, parse_version};
use crate::statistics::StatDuration;

/// Settings of the HTTP front end.
#[derive(Debug, Clone, Copy)]
pub struct HttpOptions {
    /// Largest request body accepted, before and after decompression.
    pub max_input_size: usize,
}

#[derive(Clone)]
struct AppState {
    server: Arc<InferenceServer>,
    options: HttpOptions,
}

type HandlerResult = Result<Response, HttpError>;

pub fn router(server: Arc<InferenceServer>, options: HttpOptions, in_flight: Arc<InFlight>) -> Router {
    let state = AppState { server, options };
    Router::new()
        .route("/v2", get(server_metadata))
        .route("/v2/health/live", get(live))
        .route("/v2/health/ready", get(ready))
        .route("/v2/models/{model}", get(model_metadata))
        .route("/v2/models/{model}/versions/{version}", get(model_metadata))
        .route("/v2/models/{model}/ready", get(model_ready))
        .route("/v2/models/{model}/versions/{version}/ready", get(model_ready))
        .route("/v2/models/{model}/config", get(model_config))
        .route("/v2/models/{model}/versions/{version}/config", get(model_config))
        .route("/v2/models/stats", get(statistics))
        .route("/v2/models/{model}/stats", get(statistics))
        .route("/v2/models/{model}/versions/{version}/stats", get(statistics))
        .route("/v2/models/{model}/infer", post(infer))
        .route("/v2/models/{model}/versions/{version}/infer", post(infer))
        .route("/v2/repository/index", post(repository_index))
        .route("/v2/repository/models/{model}/load", post(load))
        .route("/v2/repository/models/{model}/unload", post(unload))
        .fallback(|| async { with_status(StatusCode::NOT_FOUND, "Not Found") })
        // Bodies are limited here so that an oversized one is refused while
        // it streams in, never buffered whole.
        .layer(DefaultBodyLimit::max(options.max_input_size))
        // Outermost, so a request counts until its response is fully sent.
        .layer(InFlightLayer::new(in_flight))
        .with_state(state)
}

/// Serves until `shutdown` resolves, then lets in-flight requests finish.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    // Small responses must not wait for Nagle's algorithm.
    let listener = listener.tap_io(|tcp| {
        let _ = tcp.set_nodelay(true);
    });
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}

async fn live(State(s): State<AppState>) -> StatusCode {
    if s.server.is_live() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

async fn ready(State(s): State<AppState>) -> StatusCode {
    if s.server.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::BAD_REQUEST
    }
}

async fn server_metadata(State(s): State<AppState>) -> Response {
    let m = s.server.metadata();
    axum::Json(json!({ "name": m.name, "version": m.version, "extensions": m.extensions })).into_response()
}

/// The model name and version string ("" when absent) from the path.
fn model_path(params: &HashMap<String, String>) -> (&str, &str) {
    (
        params.get("model").map_or("", String::as_str),
        params.get("version").map_or("", String::as_str),
    )
}

async fn model_metadata(State(s): State<AppState>, Path(p): Path<HashMap<String, String>>) -> HandlerResult {
    let (model, version) = model_path(&p);
    let m = s.server.model_metadata(model, version)?;
    let tensors = |ts: &[TensorMetadata]| -> Vec<Value> {
        ts.iter()
            .map(|t| json!({ "name": t.name, "datatype": t.datatype.as_wire(), "shape": t.shape }))
            .collect()
    };
    Ok(axum::Json(json!({
        "name": m.name,
        "versions": m.versions,
        "platform": m.platform,
        "inputs": tensors(&m.inputs),
        "outputs": tensors(&m.outputs),
    }))
    .into_response())
}

async fn model_ready(State(s): State<AppState>, Path(p): Path<HashMap<String, String>>) -> HandlerResult {
    let (model, version) = model_path(&p);
    s.server.model_ready(model, version)?;
    Ok(StatusCode::OK.into_response())
}

async fn model_config(State(s): State<AppState>, Path(p): Path<HashMap<String, String>>) -> HandlerResult {
    let (model, version) = model_path(&p);
    let config = s.server.model_config(model, version)?;
    Ok(axum::Json(config_json::to_json(&config)).into_response())
}

async fn statistics(State(s): State<AppState>, Path(p): Path<HashMap<String, String>>) -> HandlerResult {
    let (model, version) = model_path(&p);
    let name = (!model.is_empty()).then_some(model);
    let stats = s.server.statistics(name, version)?;
    Ok(axum::Json(json!({ "model_stats": stats.iter().map(statistics_json).collect::<Vec<_>>() })).into_response())
}

/// One version's statistics in Triton's JSON shape.
fn statistics_json(v: &VersionStatistics) -> Value {
    let d = |d: &StatDuration| json!({ "count": d.count, "ns": d.ns });
    let i = &v.stats.inference_stats;
    let zero = StatDuration::default();
    json!({
        "name": v.name,
        "version": v.version.to_string(),
        "last_inference": v.stats.last_inference,
        "inference_count": v.stats.inference_count,
        "execution_count": v.stats.execution_count,
        "inference_stats": {
            "success": d(&i.success),
            "fail": d(&i.fail),
            "queue": d(&i.queue),
            "compute_input": d(&i.compute_input),
            "compute_infer": d(&i.compute_infer),
            "compute_output": d(&i.compute_output),
            "cache_hit": d(&zero),
            "cache_miss": d(&zero),
        },
        "batch_stats": v.stats.batch_stats.iter().map(|(size, b)| json!({
            "batch_size": size,
            "compute_input": d(&b.compute_input),
            "compute_infer": d(&b.compute_infer),
            "compute_output": d(&b.compute_output),
        })).collect::<Vec<_>>(),
        "memory_usage": [],
    })
}

async fn infer(
    State(s): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> HandlerResult {
    let (model, version_text) = model_path(&p);
    let version = parse_version(version_text)?;
    // As in Triton, an unknown model is reported before the body is decoded.
    s.server.model(model, version_text)?;
    let body = read_body(body, &headers, s.options.max_input_size)?;
    let header_length = header_length(&headers, body.len())?;
    let decoded = infer_codec::decode(model, version, body, header_length)?;
    let response = s.server.infer(decoded.request).await?;
    let encoded = infer_codec::encode(&response, &decoded.binary_outputs);

    let mut reply = HeaderMap::new();
    let content_type = if encoded.header_length.is_some() {
        "application/octet-stream"
    } else {
        "application/json"
    };
    reply.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(n) = encoded.header_length {
        reply.insert(infer_codec::HEADER_LENGTH, HeaderValue::from(n));
    }
    let accept = headers.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok());
    let body = match compression::accepted(accept) {
        Some(encoding) => {
            reply.insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding.as_str()));
            compression::compress(encoding, &encoded.body)
        }
        None => encoded.body,
    };
    Ok((reply, body).into_response())
}

/// The request body, inflated if it was compressed, within the size limit.
fn read_body(body: Result<Bytes, BytesRejection>, headers: &HeaderMap, limit: usize) -> Result<Bytes, HttpError> {
    let body = body.map_err(|rejection| {
        let status = rejection.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!(
                "request size exceeds the maximum allowed input size of {limit} bytes. Use --http-max-input-size to increase the limit."
            )
        } else {
            format!("failed to read the request body: {rejection}")
        };
        HttpError(Error::new(
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                crate::error::ErrorKind::InvalidArgument
            } else {
                crate::error::ErrorKind::Internal
            },
            message,
        ))
    })?;
    let encoding = headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok());
    match compression::content_encoding(encoding)? {
        Some(encoding) => Ok(compression::decompress(encoding, &body, limit)?),
        None => Ok(body),
    }
}

/// Parses `Inference-Header-Content-Length` against the body length.
fn header_length(headers: &HeaderMap, body_len: usize) -> Result<Option<usize>, Error> {
    let Some(value) = headers.get(infer_codec::HEADER_LENGTH) else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    let n: i64 = text
        .parse()
        .map_err(|_| Error::invalid(format!("Unable to parse Inference-Header-Content-Length, got: {text}")))?;
    if n < 0 || n as u64 > body_len as u64 {
        return Err(Error::invalid(format!(
            "inference header size should be in range (0, {body_len}), got: {n}"
        )));
    }
    Ok(Some(n as usize))
}

async fn repository_index(State(s): State<AppState>, body: Result<Bytes, BytesRejection>) -> HandlerResult {
    let body = body.map_err(|e| Error::invalid(format!("failed to read the request body: {e}")))?;
    let ready_only = if body.iter().all(u8::is_ascii_whitespace) {
        false
    } else {
        let value: Value = serde_json::from_slice(&body)
            .map_err(|e| Error::invalid(format!("failed to parse the request JSON buffer: {e}")))?;
        match value.get("ready") {
            None => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(Error::invalid("Invalid value for 'ready': expected a boolean").into());
            }
        }
    };
    let rows: Vec<Value> = s
        .server
        .repository_index(ready_only)
        .await?
        .into_iter()
        .map(|row| {
            let mut entry = serde_json::Map::new();
            entry.insert("name".into(), Value::String(row.name));
            if let Some(v) = row.version {
                entry.insert("version".into(), Value::String(v.to_string()));
            }
            if let Some(state) = row.state {
                entry.insert("state".into(), Value::String(state.as_str().into()));
            }
            if !row.reason.is_empty() {
                entry.insert("reason".into(), Value::String(row.reason));
            }
            Value::Object(entry)
        })
        .collect();
    Ok(axum::Json(Value::Array(rows)).into_response())
}

/// The `parameters` object of a load or unload body, if any.
fn body_parameters(body: Result<Bytes, BytesRejection>) -> Result<serde_json::Map<String, Value>, Error> {
    let body = body.map_err(|e| Error::invalid(format!("failed to read the request body: {e}")))?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Default::default());
    }
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| Error::invalid(format!("failed to parse the request JSON buffer: {e}")))?;
    match value.get("parameters") {
        None => Ok(Default::default()),
        Some(Value::Object(map)) => Ok(map.clone()),
        Some(_) => Err(Error::invalid("'parameters' must be a JSON object")),
    }
}

async fn load(
    State(s): State<AppState>,
    Path(model): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> HandlerResult {
    let mut config = None;
    for (key, value) in body_parameters(body)? {
        match (key.as_str(), value) {
            ("config", Value::String(text)) => {
                let parsed = config_json::from_json(&text)
                    .map_err(|e| Error::invalid(format!("Invalid config override: {}", e.message())))?;
                config = Some(parsed);
            }
            ("config", _) => {
                return Err(Error::invalid("load parameter 'config' must be a JSON string").into());
            }
            (k, _) if k.starts_with("file:") => {
                return Err(
                    Error::unsupported("model file overrides ('file:' load parameters) are not supported").into(),
                );
            }
            (k, v) => {
                return Err(Error::invalid(format!("Unrecognized load parameter '{k}' with value {v}")).into());
            }
        }
    }
    s.server.load_model(&model, config).await?;
    Ok(StatusCode::OK.into_response())
}

async fn unload(
    State(s): State<AppState>,
    Path(model): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> HandlerResult {
    for (key, value) in body_parameters(body)? {
        if key != "unload_dependents" || !value.is_boolean() {
            return Err(Error::invalid(format!("Unrecognized unload parameter '{key}' with value {value}")).into());
        }
    }
    s.server.unload_model(&model).await?;
    Ok(StatusCode::OK.into_response())
}
