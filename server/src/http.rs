//! The HTTP/REST front end: KServe v2 with Triton's extensions, on axum.
//!
//! Thin by design: each handler decodes, calls [`InferenceServer`], encodes.
//! Status codes come from [`error::status`], in one place.
//!
//! ```text
//! (this file)     the router by API group (restricted groups checked here), health, metadata, stats
//! port            the port's service: infer straight to its handler, the rest through the router
//! infer           the infer endpoint          infer_codec, json_tensor, request_json: its wire formats
//! generate        Triton's generate extension: /generate and /generate_stream (server-sent events)
//! repository      index, load, unload         settings: logging and trace settings
//! shared_memory   system shared memory regions: register, status, unregister
//! body            reading a body within its limits   compression: gzip and deflate
//! error           errors as responses
//! ```

pub mod body;
pub mod compression;
pub mod control_json;
pub mod error;
pub mod generate;
mod infer;
pub mod infer_codec;
pub mod json_tensor;
mod openai;
mod port;
mod repository;
pub mod request_json;
mod settings;
mod shared_memory;

use std::sync::Arc;

use axum::Router;
use axum::extract::{RawPathParams, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use serde_json::{Value, json};

use self::body::BodyLimits;
use self::error::{HttpError, with_status};
use crate::in_flight::InFlight;
use crate::local_control::LocalControl;
use crate::memory_budget::MemoryBudget;
use crate::metrics::Metrics;
use crate::model_config::json as config_json;
use crate::restricted_api::{ApiGroup, RestrictedApis};
use crate::server::{InferenceServer, TensorMetadata, VersionStatistics};
use crate::statistics::StatDuration;

pub use self::port::PortService;

/// Settings of the HTTP front end's handlers.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// Largest body and time to receive it.
    pub body: BodyLimits,
    /// The server-wide cap on request bytes held at once.
    pub budget: Arc<MemoryBudget>,
    /// `--http-restricted-api`.
    pub restricted: Arc<RestrictedApis>,
    /// Who may change the log and trace settings.
    pub local_control: LocalControl,
    /// The server's metrics (the front end's in-flight gauge).
    pub metrics: Arc<Metrics>,
}

/// What every handler reads: one pointer to clone per request.
#[derive(Clone)]
pub(crate) struct AppState(Arc<AppStateInner>);

pub(crate) struct AppStateInner {
    server: Arc<InferenceServer>,
    options: HttpOptions,
    /// The OpenAI API's metrics and chat templates.
    openai: openai::OpenAi,
}

impl std::ops::Deref for AppState {
    type Target = AppStateInner;

    fn deref(&self) -> &AppStateInner {
        &self.0
    }
}

pub(crate) type HandlerResult = Result<Response, HttpError>;

/// The HTTP port's service: infer straight to its handler, the rest
/// through [`router`] (see [`port`]). Every request counts in `in_flight`
/// until its answer has been sent.
pub fn service(server: Arc<InferenceServer>, options: HttpOptions, in_flight: Arc<InFlight>) -> PortService {
    let gauge = options.metrics.in_flight("http");
    let openai = openai::OpenAi::new(options.metrics.registry());
    let state = AppState(Arc::new(AppStateInner {
        server,
        options,
        openai,
    }));
    PortService::new(state.clone(), router(state), in_flight, gauge)
}

