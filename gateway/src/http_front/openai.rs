//! The OpenAI API's routes on the HTTP port. Completions and chat
//! completions are read whole (they are JSON text) and routed by their
//! body's `model`: `namespace/name` names another namespace, and the pod
//! gets the plain name. `/v1/models` (and `/v1/models/{id}`) lists the
//! models the request may reach, from discovery, as the repository index
//! does. Errors are OpenAI's error object.

use std::time::Instant;

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use hyper::body::Incoming;
use serde_json::json;

use super::{Style, forward_failure_as, json_reply, qualified, read_failure_as, refusal_as};
use crate::Protocol;
use crate::forward::{Forward, Payload};
use crate::metrics::Failure;
use crate::reply_body::Reply;
use crate::request_body::read_while;
use crate::state::Gateway;

/// `GET /v1/models`: the ready models the request may reach (the gateway
/// cannot tell text models from others: a pod's own list has only those).
pub(super) fn models(gateway: &Gateway, request: &Request<Incoming>) -> Response<Reply> {
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
pub(super) fn model(gateway: &Gateway, request: &Request<Incoming>, id: &str) -> Response<Reply> {
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
        false => error_reply(
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
pub(super) fn error_reply(status: StatusCode, message: &str, param: Option<&str>) -> Response<Reply> {
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
pub(super) async fn generate(gateway: &Gateway, request: Request<Incoming>, started: Instant) -> Response<Reply> {
    let (parts, body) = request.into_parts();
    if parts.method != Method::POST {
        return error_reply(StatusCode::METHOD_NOT_ALLOWED, "completions are POST requests", None);
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
            return error_reply(StatusCode::BAD_REQUEST, "the request names no 'model'", Some("model"));
        }
        Err(error) => {
            gateway.metrics.failed("", Failure::BadRequest);
            return error_reply(
                StatusCode::BAD_REQUEST,
                &format!("the request body is not JSON: {error}"),
                None,
            );
        }
    };
    let requested = match gateway.admit(qualified(name.clone(), &parts.headers), &parts.headers) {
        Ok(requested) => requested,
        Err(refused) => return refusal_as(refused, Style::OpenAi),
    };
    // The pod knows the model by its plain name.
    let chunks = match name.split_once('/') {
        Some((_, plain)) => match with_model(&chunks.concat(), plain) {
            Ok(body) => vec![body],
            Err(error) => {
                return error_reply(
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
}
