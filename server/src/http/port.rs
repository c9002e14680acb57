//! The HTTP port's service: infer requests straight to their handler,
//! every other request through the axum router.
//!
//! Infer is nearly all of a busy server's traffic, and for a small tensor
//! the framework around the handler cost as much as the handler: axum's
//! routing stores the matched path and the path parameters in the
//! request's extensions, its boxed and cloned services and response
//! conversions allocate, and a tower layer boxed the future and the body
//! once more to count the request in flight (the profile is in
//! docs/benchmarks-log.md, entry 10). Here one match on the path finds the
//! model, and the answer's body goes to hyper as it is. Everything else
//! (health, metadata, repository, settings) keeps the router, where a few
//! allocations do not matter; a model name with percent-escapes goes there
//! too, so that axum decodes it exactly as it does for every other route.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::Router;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{Method, Request};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use prometheus::IntGauge;
use tower::ServiceExt;

use super::error::HttpError;
use super::infer::{self, ReservedBody};
use super::{AppState, check_restricted};
use crate::in_flight::{Guard, InFlight};
use crate::restricted_api::ApiGroup;

/// The service hyper runs for each connection of the HTTP port.
#[derive(Clone)]
pub struct PortService {
    state: AppState,
    router: Router,
    in_flight: Arc<InFlight>,
    /// The front end's `nereid_requests_in_flight` gauge.
    gauge: IntGauge,
}

impl PortService {
    pub(super) fn new(state: AppState, router: Router, in_flight: Arc<InFlight>, gauge: IntGauge) -> Self {
        PortService {
            state,
            router,
            in_flight,
            gauge,
        }
    }
}

type Answered = Result<http::Response<PortBody>, Infallible>;

impl hyper::service::Service<Request<Incoming>> for PortService {
    type Response = http::Response<PortBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Answered> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        // Counted from here until the answer's body has been sent (or dropped).
        let guard = self.in_flight.enter(&self.gauge);
        if request.method() == Method::POST && infer_path(request.uri().path()).is_some() {
            let state = self.state.clone();
            return Box::pin(async move {
                let (parts, body) = request.into_parts();
                let (model, version) = infer_path(parts.uri.path()).expect("the path was matched before");
                let headers = &parts.headers;
                let answered = match check_restricted(&state.options.restricted, ApiGroup::Inference, headers) {
                    Ok(()) => infer::infer(&state, model, version, headers, body).await,
                    Err(e) => Err(e),
                };
                Ok(match answered {
                    Ok(answer) => {
                        let mut response = http::Response::new(PortBody::answer(answer.body, guard));
                        *response.headers_mut() = answer.headers;
                        response
                    }
                    Err(e) => routed(HttpError(e).into_response(), guard),
                })
            });
        }
        let router = self.router.clone();
        Box::pin(async move {
            let response = router.oneshot(request).await.unwrap_or_else(|never| match never {});
            Ok(routed(response, guard))
        })
    }
}

fn routed(response: Response, guard: Guard) -> http::Response<PortBody> {
    response.map(|body| PortBody {
        inner: Inner::Routed(body),
        _guard: guard,
    })
}

/// The model name and version ("" when absent) of an infer path,
/// `/v2/models/{model}[/versions/{version}]/infer`; `None` for any other
/// path, and for a name or version with percent-escapes, which the router
/// decodes.
pub(super) fn infer_path(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix("/v2/models/")?.strip_suffix("/infer")?;
    let (model, version) = match rest.split_once('/') {
        None => (rest, ""),
        Some((model, tail)) => {
            let version = tail.strip_prefix("versions/")?;
            if version.is_empty() || version.contains('/') {
                return None;
            }
            (model, version)
        }
    };
    if model.is_empty() || model.contains('%') || version.contains('%') {
        return None;
    }
    Some((model, version))
}

/// An answer's body on its way to hyper: an infer answer as it is, or
/// whatever the router made. Holds the request's in-flight count.
pub struct PortBody {
    inner: Inner,
    _guard: Guard,
}

enum Inner {
    Answer(ReservedBody),
    Routed(axum::body::Body),
}

impl PortBody {
    fn answer(body: ReservedBody, guard: Guard) -> Self {
        PortBody {
            inner: Inner::Answer(body),
            _guard: guard,
        }
    }
}

impl Body for PortBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        match &mut self.get_mut().inner {
            Inner::Answer(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|frame| frame.map(|f| f.map_err(|never| match never {}))),
            Inner::Routed(body) => Pin::new(body).poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Answer(body) => body.is_end_stream(),
            Inner::Routed(body) => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Answer(body) => body.size_hint(),
            Inner::Routed(body) => body.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_model_of_an_infer_path() {
        assert_eq!(infer_path("/v2/models/simple/infer"), Some(("simple", "")));
        assert_eq!(infer_path("/v2/models/simple/versions/3/infer"), Some(("simple", "3")));
        // The version is checked by the handler, in Triton's words.
        assert_eq!(infer_path("/v2/models/m/versions/x/infer"), Some(("m", "x")));
    }

    #[test]
    fn leaves_every_other_path_to_the_router() {
        for path in [
            "/v2/models/simple",
            "/v2/models/simple/ready",
            "/v2/models//infer",
            "/v2/models/simple/infer/",
            "/v2/models/simple/versions//infer",
            "/v2/models/simple/versions/1/2/infer",
            "/v2/models/simple/other/1/infer",
            "/v2/models/a/b/infer",
            "/v2/models/my%20model/infer",
            "/v2/models/m/versions/%31/infer",
            "/v2/models/infer",
            "/v1/models/simple/infer",
            "/v2/models/simple/generate",
        ] {
            assert_eq!(infer_path(path), None, "{path}");
        }
    }
}