/// The axum router of every route.
fn router(state: AppState) -> Router {
    // Each API group is its own router, so the restricted-API check (Triton's
    // `--http-restricted-api`) is applied by group in exactly one place, and
    // only to the groups that are restricted: the others pay nothing for it.
    let restricted = Arc::clone(&state.options.restricted);
    let group = |group: ApiGroup, routes: Router<AppState>| match restricted.restriction(group) {
        Some(_) => routes.route_layer(middleware::from_fn_with_state(
            (Arc::clone(&restricted), group),
            restrict,
        )),
        None => routes,
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
                .route("/v2/models/{model}/infer", post(infer::route))
                .route("/v2/models/{model}/versions/{version}/infer", post(infer::route))
                .route("/v2/models/{model}/generate", post(generate::generate))
                .route(
                    "/v2/models/{model}/versions/{version}/generate",
                    post(generate::generate),
                )
                .route("/v2/models/{model}/generate_stream", post(generate::generate_stream))
                .route(
                    "/v2/models/{model}/versions/{version}/generate_stream",
                    post(generate::generate_stream),
                )
                .merge(openai::routes()),
        ))
        .merge(group(
            ApiGroup::ModelRepository,
            Router::new()
                .route("/v2/repository/index", post(repository::repository_index))
                .route("/v2/repository/models/{model}/load", post(repository::load))
                .route("/v2/repository/models/{model}/unload", post(repository::unload)),
        ))
        .merge(group(
            ApiGroup::Trace,
            Router::new()
                .route(
                    "/v2/trace/setting",
                    get(settings::trace_settings).post(settings::update_trace_settings),
                )
                .route(
                    "/v2/models/{model}/trace/setting",
                    get(settings::trace_settings).post(settings::update_trace_settings),
                ),
        ))
        .merge(group(
            ApiGroup::Logging,
            Router::new().route(
                "/v2/logging",
                get(settings::log_settings).post(settings::update_log_settings),
            ),
        ))
        .merge(group(
            ApiGroup::SharedMemory,
            Router::new()
                .route("/v2/systemsharedmemory/status", get(shared_memory::status))
                .route(
                    "/v2/systemsharedmemory/region/{region}/status",
                    get(shared_memory::status),
                )
                .route(
                    "/v2/systemsharedmemory/region/{region}/register",
                    post(shared_memory::register),
                )
                .route("/v2/systemsharedmemory/unregister", post(shared_memory::unregister))
                .route(
                    "/v2/systemsharedmemory/region/{region}/unregister",
                    post(shared_memory::unregister),
                )
                .route("/v2/cudasharedmemory/status", get(shared_memory::cuda_status))
                .route(
                    "/v2/cudasharedmemory/region/{region}/status",
                    get(shared_memory::cuda_status),
                )
                .route(
                    "/v2/cudasharedmemory/region/{region}/register",
                    post(shared_memory::cuda_register),
                )
                .route("/v2/cudasharedmemory/unregister", post(shared_memory::cuda_unregister))
                .route(
                    "/v2/cudasharedmemory/region/{region}/unregister",
                    post(shared_memory::cuda_unregister),
                ),
        ))
        .fallback(|| async { with_status(StatusCode::NOT_FOUND, "Not Found") })
        .with_state(state)
}

/// Refuses a request to a restricted group without its header.
async fn restrict(
    State((restricted, group)): State<(Arc<RestrictedApis>, ApiGroup)>,
    request: Request,
    next: Next,
) -> Response {
    match check_restricted(&restricted, group, request.headers()) {
        Ok(()) => next.run(request).await,
        Err(e) => HttpError(e).into_response(),
    }
}

/// The W3C trace context headers ([`crate::request::TRACE_HEADERS`]), named once.
const TRACE_HEADERS: [HeaderName; 2] = [
    HeaderName::from_static(crate::request::TRACE_HEADERS[0]),
    HeaderName::from_static(crate::request::TRACE_HEADERS[1]),
];

/// The values of the trace context headers, for [`crate::request::trace_parent`].
fn trace_parent(headers: &HeaderMap) -> [Option<&str>; 2] {
    TRACE_HEADERS.each_ref().map(|name| headers.get(name)?.to_str().ok())
}

/// Whether `headers` may use `group` (Triton's `--http-restricted-api`):
/// for the router's groups, and for the infer requests the port's service
/// answers itself.
fn check_restricted(
    restricted: &RestrictedApis,
    group: ApiGroup,
    headers: &HeaderMap,
) -> Result<(), crate::error::Error> {
    restricted.check(group, |key| headers.get(key).map(HeaderValue::as_bytes))
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
///
/// Read from the raw parameters: `Path<HashMap<..>>` would build a map of
/// owned strings on every request, the infer route's included.
pub(crate) fn model_path(params: &RawPathParams) -> (&str, &str) {
    let (mut model, mut version) = ("", "");
    for (key, value) in params {
        match key {
            "model" => model = value,
            "version" => version = value,
            _ => {}
        }
    }
    (model, version)
}

async fn model_metadata(State(s): State<AppState>, p: RawPathParams) -> HandlerResult {
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

async fn model_ready(State(s): State<AppState>, p: RawPathParams) -> HandlerResult {
    let (model, version) = model_path(&p);
    s.server.model_ready(model, version)?;
    Ok(StatusCode::OK.into_response())
}

async fn model_config(State(s): State<AppState>, p: RawPathParams) -> HandlerResult {
    let (model, version) = model_path(&p);
    let config = s.server.model_config(model, version)?;
    Ok(axum::Json(config_json::to_json(&config)).into_response())
}

async fn statistics(State(s): State<AppState>, p: RawPathParams) -> HandlerResult {
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
