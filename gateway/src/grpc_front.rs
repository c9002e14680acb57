//! The gRPC port: KServe v2's `inference.GRPCInferenceService`, each call
//! routed by the model its message names.
//!
//! Calls about one model (infer, ready, metadata, config, statistics) are
//! read whole, routed by their field 1 and forwarded as they came, with a
//! retry on another pod if the first cannot be reached. ModelStreamInfer is
//! routed by its first message and pinned to that pod for its life. Either
//! is read only until its first message names the model before it is
//! checked against the namespace's token ([`crate::authorize`]): one that
//! may not reach it is answered UNAUTHENTICATED without reading on. Liveness,
//! readiness and the repository index are the gateway's own answers; server
//! metadata comes from any ready pod. Loading and unloading belong to the
//! InferenceModel, and shared memory to one pod: both are refused here.
//!
//! A ModelStreamInfer call holds a stream to its pod for as long as the
//! client keeps it open, so one client connection may hold at most
//! `--max-streaming-calls-per-connection` of them; one more is answered
//! RESOURCE_EXHAUSTED at once. Together with the pool opening more
//! connections to a pod whose connection is full ([`crate::pool`]), this
//! keeps one client's idle streams from taking every stream the pod allows
//! the gateway, which would leave every other client's calls queued.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use http::{Request, Response};
use nereid_proto::frame::{PREFIX_LEN, Prefix};
use nereid_proto::inference::repository_index_response::ModelIndex;
use nereid_proto::inference::{
    RepositoryIndexRequest, RepositoryIndexResponse, ServerLiveResponse, ServerMetadataResponse, ServerReadyResponse,
};
use prost::Message;

use crate::authorize::Refused;
use crate::cap::Cap;
use crate::forward::{Forward, ForwardError, Payload};
use crate::grpc_answer;
use crate::grpc_reply::{self, Code};
use crate::h2_body::H2Body;
use crate::limits::flag;
use crate::metrics::Failure;
use crate::model_name::{self, FrameError};
use crate::registry::RouteError;
use crate::reply_body::Reply;
use crate::request_body::{ReadError, read_rest, read_while};
use crate::state::Gateway;
use crate::{NAMESPACE_HEADER, Protocol};

const SERVICE: &str = "/inference.GRPCInferenceService/";
const STREAM_INFER: &str = "/inference.GRPCInferenceService/ModelStreamInfer";

/// A unary call's answer up to this size is read whole before any of it is
/// sent on, so that its headers, message and trailers leave in one write;
/// a larger one, and every stream's, is passed on as it arrives.
const WHOLE_ANSWER_BYTES: usize = 1 << 20;

/// One call on the gRPC port, from its headers to its last answer. A client
/// that resets its stream before the answer drops the call, and with it the
/// stream to the pod (which h2 then resets: the pod stops the work).
/// `streams` caps the ModelStreamInfer calls of the client's connection.
pub async fn call(
    gateway: Arc<Gateway>,
    request: Request<RecvStream>,
    mut respond: SendResponse<Bytes>,
    streams: &Cap,
) {
    let streaming = request.uri().path() == STREAM_INFER;
    // Held for the call's life.
    let _stream_slot = match streaming.then(|| streams.try_take()) {
        Some(None) => {
            gateway.metrics.failed("", Failure::Overloaded);
            let text = format!(
                "this connection already has {} ModelStreamInfer calls open, the gateway's limit per connection \
                 ({}): end one, or open another connection",
                streams.limit(),
                flag::MAX_STREAMING_CALLS
            );
            grpc_answer::send(&mut respond, grpc_reply::status(Code::ResourceExhausted, &text), 0).await;
            return;
        }
        Some(slot) => slot,
        None => None,
    };
    let mut answer = pin!(serve(&gateway, request.map(H2Body::new)));
    let answered = poll_fn(|cx| {
        if let Poll::Ready(response) = answer.as_mut().poll(cx) {
            return Poll::Ready(Some(response));
        }
        respond.poll_reset(cx).map(|_| None)
    })
    .await;
    if let Some(response) = answered {
        let gather = if streaming { 0 } else { WHOLE_ANSWER_BYTES };
        grpc_answer::send(&mut respond, response, gather).await;
    }
}

