//! Sending a request to a pod of its model: an endpoint picked per attempt,
//! the pod's HTTP/2 connection from the [`Pool`], and a retry on another
//! endpoint only when the request was not sent, so a request never runs
//! twice. A request for a model scaled to zero first waits for it to wake
//! ([`crate::activation`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use h2::SendStream;
use http::header::{self, HeaderName};
use http::{HeaderMap, Method, Request, Response, Uri, Version};
use thiserror::Error;

use crate::Protocol;
use crate::activation::{Activation, WakeError};
use crate::h2_body::{H2Body, Next, next_or_reset, send_paced};
use crate::memory_budget::Charge;
use crate::metrics::{Failure, Metrics};
use crate::pool::{self, Pool, SendError, StreamSlot};
use crate::registry::{Address, RouteError};
use crate::reply_body::{Answer, Reply};
use crate::router::{Routed, Router};

/// A request's body as the front end read it.
#[derive(Debug)]
pub enum Payload {
    /// Read whole: can be sent again.
    Whole(Vec<Bytes>),
    /// A stream: sent once, to one pod, for its whole life. Its `head`
    /// (read until it named the model) stays charged to the memory budget
    /// until it has been passed on.
    Streaming {
        head: Vec<Bytes>,
        rest: H2Body,
        charge: Charge,
    },
}

/// One request to forward.
#[derive(Debug)]
pub struct Forward<'a> {
    pub protocol: Protocol,
    /// The model name to resolve (plain or `namespace/name`).
    pub model: &'a str,
    pub method: Method,
    /// The path and query to send, with the model name as the pod knows it.
    pub path: &'a str,
    pub headers: HeaderMap,
    pub body: Payload,
    /// When the request arrived, for the latency histogram.
    pub started: Instant,
}

