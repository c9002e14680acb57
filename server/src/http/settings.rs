//! Triton's logging and trace extensions over HTTP: read and change the
//! settings while the server runs.

use std::collections::HashMap;

use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::HeaderMap;
use serde_json::{Value, json};

use super::control_json::{self, Kind, Members};
use super::repository::control_body;
use super::{AppState, HandlerResult};
use crate::error::Error;
use crate::local_control;
use crate::logging::LogSettings;
use crate::parameter::Parameter;
use crate::restricted_api::ApiGroup;
use crate::trace::settings::{Change as TraceChange, Effective as TraceEffective};
use crate::transport::Peer;

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

/// Refuses a change (of settings, of shared-memory regions) from a client
/// this server does not take it from (see [`crate::local_control`]).
pub(super) fn check_update(s: &AppState, what: &str, group: ApiGroup, peer: Option<&Peer>) -> Result<(), Error> {
    let restricted = s.options.restricted.restriction(group).is_some();
    s.options.local_control.check(what, restricted, peer)
}

pub(super) async fn update_log_settings(
    State(s): State<AppState>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    check_update(&s, local_control::LOG_SETTINGS, ApiGroup::Logging, peer.as_deref())?;
    let body = control_body(&s, &headers, body).await?;
    let changes = settings_object(&body, "the log settings must be a JSON object")?;
    let mut parsed = Vec::with_capacity(changes.0.len());
    for (key, value) in changes.0 {
        let shown = control_json::shown(value);
        let value = match control_json::kind(value) {
            Kind::Bool => control_json::as_bool(value).map(Parameter::Bool),
            Kind::String => control_json::as_string(value).map(Parameter::String),
            Kind::Number => match control_json::as_i64(value) {
                Some(i) => Some(Parameter::Int(i)),
                None => {
                    return Err(Error::invalid(format!("log setting '{key}' must be an integer, got {shown}")).into());
                }
            },
            _ => None,
        };
        let Some(value) = value else {
            return Err(Error::invalid(format!("log setting '{key}' has an unsupported value {shown}")).into());
        };
        parsed.push((key.into_owned(), value));
    }
    let settings = s.server.update_log_settings(&parsed)?;
    Ok(axum::Json(log_settings_json(&settings)).into_response())
}

/// A settings body's changes: a JSON object, or `refusal`.
fn settings_object<'a>(body: &'a [u8], refusal: &str) -> Result<Members<'a>, Error> {
    let trimmed = body.trim_ascii_start();
    if !trimmed.is_empty() && trimmed[0] != b'{' {
        return Err(Error::invalid(refusal));
    }
    Members::of_body(body)
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
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    check_update(&s, local_control::TRACE_SETTINGS, ApiGroup::Trace, peer.as_deref())?;
    let model = p.get("model").map(String::as_str);
    let body = control_body(&s, &headers, body).await?;
    let changes = settings_object(&body, "the trace settings must be a JSON object")?;
    let mut parsed = Vec::with_capacity(changes.0.len());
    for (key, value) in changes.0 {
        let change = match control_json::kind(value) {
            Kind::Null => Some(TraceChange::Clear),
            Kind::String => control_json::as_string(value).map(|text| TraceChange::Set(vec![text])),
            Kind::Array => match control_json::as_strings(value) {
                Some(items) => Some(TraceChange::Set(items)),
                None => {
                    return Err(Error::invalid(format!(
                        "trace setting '{key}' must hold at most {} strings, got {}",
                        control_json::MAX_LIST,
                        control_json::shown(value)
                    ))
                    .into());
                }
            },
            _ => None,
        };
        let Some(change) = change else {
            return Err(Error::invalid(format!(
                "trace setting '{key}' must be a string, a list of strings or null, got {}",
                control_json::shown(value)
            ))
            .into());
        };
        parsed.push((key.into_owned(), change));
    }
    let settings = s.server.update_trace_settings(model, &parsed)?;
    Ok(axum::Json(trace_settings_json(&settings)).into_response())
}
