//! The HTTP/REST front end: KServe v2 with Triton's extensions, on axum.
//!
//! Thin by design: each handler decodes, calls [`InferenceServer`], encodes.
//! Status codes come from [`error::status`], in one place.

pub mod body;
pub mod compression;
pub mod error;
pub mod infer_codec;
pub mod json_tensor;
pub mod request_json;
pub mod serve;

use std::collections::HashMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use self::body::BodyLimits;
use self::error::{HttpError, with_status};
use crate::error::Error;
use crate::in_flight::{InFlight, InFlightLayer};
use crate::logging::LogSettings;
use crate::memory_budget::{MemoryBudget, Reservation};
use crate::metrics::Metrics;
use crate::model_config::json as config_json;
use crate::parameter::Parameter;
use crate::request::TRACE_HEADERS;
use crate::restricted_api::{ApiGroup, RestrictedApis};
use crate::server::{InferenceServer, TensorMetadata, VersionStatistics, parse_version};
use crate::statistics::StatDuration;
use crate::trace::settings::{Change as TraceChange, Effective as TraceEffective};

pub use self::serve::{HttpServeOptions, serve};

/// Bodies at least this large are decoded (and responses at least this
/// large encoded) on the blocking pool, not on the I/O threads: parsing
/// megabytes of JSON would stall every other connection on that thread.
const OFFLOAD_BYTES: usize = 64 << 10;

/// Settings of the HTTP front end's handlers.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Largest body and time to receive it.
    pub body: BodyLimits,
    /// The server-wide cap on request bytes held at once.
    pub budget: Arc<MemoryBudget>,
    /// `--http-restricted-api`.
    pub restricted: Arc<RestrictedApis>,
    /// The server's metrics (the front end's in-flight gauge).
    pub metrics: Arc<Metrics>,
}

#[derive(Clone)]
struct AppState {
    server: Arc<InferenceServer>,
    options: HttpOptions,
}

type HandlerResult = Result<Response, HttpError>;

pub fn router(server: Arc<InferenceServer>, options: HttpOptions, in_flight: Arc<InFlight>) -> Router {
    let state = AppState { server, options };
    // Each API group is its own router, so the restricted-API check (Triton's
    // `--http-restricted-api`) is applied by group in exactly one place.
    let group = |group: ApiGroup, routes: Router<AppState>| {
        routes.route_layer(middleware::from_fn_with_state(
            (Arc::clone(&state.options.restricted), group),
            restrict,
        ))
    };
    Router::new()
        .merge(group(
            ApiGroup::Health,
            Router::new()
                .route("/v2/health/live", get(live))
                .route("/v2/health/ready", get(ready)),
        ))
        .merge(group(
            ApiGroup::Metadata,
            Router::new()
                .route("/v2", get(server_metadata))
                .route("/v2/models/{model}", get(model_metadata))
                .route("/v2/models/{model}/versions/{version}", get(model_metadata))
                .route("/v2/models/{model}/ready", get(model_ready))
                .route("/v2/models/{model}/versions/{version}/ready", get(model_ready)),
        ))
        .merge(group(
            ApiGroup::ModelConfig,
            Router::new()
                .route("/v2/models/{model}/config", get(model_config))
                .route("/v2/models/{model}/versions/{version}/config", get(model_config)),
        ))
        .merge(group(
            ApiGroup::Statistics,
            Router::new()
                .route("/v2/models/stats", get(statistics))
                .route("/v2/models/{model}/stats", get(statistics))
                .route("/v2/models/{model}/versions/{version}/stats", get(statistics)),
        ))
        .merge(group(
            ApiGroup::Inference,
            Router::new()
                .route("/v2/models/{model}/infer", post(infer))
                .route("/v2/models/{model}/versions/{version}/infer", post(infer)),
        ))
        .merge(group(
            ApiGroup::ModelRepository,
            Router::new()
                .route("/v2/repository/index", post(repository_index))
                .route("/v2/repository/models/{model}/load", post(load))
                .route("/v2/repository/models/{model}/unload", post(unload)),
        ))
        .merge(group(
            ApiGroup::Trace,
            Router::new()
                .route("/v2/trace/setting", get(trace_settings).post(update_trace_settings))
                .route(
                    "/v2/models/{model}/trace/setting",
                    get(trace_settings).post(update_trace_settings),
                ),
        ))
        .merge(group(
            ApiGroup::Logging,
            Router::new().route("/v2/logging", get(log_settings).post(update_log_settings)),
        ))
        .merge(group(
            ApiGroup::SharedMemory,
            Router::new()
                .route("/v2/systemsharedmemory/status", get(shared_memory))
                .route("/v2/systemsharedmemory/region/{region}/status", get(shared_memory))
                .route("/v2/systemsharedmemory/region/{region}/register", post(shared_memory))
                .route("/v2/systemsharedmemory/unregister", post(shared_memory))
                .route("/v2/systemsharedmemory/region/{region}/unregister", post(shared_memory))
                .route("/v2/cudasharedmemory/status", get(shared_memory))
                .route("/v2/cudasharedmemory/region/{region}/status", get(shared_memory))
                .route("/v2/cudasharedmemory/region/{region}/register", post(shared_memory))
                .route("/v2/cudasharedmemory/unregister", post(shared_memory))
                .route("/v2/cudasharedmemory/region/{region}/unregister", post(shared_memory)),
        ))
        .fallback(|| async { with_status(StatusCode::NOT_FOUND, "Not Found") })
        // Outermost, so a request counts until its response is fully sent.
        .layer(InFlightLayer::new(in_flight, state.options.metrics.in_flight("http")))
        .with_state(state)
}

