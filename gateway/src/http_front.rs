//! The HTTP/REST port: KServe v2 paths, each request routed by the model in
//! its path and forwarded with its body as it came (binary tensor extension
//! included), read whole first so that it can be retried on another pod if
//! the first cannot be reached.
//!
//! A model in another namespace is named `namespace%2Fname` in the path, or
//! by the `nereid-namespace` header; the pod is sent its plain name.
//! Health is the gateway's own; the repository index is the cluster's
//! models (those the request's bearer token may reach); load and unload are
//! refused, pointing to the InferenceModel.
//!
//! A request that may not reach its model's namespace ([`crate::authorize`])
//! is refused with 401 and `www-authenticate: Bearer` once its head is
//! read, before its body.
//!
//! The OpenAI API's routes are [`openai`]'s.
//!
//! Only a model's data plane is forwarded (metadata, ready, config, stats,
//! infer, generate, generate_stream: [`model_name::ModelCall`]), as on the
//! gRPC port; Triton's endpoints about one server (trace and log settings,
//! shared memory) are refused with 403, anything else with 404, both with
//! KServe's `{"error": "..."}`.

mod openai;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::json;

use crate::authorize::Refused;
use crate::forward::{Forward, ForwardError, Payload};
use crate::metrics::Failure;
use crate::model_name::{self, HttpRoute, OpenAiCall, PathError};
use crate::registry::RouteError;
use crate::reply_body::Reply;
use crate::request_body::{ReadError, read_while};
use crate::state::Gateway;
use crate::{NAMESPACE_HEADER, Protocol};

pub async fn serve(gateway: Arc<Gateway>, request: Request<Incoming>) -> Result<Response<Reply>, Infallible> {
    let started = Instant::now();
    let path = request.uri().path();
    let route = match model_name::from_http_path(path) {
        Ok(route) => route,
        Err(error) => {
            gateway.metrics.failed("", Failure::BadRequest);
            let status = match error {
                PathError::OneServer(_) => StatusCode::FORBIDDEN,
                _ => StatusCode::NOT_FOUND,
            };
            return Ok(error_json(status, &error.to_string()));
        }
    };
    Ok(match route {
        HttpRoute::Model { name, .. } => per_model(&gateway, request, name, started).await,
        HttpRoute::Server => server(&gateway, request, started).await,
        HttpRoute::Repository => repository(&gateway, request).await,
        HttpRoute::OpenAi(OpenAiCall::Models) => openai::models(&gateway, &request),
        HttpRoute::OpenAiModel { name } => openai::model(&gateway, &request, &name),
        HttpRoute::OpenAi(OpenAiCall::Generate) => openai::generate(&gateway, request, started).await,
    })
}

async fn per_model(gateway: &Gateway, request: Request<Incoming>, name: String, started: Instant) -> Response<Reply> {
    let (parts, body) = request.into_parts();
    let requested = qualified(name, &parts.headers);
    // Before the body is read: a request that may not reach the model
    // costs no more than its head.
    let requested = match gateway.admit(requested, &parts.headers) {
        Ok(requested) => requested,
        Err(refused) => return refusal(refused),
    };
    // The pod knows the model by its plain name.
    let path_and_query = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let path = unqualified(path_and_query);
    let limits = gateway.limits.body();
    if let Some(length) = content_length(&parts.headers)
        && length > limits.max_bytes as u64
    {
        let error = ReadError::TooLarge {
            limit: limits.max_bytes,
            flag: limits.max_bytes_flag,
        };
        return read_failure(gateway, &error);
    }
    // Held until the pod has answered: the chunks are kept until then, for
    // a retry on another pod.
    let mut charge = gateway.charge();
    let chunks = match read_while(body, limits, &mut charge, |_, _| true).await {
        Ok((chunks, _)) => chunks,
        Err(error) => return read_failure(gateway, &error),
    };
    let forward = Forward {
        protocol: Protocol::Http,
        model: &requested,
        method: parts.method,
        path: &path,
        headers: parts.headers,
        body: Payload::Whole(chunks),
        started,
    };
    gateway
        .forward(forward)
        .await
        .unwrap_or_else(|error| forward_failure(&error))
}