async fn serve(gateway: &Gateway, request: Request<H2Body>) -> Response<Reply> {
    let started = Instant::now();
    let path = request.uri().path();
    let Some(method) = path.strip_prefix(SERVICE) else {
        return grpc_reply::status(
            Code::Unimplemented,
            &format!("the gateway serves inference.GRPCInferenceService only, not {path}"),
        );
    };
    match method {
        "ModelInfer" | "ModelReady" | "ModelMetadata" | "ModelConfig" | "ModelStatistics" => {
            per_model(gateway, request, started, false).await
        }
        "ModelStreamInfer" => per_model(gateway, request, started, true).await,
        "ServerLive" => grpc_reply::message(&ServerLiveResponse { live: true }),
        "ServerReady" => grpc_reply::message(&ServerReadyResponse {
            ready: gateway.router.synced(),
        }),
        "ServerMetadata" => server_metadata(gateway, request, started).await,
        "RepositoryIndex" => repository_index(gateway, request).await,
        "RepositoryModelLoad" | "RepositoryModelUnload" => grpc_reply::status(
            Code::FailedPrecondition,
            "models are loaded and unloaded by their InferenceModel objects, not through the gateway: \
             create, change or delete the InferenceModel (kubectl apply / delete)",
        ),
        other => grpc_reply::status(
            Code::Unimplemented,
            &format!("{other} is about one server; the gateway routes per request, so call a pod directly for it"),
        ),
    }
}

/// A call about one model: routed by the name in its (first) message.
async fn per_model(gateway: &Gateway, request: Request<H2Body>, started: Instant, stream: bool) -> Response<Reply> {
    let (parts, body) = request.into_parts();
    // Read until the first message names the model, and no further before
    // the request is known to be allowed to reach it: then a unary call is
    // read whole (it can then be retried), a stream passed on as it comes.
    // What is read is charged to the memory budget until the pod has
    // answered (a stream's first chunks: until they are passed on).
    let limits = gateway.limits.body();
    let deadline = tokio::time::Instant::now() + limits.timeout;
    let mut charge = gateway.charge();
    let mut first_message = FirstMessage::default();
    let read = read_while(body, limits, &mut charge, |chunks, total| {
        !first_message.has_name(chunks, total)
    })
    .await;
    let (chunks, rest) = match read {
        Ok(read) => read,
        Err(error) => return read_failure(gateway, &error),
    };
    let name = match name_of(&chunks) {
        Ok(Some(name)) if !name.is_empty() => name,
        Ok(_) => return bad_request(gateway, "the request names no model (field 1 is empty)"),
        Err(FrameError::Incomplete) => {
            return bad_request(gateway, "the request ended before its first message was complete");
        }
        Err(error) => return bad_request(gateway, &error.to_string()),
    };
    let requested = match parts.headers.get(NAMESPACE_HEADER).and_then(|v| v.to_str().ok()) {
        Some(namespace) => format!("{namespace}/{name}"),
        None => name,
    };
    let requested = match gateway.admit(requested, &parts.headers) {
        Ok(requested) => requested,
        Err(refused) => return refusal(refused),
    };
    let body = match rest {
        Some(rest) if stream => Payload::Streaming {
            head: chunks,
            rest,
            charge: std::mem::replace(&mut charge, gateway.charge()),
        },
        // The rest of a unary call, within what is left of its limits.
        Some(rest) => match read_rest(rest, chunks, limits, deadline, &mut charge).await {
            Ok(chunks) => Payload::Whole(chunks),
            Err(error) => return read_failure(gateway, &error),
        },
        // A body that ended: whole (a stream's too).
        None => Payload::Whole(chunks),
    };
    let path = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
    let forward = Forward {
        protocol: Protocol::Grpc,
        model: &requested,
        method: parts.method,
        path,
        headers: parts.headers,
        body,
        started,
    };
    gateway
        .forward(forward)
        .await
        .unwrap_or_else(|error| forward_failure(&error))
}