/// Refuses a request to a restricted group without its header.
async fn restrict(
    State((restricted, group)): State<(Arc<RestrictedApis>, ApiGroup)>,
    request: Request,
    next: Next,
) -> Response {
    let headers = request.headers();
    match restricted.check(group, |key| headers.get(key).map(HeaderValue::as_bytes)) {
        Ok(()) => next.run(request).await,
        Err(e) => HttpError(e).into_response(),
    }
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
    body: Body,
) -> HandlerResult {
    let (model, version_text) = model_path(&p);
    let version = parse_version(version_text)?;
    // As in Triton, an unknown model is reported before the body is read.
    s.server.model(model, version_text)?;
    let mut reservation = s.options.budget.reservation();
    let body = body::read(body, &headers, s.options.body, &mut reservation).await?;
    let header_length = header_length(&headers, body.len())?;
    let large = body.len() >= OFFLOAD_BYTES;
    let model_name = model.to_string();
    let decode = move || infer_codec::decode(&model_name, version, body, header_length, reservation);
    let decoded = if large { offload(decode).await? } else { decode()? };
    let binary_outputs = decoded.binary_outputs;
    let mut request = decoded.request;
    request.trace_parent = trace_parent(&headers);
    let mut response = s.server.infer(request).await?;
    let mut reservation = std::mem::take(&mut response.reservation);
    let output_bytes: usize = response.outputs.iter().map(|t| t.data.len()).sum();
    let encode = move || infer_codec::encode(&response, &binary_outputs);
    let encoded = if output_bytes >= OFFLOAD_BYTES {
        offload(move || Ok(encode())).await?
    } else {
        encode()
    };

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
    let (body, allocated) = match compression::accepted(accept) {
        Some(encoding) => {
            reply.insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding.as_str()));
            let packed = compression::compress(encoding, &encoded.body);
            let allocated = packed.len();
            (packed, allocated)
        }
        None => (encoded.body, encoded.allocated),
    };
    // The answer is held until it is sent: it counts like the request did.
    reservation.grow(allocated).map_err(Error::from)?;
    Ok((reply, Body::new(ReservedBody::new(body, reservation))).into_response())
}

/// The client's W3C trace context headers, if it sent them.
fn trace_parent(headers: &HeaderMap) -> Vec<(String, String)> {
    TRACE_HEADERS
        .iter()
        .filter_map(|name| Some((name.to_string(), headers.get(*name)?.to_str().ok()?.to_string())))
        .collect()
}

/// Runs CPU-heavy codec work on the blocking pool.
async fn offload<T: Send + 'static>(work: impl FnOnce() -> Result<T, Error> + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Error::internal(format!("decoding failed: {e}"))))
}

/// A response body that keeps its request's memory reservation until sent.
struct ReservedBody {
    data: Option<Bytes>,
    _reservation: Reservation,
}

impl ReservedBody {
    fn new(data: Bytes, reservation: Reservation) -> Self {
        ReservedBody {
            data: Some(data),
            _reservation: reservation,
        }
    }
}