#[derive(Debug, Error)]
pub enum ForwardError {
    #[error(transparent)]
    Route(#[from] RouteError),
    /// A model scaled to zero that the request could not wait for.
    #[error(transparent)]
    Waking(#[from] WakeError),
    #[error("no endpoint of model {model} could be reached ({attempts} tried); the last said: {last}")]
    Unreachable {
        model: String,
        attempts: usize,
        last: String,
    },
    #[error("the exchange with {endpoint} (model {model}) broke: {error}")]
    Upstream {
        model: String,
        endpoint: String,
        error: String,
    },
}

/// How the gateway reaches pods.
#[derive(Clone, Copy, Debug)]
pub struct UpstreamOptions {
    pub connect_timeout: Duration,
    /// Attempts per request, the first included, when pods cannot be reached.
    pub attempts: usize,
    /// HTTP/2 connections the pool may open to one pod address
    /// (`--max-pod-connections`).
    pub max_pod_connections: usize,
}

pub struct Upstream {
    pool: Pool,
    options: UpstreamOptions,
}

impl Upstream {
    pub fn new(options: UpstreamOptions) -> Self {
        Upstream {
            pool: Pool::new(options.connect_timeout, options.max_pod_connections),
            options,
        }
    }

    /// Sends `request` to a pod of its model and returns the pod's answer,
    /// streaming, or why no pod could take it.
    pub async fn forward(
        &self,
        router: &Arc<Router>,
        metrics: &Arc<Metrics>,
        activation: &Arc<Activation>,
        request: Forward<'_>,
    ) -> Result<Response<Reply>, ForwardError> {
        let Forward {
            protocol,
            model,
            method,
            path,
            mut headers,
            body,
            started,
        } = request;
        strip_hop_by_hop(&mut headers, protocol);
        // The bearer token opened the namespace here (`--namespace-token`);
        // a pod has no use for it, and a pod's logs or a model's code should
        // never see a token that opens other namespaces' models too.
        headers.remove(header::AUTHORIZATION);
        // A whole body is sent from its chunk list (reference counts, not
        // copies), so it can be sent again; a stream goes once, and stays
        // here until an attempt opens a stream for it.
        let (whole, mut stream) = match body {
            Payload::Whole(chunks) => (Some(chunks), None),
            Payload::Streaming { head, rest, charge } => (None, Some((head, rest, charge))),
        };
        let end_of_stream = whole.as_ref().is_some_and(Vec::is_empty);
        let mut tried: Vec<Address> = Vec::new();
        let mut last_error = String::new();
        // The model's full name, once resolved (for errors after retries).
        let mut resolved: Option<Arc<str>> = None;
        // Until when the request may wait for its model to wake from zero,
        // once it has been held (a held request that is routed at all has
        // woken it): counted from when it was first held. A model that has
        // no ready pod again after it woke holds the request again, within
        // the same timeout.
        let mut hold_until = None;
        loop {
            let route = match router.route(model, &tried) {
                Ok(Routed::To(route)) => route,
                // Asleep: held until a pod is ready, then routed again.
                Ok(Routed::Hold(sleeper)) => {
                    let bytes = match (&whole, &stream) {
                        (Some(chunks), _) => chunks.iter().map(Bytes::len).sum(),
                        (None, Some((head, _, _))) => head.iter().map(Bytes::len).sum(),
                        (None, None) => 0,
                    };
                    let deadline = *hold_until.get_or_insert_with(|| sleeper.deadline());
                    if let Err(error) = activation.wait(router, metrics, &sleeper, bytes, deadline).await {
                        metrics.failed(&sleeper.label, Failure::Waking);
                        return Err(error.into());
                    }
                    continue;
                }
                Err(error) if tried.is_empty() => {
                    // A name that found no model is the client's text: it
                    // never becomes a label, or any client could grow the
                    // metrics without bound.
                    match &error {
                        RouteError::NoReadyEndpoints { model, .. } => metrics.failed(model, Failure::NoReadyEndpoints),
                        _ => metrics.failed("", Failure::UnknownModel),
                    }
                    return Err(error.into());
                }
                // Every endpoint was tried.
                Err(_) => {
                    return Err(ForwardError::Unreachable {
                        model: resolved.as_deref().unwrap_or(model).to_string(),
                        attempts: tried.len(),
                        last: last_error,
                    });
                }
            };
            let address = route.address(protocol);
            let last_attempt = tried.len() + 1 >= self.options.attempts;
            let in_flight = route.endpoint.load.start();
            let model_label = Arc::clone(&route.model);
            resolved = Some(Arc::clone(&model_label));
            let upstream = build(&method, address, path, &headers);
            let exchange = match self.pool.open(address, upstream, end_of_stream).await {
                Ok((pending, mut send)) => {
                    // Counts the stream open on its connection until both
                    // the answer and the pump are done with it.
                    let slot = pending.slot();
                    if let Some(chunks) = &whole {
                        send_whole(&mut send, chunks);
                    } else if let Some((head, rest, charge)) = stream.take() {
                        tokio::spawn(pump(Pumped { head, charge }, rest, send, slot.clone()));
                    }
                    pool::answer(pending).await.map(|response| (response, slot))
                }
                Err(error) => Err(error),
            };
            match exchange {
                // A pod that is starting or going away ran nothing of it.
                Ok((response, _))
                    if response.headers().contains_key(nereid_proto::NOT_SERVING_HEADER)
                        && whole.is_some()
                        && !last_attempt =>
                {
                    route.endpoint.load.failed(Instant::now(), router.ejection());
                    metrics.failed(&model_label, Failure::NotServing);
                    last_error = format!("{address}: the server is not serving (starting or shutting down)");
                    tried.push(route.endpoint.address);
                    metrics.retried(&model_label);
                }
                Ok((response, slot)) => {
                    route.endpoint.load.succeeded();
                    if let Some(depth) = queue_depth(response.headers()) {
                        route.endpoint.load.report_queue_depth(depth);
                    }
                    metrics.forwarded(&model_label, &route.endpoint.label, protocol);
                    if hold_until.is_some() {
                        metrics.cold_start(&model_label, protocol, started.elapsed().as_secs_f64());
                    }
                    let (mut parts, body) = response.into_parts();
                    strip_hop_by_hop(&mut parts.headers, protocol);
                    let latency = metrics.duration(&model_label, protocol);
                    let answer = Answer::new(body, in_flight, slot, latency, started);
                    return Ok(Response::from_parts(parts, Reply::Forwarded(answer)));
                }
                Err(error @ (SendError::NotSent(_) | SendError::Busy(_))) => {
                    if matches!(error, SendError::Busy(_)) {
                        // Busy, not broken: no ejection.
                        metrics.failed(&model_label, Failure::Overloaded);
                    } else {
                        route.endpoint.load.failed(Instant::now(), router.ejection());
                        metrics.failed(&model_label, Failure::Connect);
                    }
                    let reason = error.to_string();
                    tracing::debug!(model = %model_label, %address, %reason, "request not sent; trying another pod");
                    last_error = reason;
                    tried.push(route.endpoint.address);
                    if last_attempt {
                        return Err(ForwardError::Unreachable {
                            model: model_label.to_string(),
                            attempts: tried.len(),
                            last: last_error,
                        });
                    }
                    metrics.retried(&model_label);
                }
                Err(SendError::Refused(reason)) if whole.is_some() && !last_attempt => {
                    route.endpoint.load.failed(Instant::now(), router.ejection());
                    metrics.failed(&model_label, Failure::NotServing);
                    last_error = format!("{address}: {reason}");
                    tried.push(route.endpoint.address);
                    metrics.retried(&model_label);
                }
                Err(SendError::Refused(reason) | SendError::Failed(reason)) => {
                    route.endpoint.load.failed(Instant::now(), router.ejection());
                    metrics.failed(&model_label, Failure::Upstream);
                    return Err(ForwardError::Upstream {
                        model: model_label.to_string(),
                        endpoint: address.to_string(),
                        error: reason,
                    });
                }
            }
        }
    }
}

/// Queues a whole body on its stream at once, without waiting for the
/// pod's window (the body is bounded by the gateway's limit), so that it
/// leaves in the same write as the headers. A stream that broke meanwhile
/// says so in its answer.
fn send_whole(send: &mut SendStream<Bytes>, chunks: &[Bytes]) {
    for (index, chunk) in chunks.iter().enumerate() {
        if let Err(error) = send.send_data(chunk.clone(), index + 1 == chunks.len()) {
            tracing::debug!(%error, "sending a request body failed");
            return;
        }
    }
}

/// A stream's first chunks, read to route it, and their charge on the
/// memory budget.
struct Pumped {
    head: Vec<Bytes>,
    charge: Charge,
}

/// Passes a client's stream on to its pod as it arrives, paced by the
/// pod's window, until the client ends it. A client that resets its stream
/// resets the pod's, and a pod that resets its stream ends the pumping.
/// The next chunk is read only once the pod's window has taken the last, so
/// what waits in the gateway is bounded by the client's HTTP/2 windows.
async fn pump(head: Pumped, mut rest: H2Body, mut send: SendStream<Bytes>, _slot: StreamSlot) {
    let Pumped { head, charge } = head;
    for chunk in head {
        if send_paced(&mut send, chunk).await.is_err() {
            return;
        }
    }
    drop(charge);
    loop {
        match std::future::poll_fn(|cx| next_or_reset(cx, &mut rest, |cx| send.poll_reset(cx))).await {
            Next::Chunk(Some(Ok(chunk))) => {
                if send_paced(&mut send, chunk).await.is_err() {
                    return;
                }
            }
            Next::Chunk(None) => {
                let _ = send.send_data(Bytes::new(), true);
                return;
            }
            Next::Chunk(Some(Err(error))) => {
                tracing::debug!(%error, "a client's stream broke; resetting the pod's");
                send.send_reset(h2::Reason::CANCEL);
                return;
            }
            Next::Reset => return,
        }
    }
}

fn build(method: &Method, address: SocketAddr, path: &str, headers: &HeaderMap) -> Request<()> {
    let uri = Uri::builder()
        .scheme("http")
        .authority(address.to_string())
        .path_and_query(path)
        .build()
        .expect("a socket address and a path the front end parsed make a URI");
    let mut request = Request::new(());
    *request.method_mut() = method.clone();
    *request.uri_mut() = uri;
    *request.version_mut() = Version::HTTP_2;
    *request.headers_mut() = headers.clone();
    request
}

/// The queue depth the pod reported with its answer.
fn queue_depth(headers: &HeaderMap) -> Option<u32> {
    headers
        .get(nereid_proto::QUEUE_DEPTH_HEADER)?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

/// Removes the headers that belong to one connection, not to the request
/// (RFC 9110 §7.6.1); gRPC keeps `te: trailers`, which it requires.
fn strip_hop_by_hop(headers: &mut HeaderMap, protocol: Protocol) {
    // Headers the Connection header names are hop-by-hop too.
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in [
        header::CONNECTION,
        header::HOST,
        header::PROXY_AUTHORIZATION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(name);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
    if protocol == Protocol::Http {
        headers.remove(header::TE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_headers_stay_behind() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, "keep-alive, x-hop".parse().unwrap());
        headers.insert("x-hop", "1".parse().unwrap());
        headers.insert("keep-alive", "timeout=5".parse().unwrap());
        headers.insert(header::TE, "trailers".parse().unwrap());
        headers.insert(header::HOST, "gateway".parse().unwrap());
        headers.insert(
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
                .parse()
                .unwrap(),
        );
        headers.insert("grpc-timeout", "5S".parse().unwrap());
        let mut grpc = headers.clone();
        strip_hop_by_hop(&mut grpc, Protocol::Grpc);
        let mut kept: Vec<&str> = grpc.keys().map(HeaderName::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["grpc-timeout", "te", "traceparent"]);
        strip_hop_by_hop(&mut headers, Protocol::Http);
        let mut kept: Vec<&str> = headers.keys().map(HeaderName::as_str).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["grpc-timeout", "traceparent"]);
    }

    #[test]
    fn the_reported_queue_depth() {
        let mut headers = HeaderMap::new();
        assert_eq!(queue_depth(&headers), None);
        headers.insert(nereid_proto::QUEUE_DEPTH_HEADER, "7".parse().unwrap());
        assert_eq!(queue_depth(&headers), Some(7));
        headers.insert(nereid_proto::QUEUE_DEPTH_HEADER, "-1".parse().unwrap());
        assert_eq!(queue_depth(&headers), None);
    }
}
