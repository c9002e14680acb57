//! Triton's model repository extension over HTTP: index, load, unload.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use http::{HeaderMap, StatusCode};
use serde_json::Value;

use super::{AppState, HandlerResult, body};
use crate::error::Error;

/// A small control-API body (index, load, unload) as JSON; empty is `{}`.
pub(super) async fn control_body(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Value, Error> {
    let mut reservation = s.options.budget.reservation();
    let body = body::read(body, headers, s.options.body, &mut reservation).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_slice(&body).map_err(|e| Error::invalid(format!("failed to parse the request JSON buffer: {e}")))
}

pub(super) async fn repository_index(State(s): State<AppState>, headers: HeaderMap, body: Body) -> HandlerResult {
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

pub(super) async fn load(
    State(s): State<AppState>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    let mut config = None;
    for (key, value) in body_parameters(&s, &headers, body).await? {
        match (key.as_str(), value) {
            ("config", Value::String(text)) => {
                config = Some(s.server.config_override(&model, &text)?);
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

pub(super) async fn unload(
    State(s): State<AppState>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    for (key, value) in body_parameters(&s, &headers, body).await? {
        if key != "unload_dependents" || !value.is_boolean() {
            return Err(Error::invalid(format!("Unrecognized unload parameter '{key}' with value {value}")).into());
        }
    }
    s.server.unload_model(&model).await?;
    Ok(StatusCode::OK.into_response())
}