impl http_body::Body for ReservedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.get_mut().data.take().map(|d| Ok(http_body::Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
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

/// A small control-API body (index, load, unload) as JSON; empty is `{}`.
async fn control_body(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Value, Error> {
    let mut reservation = s.options.budget.reservation();
    let body = body::read(body, headers, s.options.body, &mut reservation).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_slice(&body).map_err(|e| Error::invalid(format!("failed to parse the request JSON buffer: {e}")))
}

async fn repository_index(State(s): State<AppState>, headers: HeaderMap, body: Body) -> HandlerResult {
    let ready_only = match control_body(&s, &headers, body).await?.get("ready") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(Error::invalid("Invalid value for 'ready': expected a boolean").into());
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
async fn body_parameters(
    s: &AppState,
    headers: &HeaderMap,
    body: Body,
) -> Result<serde_json::Map<String, Value>, Error> {
    match control_body(s, headers, body)
        .await?
        .get_mut("parameters")
        .map(Value::take)
    {
        None => Ok(Default::default()),
        Some(Value::Object(map)) => Ok(map),
        Some(_) => Err(Error::invalid("'parameters' must be a JSON object")),
    }
}

async fn load(State(s): State<AppState>, Path(model): Path<String>, headers: HeaderMap, body: Body) -> HandlerResult {
    let mut config = None;
    for (key, value) in body_parameters(&s, &headers, body).await? {
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

async fn unload(State(s): State<AppState>, Path(model): Path<String>, headers: HeaderMap, body: Body) -> HandlerResult {
    for (key, value) in body_parameters(&s, &headers, body).await? {
        if key != "unload_dependents" || !value.is_boolean() {
            return Err(Error::invalid(format!("Unrecognized unload parameter '{key}' with value {value}")).into());
        }
    }
    s.server.unload_model(&model).await?;
    Ok(StatusCode::OK.into_response())
}

/// The shared-memory extension's routes: Triton's error shape, plainly
/// saying the extension is not there (rather than a bare 404).
async fn shared_memory() -> HandlerResult {
    Err(Error::unsupported("shared memory (system and CUDA) is not supported by this server").into())
}

/// The logging extension's settings in Triton's JSON shape.
fn log_settings_json(settings: &LogSettings) -> Value {
    json!({
        "log_file": "",
        "log_info": settings.info,
        "log_warning": settings.warning,
        "log_error": settings.error,
        "log_verbose_level": settings.verbose_level,
        "log_format": settings.format.as_str(),
    })
}

async fn log_settings(State(s): State<AppState>) -> Response {
    axum::Json(log_settings_json(&s.server.log_settings())).into_response()
}

async fn update_log_settings(State(s): State<AppState>, headers: HeaderMap, body: Body) -> HandlerResult {
    let Value::Object(changes) = control_body(&s, &headers, body).await? else {
        return Err(Error::invalid("the log settings must be a JSON object").into());
    };
    let mut parsed = Vec::with_capacity(changes.len());
    for (key, value) in changes {
        let value = match value {
            Value::Bool(b) => Parameter::Bool(b),
            Value::String(text) => Parameter::String(text),
            Value::Number(n) => match n.as_i64() {
                Some(i) => Parameter::Int(i),
                None => return Err(Error::invalid(format!("log setting '{key}' must be an integer, got {n}")).into()),
            },
            other => {
                return Err(Error::invalid(format!("log setting '{key}' has an unsupported value {other}")).into());
            }
        };
        parsed.push((key, value));
    }
    let settings = s.server.update_log_settings(&parsed)?;
    Ok(axum::Json(log_settings_json(&settings)).into_response())
}

/// Trace settings in Triton's JSON shape: every value a string (a list for the level).
fn trace_settings_json(e: &TraceEffective) -> Value {
    json!({
        "trace_file": "",
        "trace_level": [e.level.as_str()],
        "trace_rate": e.rate.to_string(),
        "trace_count": e.count.to_string(),
        "log_frequency": e.log_frequency.to_string(),
        "trace_mode": "opentelemetry",
    })
}

async fn trace_settings(State(s): State<AppState>, Path(p): Path<HashMap<String, String>>) -> HandlerResult {
    let model = p.get("model").map(String::as_str);
    Ok(axum::Json(trace_settings_json(&s.server.trace_settings(model)?)).into_response())
}

async fn update_trace_settings(
    State(s): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    let model = p.get("model").map(String::as_str);
    let Value::Object(changes) = control_body(&s, &headers, body).await? else {
        return Err(Error::invalid("the trace settings must be a JSON object").into());
    };
    let mut parsed = Vec::with_capacity(changes.len());
    for (key, value) in changes {
        let change = match value {
            Value::Null => TraceChange::Clear,
            Value::String(text) => TraceChange::Set(vec![text]),
            Value::Array(items) => TraceChange::Set(
                items
                    .into_iter()
                    .map(|item| match item {
                        Value::String(text) => Ok(text),
                        other => Err(Error::invalid(format!(
                            "trace setting '{key}' must hold strings, got {other}"
                        ))),
                    })
                    .collect::<Result<_, _>>()?,
            ),
            other => {
                return Err(Error::invalid(format!(
                    "trace setting '{key}' must be a string, a list of strings or null, got {other}"
                ))
                .into());
            }
        };
        parsed.push((key, change));
    }
    let settings = s.server.update_trace_settings(model, &parsed)?;
    Ok(axum::Json(trace_settings_json(&settings)).into_response())
}