/// How far a stream's first message has arrived, checked as each chunk
/// comes: enough once the first chunk holds the name (the usual case), or
/// once the whole message is in (then [`name_of`] joins it, once). Each
/// check costs the same whatever the number of chunks, so a message that
/// puts its name last costs one join, not one per chunk.
#[derive(Default)]
struct FirstMessage {
    /// Whether the first chunk alone names the model (or is malformed: no
    /// use reading on), once it has been looked at.
    first_chunk_decides: Option<bool>,
    /// Where the first message ends (its prefix included), once the whole
    /// prefix has come.
    end: Option<usize>,
}

impl FirstMessage {
    fn has_name(&mut self, chunks: &[Bytes], total: usize) -> bool {
        let Some(first) = chunks.first() else {
            return false;
        };
        let decides = *self
            .first_chunk_decides
            .get_or_insert_with(|| !matches!(model_name::from_grpc_message(first), Err(FrameError::Incomplete)));
        if decides {
            return true;
        }
        if self.end.is_none() {
            let mut prefix = [0; PREFIX_LEN];
            let mut filled = 0;
            for (slot, byte) in prefix.iter_mut().zip(chunks.iter().flat_map(|chunk| chunk.iter())) {
                *slot = *byte;
                filled += 1;
            }
            self.end = Prefix::read(&prefix[..filled]).map(|prefix| PREFIX_LEN + prefix.length);
        }
        self.end.is_some_and(|end| total >= end)
    }
}

/// The model name in the first message of `chunks`, reading the first chunk
/// alone when the name is in it (the usual case: it is field 1, encoded
/// first), joining them only when it is not.
fn name_of(chunks: &[Bytes]) -> Result<Option<String>, FrameError> {
    let Some(first) = chunks.first() else {
        return Err(FrameError::Incomplete);
    };
    match model_name::from_grpc_message(first) {
        Err(FrameError::Incomplete) if chunks.len() > 1 => {
            let joined = chunks.concat();
            model_name::from_grpc_message(&joined).map(|name| name.map(str::to_string))
        }
        found => found.map(|name| name.map(str::to_string)),
    }
}

/// Server metadata from any ready pod; the gateway's own when none is.
async fn server_metadata(gateway: &Gateway, request: Request<H2Body>, started: Instant) -> Response<Reply> {
    let Some(route) = gateway.any_route(request.headers()) else {
        return grpc_reply::message(&ServerMetadataResponse {
            name: "nereid-gateway".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            extensions: Vec::new(),
        });
    };
    let (parts, body) = request.into_parts();
    let mut charge = gateway.charge();
    let chunks = match read_while(body, gateway.limits.body(), &mut charge, |_, _| true).await {
        Ok((chunks, _)) => chunks,
        Err(error) => return read_failure(gateway, &error),
    };
    let forward = Forward {
        protocol: Protocol::Grpc,
        model: &route.model,
        method: parts.method,
        path: parts.uri.path(),
        headers: parts.headers,
        body: Payload::Whole(chunks),
        started,
    };
    gateway
        .forward(forward)
        .await
        .unwrap_or_else(|error| forward_failure(&error))
}

