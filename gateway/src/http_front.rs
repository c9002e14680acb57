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
//! The OpenAI API's completions and chat completions are routed by their
//! body's `model` (`namespace/name` names another namespace, and the pod
//! gets the plain name); `/v1/models` lists the models the request may
//! reach, from discovery, as the repository index does.
//!
//! Only a model's data plane is forwarded (metadata, ready, config, stats,
//! infer, generate, generate_stream: [`model_name::ModelCall`]), as on the
//! gRPC port; Triton's endpoints about one server (trace and log settings,
//! shared memory) are refused with 403, anything else with 404, both with
//! KServe's `{"error": "..."}`.

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
        HttpRoute::OpenAi(OpenAiCall::Models) => openai_models(&gateway, &request),
        HttpRoute::OpenAiModel { name } => openai_model(&gateway, &request, &name),
        HttpRoute::OpenAi(OpenAiCall::Generate) => openai_generate(&gateway, request, started).await,
    })
}

/// `GET /v1/models`: the ready models the request may reach (the gateway
/// cannot tell text models from others: a pod's own list has only those).
fn openai_models(gateway: &Gateway, request: &Request<Incoming>) -> Response<Reply> {
    let data: Vec<serde_json::Value> = gateway
        .index(request.headers())
        .into_iter()
        .filter(|entry| entry.ready)
        .map(|entry| json!({"id": entry.name, "object": "model", "created": 0, "owned_by": "nereid"}))
        .collect();
    json_reply(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// `GET /v1/models/{id}`: the model when it is ready and the request may
/// reach it, by its plain name or as `namespace/name`.
fn openai_model(gateway: &Gateway, request: &Request<Incoming>, id: &str) -> Response<Reply> {
    let found = gateway.index(request.headers()).into_iter().any(|entry| {
        let plain = entry.name.rsplit('/').next().unwrap_or(&entry.name);
        entry.ready
            && (entry.name == id
                || id
                    .split_once('/')
                    .is_some_and(|(ns, name)| ns == entry.namespace && name == plain))
    });
    match found {
        true => json_reply(
            StatusCode::OK,
            &json!({"id": id, "object": "model", "created": 0, "owned_by": "nereid"}),
        ),
        false => openai_error(
            StatusCode::NOT_FOUND,
            &format!("The model '{id}' does not exist"),
            Some("model"),
        ),
    }
}

/// The body's `model`, read straight from its chunks: the rest of the JSON
/// (a prompt may be megabytes) is skipped, never built or copied.
fn model_of(chunks: &[bytes::Bytes]) -> serde_json::Result<Option<String>> {
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<String>,
    }
    let reader = Chunks { rest: chunks, at: 0 };
    serde_json::from_reader::<_, Named>(std::io::BufReader::new(reader)).map(|named| named.model)
}

/// `body` with its `model` replaced: each other member kept as its raw
/// text, so it costs a copy of the body, not a tree of its values.
fn with_model(body: &[u8], model: &str) -> serde_json::Result<bytes::Bytes> {
    let mut members: std::collections::BTreeMap<String, &serde_json::value::RawValue> = serde_json::from_slice(body)?;
    let name = serde_json::value::to_raw_value(model)?;
    members.insert("model".to_string(), &name);
    serde_json::to_vec(&members).map(bytes::Bytes::from)
}

/// The body's chunks as one reader.
struct Chunks<'a> {
    rest: &'a [bytes::Bytes],
    at: usize,
}

impl std::io::Read for Chunks<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(first) = self.rest.first() {
            let left = &first[self.at..];
            if left.is_empty() {
                self.rest = &self.rest[1..];
                self.at = 0;
                continue;
            }
            let n = left.len().min(buf.len());
            buf[..n].copy_from_slice(&left[..n]);
            self.at += n;
            return Ok(n);
        }
        Ok(0)
    }
}

/// The OpenAI API's error body.
fn openai_error(status: StatusCode, message: &str, param: Option<&str>) -> Response<Reply> {
    let (kind, code) = match status {
        StatusCode::NOT_FOUND => ("invalid_request_error", Some("model_not_found")),
        StatusCode::UNAUTHORIZED => ("authentication_error", None),
        s if s.is_server_error() => ("server_error", None),
        _ => ("invalid_request_error", None),
    };
    json_reply(
        status,
        &json!({"error": {"message": message, "type": kind, "param": param, "code": code}}),
    )
}

