//! The `external.metrics.k8s.io/v1beta1` resources: discovery, and the
//! values of one metric for the models a label selector picks.
//!
//! Every request must come through the front proxy ([`super::requestheader`]);
//! reading a metric is then authorised per user ([`super::authorize`]).
//! Errors are Kubernetes `Status` objects, as clients of an API group expect.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use nereid_crds::AutoscalingMetric;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::watch;

use super::authorize::{self, Decision, GROUP, VERSION};
use super::requestheader::User;
use super::selector::Selector;
use super::{ClientCert, Credentials};
use crate::autoscaling::scraper::Board;
use crate::builders::hpa::MODEL_LABEL;

pub struct ApiState {
    pub client: kube::Client,
    pub board: Arc<Board>,
    /// The current request-header settings (they may be reloaded).
    pub credentials: watch::Receiver<Arc<Credentials>>,
    /// The window the figures are computed over, reported with each value.
    pub window_secs: u64,
}

pub fn router(state: Arc<ApiState>) -> Router {
    Router::new()
        .route(&format!("/apis/{GROUP}/{VERSION}"), get(discovery))
        .route(
            &format!("/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{{metric}}"),
            get(values),
        )
        .fallback(|| async { status(StatusCode::NOT_FOUND, "NotFound", "no such resource in this API") })
        .with_state(state)
}

/// The user the front proxy speaks for, if the request comes from it.
fn user(state: &ApiState, request: &Request) -> Option<User> {
    let cert = request.extensions().get::<ClientCert>().and_then(|c| c.0.as_ref());
    state.credentials.borrow().request_header.user(cert, request.headers())
}

fn unauthorized() -> Response {
    status(
        StatusCode::UNAUTHORIZED,
        "Unauthorized",
        "only kube-apiserver's front proxy may call this API (a client certificate from the request-header CA and a \
         user header)",
    )
}

async fn discovery(State(state): State<Arc<ApiState>>, request: Request) -> Response {
    if user(&state, &request).is_none() {
        return unauthorized();
    }
    let resources: Vec<Value> = AutoscalingMetric::ALL
        .into_iter()
        .map(|metric| {
            json!({
                "name": metric.external_name(),
                "singularName": "",
                "namespaced": true,
                "kind": "ExternalMetricValueList",
                "verbs": ["get"],
            })
        })
        .collect();
    axum::Json(json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{GROUP}/{VERSION}"),
        "resources": resources,
    }))
    .into_response()
}

#[derive(Debug, Deserialize)]
struct ValuesQuery {
    #[serde(default, rename = "labelSelector")]
    label_selector: String,
}

async fn values(
    State(state): State<Arc<ApiState>>,
    Path((namespace, metric_name)): Path<(String, String)>,
    Query(query): Query<ValuesQuery>,
    request: Request,
) -> Response {
    let Some(user) = user(&state, &request) else {
        return unauthorized();
    };
    match authorize::review(&state.client, &user, "list", Some(&namespace), &metric_name).await {
        Ok(Decision::Allowed) => {}
        Ok(Decision::Denied(reason)) => {
            let because = if reason.is_empty() {
                String::new()
            } else {
                format!(": {reason}")
            };
            return status(
                StatusCode::FORBIDDEN,
                "Forbidden",
                &format!(
                    "{metric_name}.{GROUP} is forbidden: User \"{}\" cannot list resource \"{metric_name}\" in API \
                     group \"{GROUP}\" in the namespace \"{namespace}\"{because}",
                    user.name
                ),
            );
        }
        Err(error) => {
            tracing::warn!(%error, "SubjectAccessReview failed");
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "cannot check the caller's rights (SubjectAccessReview failed)",
            );
        }
    }
    let Some(metric) = AutoscalingMetric::from_external_name(&metric_name) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!("no external metric {metric_name:?}; this API serves {}", names()),
        );
    };
    let selector = match Selector::parse(&query.label_selector) {
        Ok(selector) => selector,
        Err(message) => return status(StatusCode::BAD_REQUEST, "BadRequest", &message),
    };
    let board = state.board.snapshot();
    let picked: Vec<_> = board
        .iter()
        .filter(|(key, _)| key.namespace == namespace && selector.matches(&[(MODEL_LABEL, &key.model)]))
        .collect();
    if picked.is_empty() {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            &format!(
                "no serving pods of a model matching {:?} in namespace {namespace:?}",
                query.label_selector
            ),
        );
    }
    let timestamp = serde_json::to_value(Time(Timestamp::now())).unwrap_or(Value::Null);
    let mut items = Vec::new();
    for (key, figures) in picked {
        let Some(value) = figures.value(metric) else {
            let why = if metric == AutoscalingMetric::GpuUtilization && figures.scraped_pods > 0 {
                "its pods report no GPU".to_string()
            } else {
                format!("none of its {} ready pods answered /metrics", figures.ready_pods)
            };
            return status(
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                &format!("no {metric_name} for model {:?}: {why}", key.model),
            );
        };
        items.push(json!({
            "metricName": metric_name,
            "metricLabels": {MODEL_LABEL: key.model},
            "timestamp": timestamp,
            "window": state.window_secs,
            "value": quantity(value),
        }));
    }
    axum::Json(json!({
        "kind": "ExternalMetricValueList",
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "metadata": {},
        "items": items,
    }))
    .into_response()
}

fn names() -> String {
    AutoscalingMetric::ALL.map(|m| m.external_name()).join(", ")
}

/// A figure as a Kubernetes quantity, to the thousandth (`1234567m`).
pub fn quantity(value: f64) -> String {
    let milli = (value * 1000.0).round();
    if !milli.is_finite() || milli <= 0.0 {
        return "0".into();
    }
    let milli = milli.min(i64::MAX as f64) as i64;
    if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    }
}

/// A `metav1.Status` failure.
fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_whole_or_milli() {
        assert_eq!(quantity(0.0), "0");
        assert_eq!(quantity(-3.0), "0");
        assert_eq!(quantity(f64::NAN), "0");
        assert_eq!(quantity(1500.0), "1500");
        assert_eq!(quantity(12.3456), "12346m");
    }
}
