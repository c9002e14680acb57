//! The metrics port: `GET /metrics`, Prometheus' text format.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::get;
use http::header;

use nereid_core::metrics::Metrics;

pub fn router(metrics: Arc<Metrics>) -> Router {
    Router::new().route("/metrics", get(scrape)).with_state(metrics)
}

async fn scrape(State(metrics): State<Arc<Metrics>>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
        metrics.encode(),
    )
}
