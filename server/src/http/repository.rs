//! Triton's model repository extension over HTTP: index, load, unload.

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::IntoResponse;
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use serde_json::Value;

use super::control_json::{self, Kind, MAX_CONTROL_BODY, Members};
use super::{AppState, HandlerResult, body};
use crate::error::Error;

/// A control-API body (index, load, unload, settings, shared-memory
/// registration), read within [`MAX_CONTROL_BODY`] and the memory budget;
/// parse it with [`Members::of_body`].
pub(super) async fn control_body(s: &AppState, headers: &HeaderMap, body: Body) -> Result<Bytes, Error> {
    let mut reservation = s.options.budget.reservation();
    let limits = body::BodyLimits {
        max_size: s.options.body.max_size.min(MAX_CONTROL_BODY),
        kind: body::SizeLimit::Control,
        ..s.options.body
    };
    body::read(body, headers, limits, &mut reservation).await
}

pub(super) async fn repository_index(State(s): State<AppState>, headers: HeaderMap, body: Body) -> HandlerResult {
    let body = control_body(&s, &headers, body).await?;
    let ready_only = match Members::of_body(&body)?.get("ready") {
        None => false,
        Some(value) => control_json::as_bool(value)
            .ok_or_else(|| Error::invalid("Invalid value for 'ready': expected a boolean"))?,
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
fn body_parameters(body: &[u8]) -> Result<Members<'_>, Error> {
    match Members::of_body(body)?.get("parameters") {
        None => Ok(Members::default()),
        Some(parameters) => Members::of_value("parameters", parameters),
    }
}

pub(super) async fn load(
    State(s): State<AppState>,
    Path(model): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    let body = control_body(&s, &headers, body).await?;
    let mut config = None;
    for (key, value) in body_parameters(&body)?.0 {
        match key.as_ref() {
            "config" => {
                let text = control_json::as_string(value)
                    .ok_or_else(|| Error::invalid("load parameter 'config' must be a JSON string"))?;
                config = Some(s.server.config_override(&model, &text)?);
            }
            k if k.starts_with("file:") => {
                return Err(
                    Error::unsupported("model file overrides ('file:' load parameters) are not supported").into(),
                );
            }
            k => {
                let shown = control_json::shown(value);
                return Err(Error::invalid(format!("Unrecognized load parameter '{k}' with value {shown}")).into());
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
    let body = control_body(&s, &headers, body).await?;
    for (key, value) in body_parameters(&body)?.0 {
        if key != "unload_dependents" || control_json::kind(value) != Kind::Bool {
            let shown = control_json::shown(value);
            return Err(Error::invalid(format!("Unrecognized unload parameter '{key}' with value {shown}")).into());
        }
    }
    s.server.unload_model(&model).await?;
    Ok(StatusCode::OK.into_response())
}
