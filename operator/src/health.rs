//! `/healthz`, `/readyz` and `/metrics` for the operator itself.
//!
//! Live while the process runs; ready once it is watching the cluster (as
//! the leader, or as a standby waiting for the lease, which is a healthy
//! state for a standby).

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::metrics::Metrics;

#[derive(Clone)]
struct HealthState {
    metrics: Arc<Metrics>,
    ready: Arc<AtomicBool>,
}

pub fn router(metrics: Arc<Metrics>, ready: Arc<AtomicBool>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(s): State<HealthState>| async move {
                if s.ready.load(Ordering::Acquire) {
                    (StatusCode::OK, "ready")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting")
                }
            }),
        )
        .route(
            "/metrics",
            get(|State(s): State<HealthState>| async move { s.metrics.render() }),
        )
        .with_state(HealthState { metrics, ready })
}

pub async fn serve(
    address: SocketAddr,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::bind(address).await?;
    axum::serve(listener, router).with_graceful_shutdown(shutdown).await
}
