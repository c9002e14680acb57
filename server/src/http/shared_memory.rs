//! Triton's system shared memory extension over HTTP: register, status and
//! unregister of named regions. CUDA shared memory answers Triton's error
//! JSON saying it is not supported.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::repository::control_body;
use super::{AppState, HandlerResult};
use crate::error::Error;

/// `GET /v2/systemsharedmemory[/region/{region}]/status`.
pub(super) async fn status(State(s): State<AppState>, Path(p): Path<HashMap<String, String>>) -> HandlerResult {
    let regions = s.server.shared_memory().status(p.get("region").map(String::as_str))?;
    let rows: Vec<Value> = regions
        .into_iter()
        .map(|r| json!({"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}))
        .collect();
    Ok(axum::Json(Value::Array(rows)).into_response())
}

/// `POST /v2/systemsharedmemory/region/{region}/register` with
/// `{"key": ..., "offset": ..., "byte_size": ...}`.
pub(super) async fn register(
    State(s): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    let region = p.get("region").map_or("", String::as_str);
    let body = control_body(&s, &headers, body).await?;
    let key = body
        .get("key")
        .and_then(Value::as_str)
        .ok_or_else(|| Error::invalid("shared memory register: 'key' must be a string"))?;
    let size = |field: &str, required: bool| -> Result<usize, Error> {
        match body.get(field) {
            None if !required => Ok(0),
            value => value
                .and_then(Value::as_u64)
                .and_then(|v| usize::try_from(v).ok())
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "shared memory register: '{field}' must be a non-negative integer"
                    ))
                }),
        }
    };
    s.server
        .shared_memory()
        .register(region, key, size("offset", false)?, size("byte_size", true)?)?;
    Ok(StatusCode::OK.into_response())
}

/// `POST /v2/systemsharedmemory[/region/{region}]/unregister`.
pub(super) async fn unregister(State(s): State<AppState>, Path(p): Path<HashMap<String, String>>) -> HandlerResult {
    s.server.shared_memory().unregister(p.get("region").map(String::as_str));
    Ok(StatusCode::OK.into_response())
}

/// Every CUDA shared memory route.
pub(super) async fn cuda() -> HandlerResult {
    Err(Error::unsupported("CUDA shared memory is not supported by this server (it has no GPU support yet)").into())
}
