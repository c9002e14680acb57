//! nereid-echo's HTTP side: bare hyper (HTTP/1.1), no framework, so the
//! baseline measures the transport and the binary-extension framing, not
//! a router.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http::header::CONTENT_TYPE;
use http::{HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::binary_ext::{self, HEADER_LENGTH};
use crate::echo::model::{EchoModel, VERSION};

/// The largest request body accepted (the gRPC side's message limit).
const MAX_BODY: usize = 1 << 30;

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Route<'a> {
    Health,
    ModelReady,
    Metadata(&'a str),
    Infer(&'a str),
    NotFound,
}

/// Maps method and path to a route; `/versions/{v}` is accepted and ignored.
pub fn route<'a>(method: &Method, path: &'a str) -> Route<'a> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (get, post) = (method == Method::GET, method == Method::POST);
    match parts.as_slice() {
        ["v2", "health", "ready" | "live"] if get => Route::Health,
        ["v2", "models", m] | ["v2", "models", m, "versions", _] if get => Route::Metadata(m),
        ["v2", "models", _, "ready"] | ["v2", "models", _, "versions", _, "ready"] if get => Route::ModelReady,
        ["v2", "models", m, "infer"] | ["v2", "models", m, "versions", _, "infer"] if post => Route::Infer(m),
        _ => Route::NotFound,
    }
}

fn response(status: StatusCode, body: Bytes) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    response(status, serde_json::json!({ "error": message }).to_string().into())
}

async fn handle(model: Arc<EchoModel>, request: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = request.into_parts();
    let answer = match route(&parts.method, parts.uri.path()) {
        Route::Health | Route::ModelReady => response(StatusCode::OK, Bytes::new()),
        Route::Metadata(name) => response(StatusCode::OK, model.metadata_json(name).to_string().into()),
        Route::NotFound => error(StatusCode::NOT_FOUND, "not found"),
        Route::Infer(name) => {
            let header_len = match binary_ext::parse_header_len(parts.headers.get(HEADER_LENGTH).map(|v| v.as_bytes()))
            {
                Ok(n) => n,
                Err(e) => return Ok(error(StatusCode::BAD_REQUEST, &e.to_string())),
            };
            let body = match Limited::new(body, MAX_BODY).collect().await {
                Ok(b) => b.to_bytes(),
                Err(e) => return Ok(error(StatusCode::BAD_REQUEST, &e.to_string())),
            };
            let echoed = binary_ext::decode_request(&body, header_len)
                .and_then(|req| binary_ext::encode_echo_response(name, VERSION, req, |i| model.output_name(i)));
            match echoed {
                Ok(enc) => {
                    let mut r = response(StatusCode::OK, enc.body);
                    if let Some(n) = enc.header_len {
                        r.headers_mut().insert(HEADER_LENGTH, HeaderValue::from(n));
                    }
                    r
                }
                Err(e) => error(StatusCode::BAD_REQUEST, &e.to_string()),
            }
        }
    };
    Ok(answer)
}

/// Serves until `shutdown`, then lets each connection finish its request.
pub async fn serve(listener: TcpListener, model: Arc<EchoModel>, shutdown: CancellationToken) {
    let connections = TaskTracker::new();
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Typically EMFILE: back off rather than spin.
                eprintln!("nereid-echo: accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let model = model.clone();
        let shutdown = shutdown.clone();
        connections.spawn(async move {
            let service = service_fn(move |req| handle(model.clone(), req));
            let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                () = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
    connections.close();
    connections.wait().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route(&Method::GET, "/v2/health/ready"), Route::Health);
        assert_eq!(route(&Method::GET, "/v2/models/m"), Route::Metadata("m"));
        assert_eq!(route(&Method::GET, "/v2/models/m/versions/1"), Route::Metadata("m"));
        assert_eq!(route(&Method::GET, "/v2/models/m/ready"), Route::ModelReady);
        assert_eq!(route(&Method::POST, "/v2/models/m/infer"), Route::Infer("m"));
        assert_eq!(route(&Method::POST, "/v2/models/m/versions/2/infer"), Route::Infer("m"));
        assert_eq!(route(&Method::GET, "/v2/models/m/infer"), Route::NotFound);
        assert_eq!(route(&Method::POST, "/v2/models/m"), Route::NotFound);
        assert_eq!(route(&Method::GET, "/"), Route::NotFound);
    }
}