/// The cluster's models and their states, from discovery.
async fn repository_index(gateway: &Gateway, request: Request<H2Body>) -> Response<Reply> {
    let (parts, body) = request.into_parts();
    let mut charge = gateway.charge();
    let limits = gateway.limits.control_body();
    let chunks = match read_while(body, limits, &mut charge, |_, _| true).await {
        Ok((chunks, _)) => chunks,
        Err(error) => return read_failure(gateway, &error),
    };
    let joined = chunks.concat();
    let Some(message) = joined.get(5..) else {
        return bad_request(gateway, "the request has no message");
    };
    let Ok(asked) = RepositoryIndexRequest::decode(message) else {
        return bad_request(gateway, "the RepositoryIndexRequest does not decode");
    };
    // Only the namespaces the request's token opens.
    let models = gateway
        .index(&parts.headers)
        .into_iter()
        .filter(|entry| entry.ready || !asked.ready)
        .map(|entry| ModelIndex {
            name: entry.name,
            version: String::new(),
            state: if entry.ready { "READY" } else { "UNAVAILABLE" }.into(),
            reason: entry.reason,
        })
        .collect();
    grpc_reply::message(&RepositoryIndexResponse { models })
}

fn bad_request(gateway: &Gateway, text: &str) -> Response<Reply> {
    gateway.metrics.failed("", Failure::BadRequest);
    grpc_reply::status(Code::InvalidArgument, text)
}

fn read_failure(gateway: &Gateway, error: &ReadError) -> Response<Reply> {
    let (code, failure) = match error {
        ReadError::TooLarge { .. } => (Code::ResourceExhausted, Failure::BadRequest),
        ReadError::OverBudget(_) => (Code::ResourceExhausted, Failure::Overloaded),
        ReadError::TimedOut { .. } => (Code::DeadlineExceeded, Failure::BadRequest),
        ReadError::Client(_) => (Code::InvalidArgument, Failure::BadRequest),
    };
    gateway.metrics.failed("", failure);
    grpc_reply::status(code, &error.to_string())
}

/// A call refused before it was read further: UNAUTHENTICATED when it
/// may not reach the model, else as if routing had failed (counted by
/// [`Gateway::admit`]).
fn refusal(refused: Refused) -> Response<Reply> {
    match refused {
        Refused::Unauthorized(error) => grpc_reply::status(Code::Unauthenticated, &error.to_string()),
        Refused::Route(error) => forward_failure(&ForwardError::Route(error)),
    }
}

fn forward_failure(error: &ForwardError) -> Response<Reply> {
    let code = match error {
        ForwardError::Route(RouteError::Unknown(_)) => Code::NotFound,
        ForwardError::Route(RouteError::Ambiguous { .. }) => Code::InvalidArgument,
        ForwardError::Route(RouteError::NoReadyEndpoints { .. })
        | ForwardError::Waking(_)
        | ForwardError::Unreachable { .. }
        | ForwardError::Upstream { .. } => Code::Unavailable,
    };
    grpc_reply::status(code, &error.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A gRPC frame whose message puts a 1000-byte field 6 before the name.
    fn name_last() -> Vec<u8> {
        let mut message = vec![0x32, 0xe8, 0x07];
        message.extend(std::iter::repeat_n(7u8, 1000));
        message.extend([0x0a, 2, b'm', b'x']);
        nereid_proto::frame::frame(&message).unwrap().to_vec()
    }

    #[test]
    fn a_stream_is_read_until_its_first_message_names_the_model() {
        let frame = name_last();
        // Chunks of 1 and 3 bytes split the 5-byte prefix itself.
        for size in [1, 3, 100] {
            let chunks: Vec<Bytes> = frame.chunks(size).map(Bytes::copy_from_slice).collect();
            let mut first = FirstMessage::default();
            let mut total = 0;
            for (index, chunk) in chunks.iter().enumerate() {
                total += chunk.len();
                let done = first.has_name(&chunks[..=index], total);
                assert_eq!(done, index == chunks.len() - 1, "chunks of {size}, chunk {index}");
            }
            assert_eq!(name_of(&chunks), Ok(Some("mx".to_string())), "chunks of {size}");
        }

        // The name in the first chunk: nothing more is read.
        let mut first = FirstMessage::default();
        let named = Bytes::from_static(&[0, 0, 0, 0, 9, 0x0a, 2, b'm', b'x', 0x32, 0x7f]);
        assert!(first.has_name(std::slice::from_ref(&named), named.len()));
    }
}
