//! Triton's shared memory extensions over HTTP: register, status and
//! unregister of named regions, system and CUDA (`shared_memory::cuda`).

use std::collections::HashMap;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use http::{HeaderMap, StatusCode};
use serde_json::{Value, json};

use super::control_json::{self, Members};
use super::repository::control_body;
use super::settings::check_update;
use super::{AppState, HandlerResult};
use crate::error::Error;
use crate::local_control::SHARED_MEMORY;
use crate::restricted_api::ApiGroup;
use crate::transport::Peer;

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
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    check_update(&s, SHARED_MEMORY, ApiGroup::SharedMemory, peer.as_deref())?;
    let region = p.get("region").map_or("", String::as_str);
    let body = control_body(&s, &headers, body).await?;
    let body = Members::of_body(&body)?;
    let key = body
        .get("key")
        .and_then(control_json::as_string)
        .ok_or_else(|| Error::invalid("shared memory register: 'key' must be a string"))?;
    let size = |field: &str, required: bool| -> Result<usize, Error> {
        match body.get(field) {
            None if !required => Ok(0),
            value => value
                .and_then(control_json::as_u64)
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
        .register(region, &key, size("offset", false)?, size("byte_size", true)?)?;
    Ok(StatusCode::OK.into_response())
}

/// `POST /v2/systemsharedmemory[/region/{region}]/unregister`.
pub(super) async fn unregister(
    State(s): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
    peer: Option<Extension<Peer>>,
) -> HandlerResult {
    check_update(&s, SHARED_MEMORY, ApiGroup::SharedMemory, peer.as_deref())?;
    s.server.shared_memory().unregister(p.get("region").map(String::as_str));
    Ok(StatusCode::OK.into_response())
}

/// `GET /v2/cudasharedmemory[/region/{region}]/status`.
pub(super) async fn cuda_status(State(s): State<AppState>, Path(p): Path<HashMap<String, String>>) -> HandlerResult {
    let regions = s
        .server
        .cuda_shared_memory()
        .status(p.get("region").map(String::as_str))?;
    let rows: Vec<Value> = regions
        .into_iter()
        .map(|r| json!({"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size}))
        .collect();
    Ok(axum::Json(Value::Array(rows)).into_response())
}

/// `POST /v2/cudasharedmemory/region/{region}/register` with
/// `{"raw_handle": {"b64": ...}, "device_id": ..., "byte_size": ...}`.
pub(super) async fn cuda_register(
    State(s): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    check_update(&s, SHARED_MEMORY, ApiGroup::SharedMemory, peer.as_deref())?;
    use base64::Engine;
    let region = p.get("region").map_or("", String::as_str);
    let body = control_body(&s, &headers, body).await?;
    let body = Members::of_body(&body)?;
    let handle = body
        .get("raw_handle")
        .ok_or_else(|| Error::invalid("Shared memory register request has no 'raw_handle' field"))?;
    let handle = Members::of_value("raw_handle", handle)?
        .get("b64")
        .and_then(control_json::as_string)
        .and_then(|b64| base64::engine::general_purpose::STANDARD.decode(b64).ok())
        .ok_or_else(|| Error::invalid("'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"))?;
    let number = |field: &str| -> Result<u64, Error> {
        body.get(field).and_then(control_json::as_u64).ok_or_else(|| {
            Error::invalid(format!(
                "shared memory register: '{field}' must be a non-negative integer"
            ))
        })
    };
    let device_id = i64::try_from(number("device_id")?)
        .map_err(|_| Error::invalid("shared memory register: 'device_id' is too large"))?;
    s.server
        .cuda_shared_memory()
        .register(region, &handle, device_id, number("byte_size")?)?;
    Ok(StatusCode::OK.into_response())
}

/// `POST /v2/cudasharedmemory[/region/{region}]/unregister`.
pub(super) async fn cuda_unregister(
    State(s): State<AppState>,
    Path(p): Path<HashMap<String, String>>,
    peer: Option<Extension<Peer>>,
) -> HandlerResult {
    check_update(&s, SHARED_MEMORY, ApiGroup::SharedMemory, peer.as_deref())?;
    s.server
        .cuda_shared_memory()
        .unregister(p.get("region").map(String::as_str));
    Ok(StatusCode::OK.into_response())
}