/// A completion or chat completion: read whole (it is JSON text), routed by
/// its `model`, forwarded as it came unless that name had to lose its
/// namespace.
async fn openai_generate(gateway: &Gateway, request: Request<Incoming>, started: Instant) -> Response<Reply> {
    let (parts, body) = request.into_parts();
    if parts.method != Method::POST {
        return openai_error(StatusCode::METHOD_NOT_ALLOWED, "completions are POST requests", None);
    }
    let limits = gateway.limits.body();
    let mut charge = gateway.charge();
    let chunks = match read_while(body, limits, &mut charge, |_, _| true).await {
        Ok((chunks, _)) => chunks,
        Err(error) => return read_failure_as(gateway, &error, Style::OpenAi),
    };
    let name = match model_of(&chunks) {
        Ok(Some(name)) if !name.is_empty() => name,
        Ok(_) => {
            gateway.metrics.failed("", Failure::BadRequest);
            return openai_error(StatusCode::BAD_REQUEST, "the request names no 'model'", Some("model"));
        }
        Err(error) => {
            gateway.metrics.failed("", Failure::BadRequest);
            return openai_error(
                StatusCode::BAD_REQUEST,
                &format!("the request body is not JSON: {error}"),
                None,
            );
        }
    };
    let namespace = parts.headers.get(NAMESPACE_HEADER).and_then(|v| v.to_str().ok());
    let requested = match namespace {
        Some(namespace) if !name.contains('/') => format!("{namespace}/{name}"),
        _ => name.clone(),
    };
    let requested = match gateway.admit(requested, &parts.headers) {
        Ok(requested) => requested,
        Err(refused) => return refusal_as(refused, Style::OpenAi),
    };
    // The pod knows the model by its plain name.
    let chunks = match name.split_once('/') {
        Some((_, plain)) => match with_model(&chunks.concat(), plain) {
            Ok(body) => vec![body],
            Err(error) => {
                return openai_error(
                    StatusCode::BAD_REQUEST,
                    &format!("the request body is not JSON: {error}"),
                    None,
                );
            }
        },
        None => chunks,
    };
    let mut headers = parts.headers;
    if name.contains('/') {
        let length: usize = chunks.iter().map(bytes::Bytes::len).sum();
        headers.insert(header::CONTENT_LENGTH, HeaderValue::from(length));
        headers.remove(header::CONTENT_ENCODING);
    }
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let forward = Forward {
        protocol: Protocol::Http,
        model: &requested,
        method: parts.method,
        path,
        headers,
        body: Payload::Whole(chunks),
        started,
    };
    gateway
        .forward(forward)
        .await
        .unwrap_or_else(|error| forward_failure_as(&error, Style::OpenAi))
}

async fn per_model(gateway: &Gateway, request: Request<Incoming>, name: String, started: Instant) -> Response<Reply> {
    let (parts, body) = request.into_parts();
    let namespace = parts.headers.get(NAMESPACE_HEADER).and_then(|v| v.to_str().ok());
    let requested = match namespace {
        Some(namespace) if !name.contains('/') => format!("{namespace}/{name}"),
        _ => name,
    };
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
        ForwardError::Route(RouteError::NoReadyEndpoints { .. }) | ForwardError::Unreachable { .. } => {
            StatusCode::SERVICE_UNAVAILABLE
        }
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
            Style::OpenAi => openai_error(status, text, None),
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
    fn an_openai_body_is_routed_by_its_model_and_renamed_without_a_tree() {
        let chunks = [
            bytes::Bytes::from_static(b"{\"prompt\": \"long\", \"mod"),
            bytes::Bytes::from_static(b"el\": \"ml/llm\", \"n\": [1, 2]}"),
        ];
        assert_eq!(model_of(&chunks).unwrap().as_deref(), Some("ml/llm"));
        assert_eq!(model_of(&[bytes::Bytes::from_static(b"{}")]).unwrap(), None);
        assert!(model_of(&[bytes::Bytes::from_static(b"{x")]).is_err());
        let renamed: serde_json::Value = serde_json::from_slice(&with_model(&chunks.concat(), "llm").unwrap()).unwrap();
        assert_eq!(
            renamed,
            serde_json::json!({"prompt": "long", "model": "llm", "n": [1, 2]})
        );
    }

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
