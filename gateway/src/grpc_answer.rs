//! Sending an answer on the gRPC port's own HTTP/2 stream.
//!
//! A unary answer is gathered whole first (up to a bound) and then queued
//! at once, headers, message and trailers, so that it leaves in one write
//! to the client, as a pod's answer came. A stream's answers, and one too
//! large to gather, are passed on as they arrive, paced by the client's
//! window. A client that resets its stream meanwhile ends the sending, and
//! dropping the answer resets the pod's stream.

use std::future::poll_fn;

use bytes::Bytes;
use h2::server::SendResponse;
use h2::{Reason, SendStream};
use http::Response;
use http::response::Parts;

use crate::grpc_reply::{self, Code};
use crate::h2_body::{H2Body, Next, next_or_reset, send_paced};
use crate::reply_body::Reply;

/// Sends `response`, reading a forwarded answer whole first when it is at
/// most `gather` bytes.
pub async fn send(respond: &mut SendResponse<Bytes>, response: Response<Reply>, gather: usize) {
    let (parts, reply) = response.into_parts();
    match reply {
        Reply::Local { data, trailers } => {
            let head = Response::from_parts(parts, ());
            let Ok(mut stream) = respond.send_response(head, data.is_none() && trailers.is_none()) else {
                return;
            };
            if let Some(data) = data
                && stream.send_data(data, trailers.is_none()).is_err()
            {
                return;
            }
            if let Some(trailers) = trailers {
                let _ = stream.send_trailers(trailers);
            }
        }
        Reply::Forwarded(mut answer) => forwarded(respond, parts, &mut answer.body, gather).await,
    }
}

async fn forwarded(respond: &mut SendResponse<Bytes>, parts: Parts, body: &mut H2Body, gather: usize) {
    let mut chunks = Vec::new();
    let mut gathered = 0;
    let mut whole = false;
    while gather > 0 && gathered <= gather {
        match poll_fn(|cx| next_or_reset(cx, body, |cx| respond.poll_reset(cx))).await {
            Next::Reset => return,
            Next::Chunk(Some(Ok(chunk))) => {
                gathered += chunk.len();
                chunks.push(chunk);
            }
            Next::Chunk(None) => {
                whole = true;
                break;
            }
            Next::Chunk(Some(Err(error))) => {
                // Nothing was sent yet: the client gets a status.
                let status = grpc_reply::status(Code::Unavailable, &format!("the pod's answer broke: {error}"));
                let (parts, _) = status.into_parts();
                let _ = respond.send_response(Response::from_parts(parts, ()), true);
                return;
            }
        }
    }
    let head = Response::from_parts(parts, ());
    if whole {
        let trailers = match body.trailers().await {
            Ok(trailers) => trailers,
            Err(error) => return respond.send_reset(reset_reason(&error)),
        };
        let Ok(mut stream) = respond.send_response(head, chunks.is_empty() && trailers.is_none()) else {
            return;
        };
        let last = chunks.len();
        for (index, chunk) in chunks.into_iter().enumerate() {
            if stream
                .send_data(chunk, index + 1 == last && trailers.is_none())
                .is_err()
            {
                return;
            }
        }
        if let Some(trailers) = trailers {
            let _ = stream.send_trailers(trailers);
        }
        return;
    }
    let Ok(mut stream) = respond.send_response(head, false) else {
        return;
    };
    for chunk in chunks {
        if stream.send_data(chunk, false).is_err() {
            return;
        }
    }
    stream_rest(&mut stream, body).await;
}

/// Passes the rest of a pod's answer on as it arrives.
async fn stream_rest(stream: &mut SendStream<Bytes>, body: &mut H2Body) {
    loop {
        match poll_fn(|cx| next_or_reset(cx, body, |cx| stream.poll_reset(cx))).await {
            Next::Reset => return,
            Next::Chunk(Some(Ok(chunk))) => {
                if send_paced(stream, chunk).await.is_err() {
                    return;
                }
            }
            Next::Chunk(None) => break,
            Next::Chunk(Some(Err(error))) => return stream.send_reset(reset_reason(&error)),
        }
    }
    match body.trailers().await {
        Ok(Some(trailers)) => {
            let _ = stream.send_trailers(trailers);
        }
        Ok(None) => {
            let _ = stream.send_data(Bytes::new(), true);
        }
        Err(error) => stream.send_reset(reset_reason(&error)),
    }
}

/// The reset a broken answer passes on to the client: the pod's own, when
/// it reset the stream, else an internal error.
fn reset_reason(error: &h2::Error) -> Reason {
    error.reason().unwrap_or(Reason::INTERNAL_ERROR)
}