/// `name` in the namespace the `nereid-namespace` header names, unless it
/// names one itself (`namespace/name`).
fn qualified(name: String, headers: &http::HeaderMap) -> String {
    match headers.get(NAMESPACE_HEADER).and_then(|v| v.to_str().ok()) {
        Some(namespace) if !name.contains('/') => format!("{namespace}/{name}"),
        _ => name,
    }
}

/// `path` with a namespace-qualified model segment (`ml%2Fresnet`) cut to
/// the plain name (`resnet`).
fn unqualified(path: &str) -> std::borrow::Cow<'_, str> {
    let Some(rest) = path.strip_prefix("/v2/models/") else {
        return path.into();
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let segment = &rest[..end];
    let lower = segment.to_ascii_lowercase();
    match lower.find("%2f") {
        Some(at) => format!("/v2/models/{}{}", &segment[at + 3..], &rest[end..]).into(),
        None => path.into(),
    }
}

fn content_length(headers: &http::HeaderMap) -> Option<u64> {
    headers.get(header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

/// Health (the gateway's own) and server metadata (any ready pod's).
async fn server(gateway: &Gateway, request: Request<Incoming>, started: Instant) -> Response<Reply> {
    match request.uri().path().trim_end_matches('/') {
        "/v2/health/live" => return Response::new(Reply::empty()),
        "/v2/health/ready" => {
            let mut response = Response::new(Reply::empty());
            if !gateway.router.synced() {
                *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            }
            return response;
        }
        "/v2" => {}
        other => return error_json(StatusCode::NOT_FOUND, &format!("no such endpoint: {other}")),
    }
    let Some(route) = gateway.any_route(request.headers()) else {
        return json_reply(
            StatusCode::OK,
            &json!({"name": "nereid-gateway", "version": env!("CARGO_PKG_VERSION"), "extensions": []}),
        );
    };
    let (parts, _) = request.into_parts();
    let forward = Forward {
        protocol: Protocol::Http,
        model: &route.model,
        method: Method::GET,
        path: "/v2",
        headers: parts.headers,
        body: Payload::Whole(Vec::new()),
        started,
    };
    gateway
        .forward(forward)
        .await
        .unwrap_or_else(|error| forward_failure(&error))
}

/// `/v2/repository/index` from discovery; load and unload refused.
async fn repository(gateway: &Gateway, request: Request<Incoming>) -> Response<Reply> {
    let (parts, body) = request.into_parts();
    let path = parts.uri.path().trim_end_matches('/').to_string();
    if path.ends_with("/load") || path.ends_with("/unload") {
        return error_json(
            StatusCode::FORBIDDEN,
            "models are loaded and unloaded by their InferenceModel objects, not through the gateway: \
             create, change or delete the InferenceModel (kubectl apply / delete)",
        );
    }
    if path != "/v2/repository/index" {
        return error_json(StatusCode::NOT_FOUND, &format!("no such endpoint: {path}"));
    }
    if parts.method != Method::POST {
        return error_json(
            StatusCode::METHOD_NOT_ALLOWED,
            "the repository index is a POST, as in KServe v2",
        );
    }
    let mut charge = gateway.charge();
    let limits = gateway.limits.control_body();
    let chunks = match read_while(body, limits, &mut charge, |_, _| true).await {
        Ok((chunks, _)) => chunks,
        Err(error) => return read_failure(gateway, &error),
    };
    let body = chunks.concat();
    let ready_only = if body.iter().all(u8::is_ascii_whitespace) {
        false
    } else {
        match serde_json::from_slice::<serde_json::Value>(&body) {
            Ok(asked) => asked.get("ready").and_then(serde_json::Value::as_bool).unwrap_or(false),
            Err(error) => {
                return error_json(
                    StatusCode::BAD_REQUEST,
                    &format!("the repository index request is not JSON: {error}"),
                );
            }
        }
    };
    // Only the namespaces the request's token opens.
    let models: Vec<serde_json::Value> = gateway
        .index(&parts.headers)
        .into_iter()
        .filter(|entry| entry.ready || !ready_only)
        .map(|entry| {
            json!({
                "name": entry.name,
                "version": "",
                "state": if entry.ready { "READY" } else { "UNAVAILABLE" },
                "reason": entry.reason,
            })
        })
        .collect();
    json_reply(StatusCode::OK, &serde_json::Value::Array(models))
}

/// Bad requests are counted without a model label: the name in them is the
/// client's text, not yet a model.
fn read_failure(gateway: &Gateway, error: &ReadError) -> Response<Reply> {
    read_failure_as(gateway, error, Style::Kserve)
}

fn read_failure_as(gateway: &Gateway, error: &ReadError, style: Style) -> Response<Reply> {
    let (status, failure) = match error {
        ReadError::TooLarge { .. } => (StatusCode::PAYLOAD_TOO_LARGE, Failure::BadRequest),
        ReadError::OverBudget(_) => (StatusCode::SERVICE_UNAVAILABLE, Failure::Overloaded),
        ReadError::TimedOut { .. } => (StatusCode::REQUEST_TIMEOUT, Failure::BadRequest),
        ReadError::Client(_) => (StatusCode::BAD_REQUEST, Failure::BadRequest),
    };
    gateway.metrics.failed("", failure);
    style.error(status, &error.to_string())
}

/// A request refused before it was read further: 401 with a bearer
/// challenge when it may not reach the model, else as if routing had
/// failed (counted by [`Gateway::admit`]).
fn refusal(refused: Refused) -> Response<Reply> {
    refusal_as(refused, Style::Kserve)
}

fn refusal_as(refused: Refused, style: Style) -> Response<Reply> {
    match refused {
        Refused::Unauthorized(error) => {
            let mut response = style.error(StatusCode::UNAUTHORIZED, &error.to_string());
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            response
        }
        Refused::Route(error) => forward_failure_as(&ForwardError::Route(error), style),
    }
}

fn forward_failure(error: &ForwardError) -> Response<Reply> {
    forward_failure_as(error, Style::Kserve)
}

fn forward_failure_as(error: &ForwardError, style: Style) -> Response<Reply> {
    let status = match error {
        ForwardError::Route(RouteError::Unknown(_)) => StatusCode::NOT_FOUND,
        ForwardError::Route(RouteError::Ambiguous { .. }) => StatusCode::BAD_REQUEST,
        ForwardError::Route(RouteError::NoReadyEndpoints { .. })
        | ForwardError::Waking(_)
        | ForwardError::Unreachable { .. } => StatusCode::SERVICE_UNAVAILABLE,
        ForwardError::Upstream { .. } => StatusCode::BAD_GATEWAY,
    };
    style.error(status, &error.to_string())
}

/// Which API's error body a refusal takes: the OpenAI routes' clients
/// read OpenAI's error object.
#[derive(Clone, Copy)]
enum Style {
    Kserve,
    OpenAi,
}

impl Style {
    fn error(self, status: StatusCode, text: &str) -> Response<Reply> {
        match self {
            Style::Kserve => error_json(status, text),
            Style::OpenAi => openai::error_reply(status, text, None),
        }
    }
}

/// KServe v2's error body: `{"error": "..."}`.
fn error_json(status: StatusCode, text: &str) -> Response<Reply> {
    json_reply(status, &json!({ "error": text }))
}

fn json_reply(status: StatusCode, value: &serde_json::Value) -> Response<Reply> {
    let mut response = Response::new(Reply::data(value.to_string()));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_qualified_model_segment_becomes_the_plain_name() {
        assert_eq!(unqualified("/v2/models/ml%2Fresnet/infer"), "/v2/models/resnet/infer");
        assert_eq!(unqualified("/v2/models/ml%2fresnet"), "/v2/models/resnet");
        assert_eq!(
            unqualified("/v2/models/ml%2Fresnet/versions/2/infer?x=1"),
            "/v2/models/resnet/versions/2/infer?x=1"
        );
        assert_eq!(unqualified("/v2/models/resnet/infer"), "/v2/models/resnet/infer");
        assert_eq!(unqualified("/v2/health/ready"), "/v2/health/ready");
    }
}
