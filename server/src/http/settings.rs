//! Triton's logging and trace extensions over HTTP: read and change the
//! settings while the server runs.

use std::collections::HashMap;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use serde_json::{Value, json};

use super::repository::control_body;
use super::{AppState, HandlerResult};
use crate::error::Error;
use crate::logging::LogSettings;
use crate::parameter::Parameter;
use crate::trace::settings::{Change as TraceChange, Effective as TraceEffective};

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

pub(super) async fn log_settings(State(s): State<AppState>) -> Response {
    axum::Json(log_settings_json(&s.server.log_settings())).into_response()
}

pub(super) async fn update_log_settings(State(s): State<AppState>, headers: HeaderMap, body: Body) -> HandlerResult {
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

pub(super) async fn trace_settings(State(s): State<AppState>, Path(p): Path<HashMap<String, String>>) -> HandlerResult {
    let model = p.get("model").map(String::as_str);
    Ok(axum::Json(trace_settings_json(&s.server.trace_settings(model)?)).into_response())
}

pub(super) async fn update_trace_settings(
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
