//! The metrics port: `/metrics` for Prometheus, and `/healthz` and
//! `/readyz` for the kubelet's probes (ready once discovery has listed the
//! cluster's models, so a new replica takes no traffic it would answer
//! with "unknown model", and not ready again once it is shutting down).

use std::convert::Infallible;
use std::sync::Arc;

use http::{HeaderValue, Request, Response, StatusCode, header};
use hyper::body::Incoming;

use crate::reply_body::Reply;
use crate::state::Gateway;

pub async fn serve(gateway: Arc<Gateway>, request: Request<Incoming>) -> Result<Response<Reply>, Infallible> {
    let mut response = match request.uri().path() {
        "/metrics" => {
            let text = gateway.metrics.render(&gateway.router, gateway.budget.held());
            let mut response = Response::new(Reply::data(text));
            response.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4"),
            );
            response
        }
        "/healthz" => Response::new(Reply::data("ok")),
        "/readyz" if gateway.ready() => Response::new(Reply::data("ok")),
        "/readyz" => {
            let why = if gateway.router.synced() {
                "shutting down"
            } else {
                "discovery has not listed the models yet"
            };
            let mut response = Response::new(Reply::data(why));
            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
            response
        }
        _ => {
            let mut response = Response::new(Reply::data("not found"));
            *response.status_mut() = StatusCode::NOT_FOUND;
            response
        }
    };
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}
