//! The body the gateway sends upstream: the chunks it read while finding
//! the model name, then, for a stream, the rest of the client's body as it
//! arrives. Chunks are `Bytes` handed on as they came: nothing is joined or
//! copied, and a fully read body can be sent again on a retry by cloning
//! the list (reference counts, not data).

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use hyper::body::Incoming;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Chunks already read, then what is left of the client's body, if any.
#[derive(Debug)]
pub struct Outgoing {
    head: VecDeque<Bytes>,
    rest: Option<Incoming>,
}

impl Outgoing {
    /// A body read whole.
    pub fn whole(chunks: Vec<Bytes>) -> Self {
        Outgoing {
            head: chunks.into(),
            rest: None,
        }
    }

    /// A body whose first chunks were read, the rest streamed through.
    pub fn streaming(head: Vec<Bytes>, rest: Incoming) -> Self {
        Outgoing {
            head: head.into(),
            rest: Some(rest),
        }
    }
}

impl Body for Outgoing {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(chunk) = self.head.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(chunk))));
        }
        match self.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx).map_err(Into::into),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.head.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let head: u64 = self.head.iter().map(|c| c.len() as u64).sum();
        match &self.rest {
            None => SizeHint::with_exact(head),
            Some(rest) => {
                let rest = rest.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(head + rest.lower());
                if let Some(upper) = rest.upper() {
                    hint.set_upper(head + upper);
                }
                hint
            }
        }
    }
}

/// Why a client's body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the request body is larger than the gateway's limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("reading the request body: {0}")]
    Client(#[from] hyper::Error),
}

/// Reads the chunks of `body` while `more` says more are needed (given the
/// chunks so far and their total length), up to `limit` bytes. Returns the
/// chunks and the body, which is `None` when it ended.
pub async fn read_while(
    mut body: Incoming,
    limit: usize,
    mut more: impl FnMut(&[Bytes], usize) -> bool,
) -> Result<(Vec<Bytes>, Option<Incoming>), ReadError> {
    let mut chunks = Vec::new();
    let mut total = 0;
    while more(&chunks, total) {
        let Some(frame) = body.frame().await else {
            return Ok((chunks, None));
        };
        // Trailers of a request are not part of KServe or gRPC requests: dropped.
        if let Ok(data) = frame?.into_data() {
            total += data.len();
            if total > limit {
                return Err(ReadError::TooLarge { limit });
            }
            if !data.is_empty() {
                chunks.push(data);
            }
        }
    }
    let ended = body.is_end_stream();
    Ok((chunks, (!ended).then_some(body)))
}
