//! The body the gateway answers a client with: a pod's answer streamed
//! through as it arrives (trailers included, which is where gRPC puts its
//! status), or an answer the gateway makes itself.
//!
//! A forwarded answer holds its request's [`InFlight`] count until the body
//! is done or dropped (sent, or the client went away), so the endpoint's
//! load estimate covers streams for their whole life, and it records the
//! latency the client saw at that moment. It holds its stream's
//! [`StreamSlot`] as long, so that the pool knows how full the pod's
//! connection is.
//!
//! hyper sends these on the HTTP port; the gRPC port sends them itself
//! ([`crate::grpc_answer`]).

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use prometheus::Histogram;

use crate::h2_body::H2Body;
use crate::load::InFlight;
use crate::pool::StreamSlot;

#[derive(Debug)]
pub enum Reply {
    Forwarded(Answer),
    Local {
        data: Option<Bytes>,
        trailers: Option<HeaderMap>,
    },
}

/// A pod's answer on its way to the client.
#[derive(Debug)]
pub struct Answer {
    pub body: H2Body,
    // Before `_in_flight`, so dropped first: once the endpoint's
    // outstanding count shows the answer gone, so is its stream's slot.
    _slot: StreamSlot,
    _in_flight: InFlight,
    latency: Histogram,
    started: Instant,
}

impl Answer {
    pub fn new(body: H2Body, in_flight: InFlight, slot: StreamSlot, latency: Histogram, started: Instant) -> Self {
        Answer {
            body,
            _slot: slot,
            _in_flight: in_flight,
            latency,
            started,
        }
    }
}

impl Drop for Answer {
    fn drop(&mut self) {
        self.latency.observe(self.started.elapsed().as_secs_f64());
    }
}

impl Reply {
    /// An answer with no body (an HTTP error's status alone, a gRPC
    /// trailers-only answer).
    pub fn empty() -> Self {
        Reply::Local {
            data: None,
            trailers: None,
        }
    }

    pub fn data(data: impl Into<Bytes>) -> Self {
        Reply::Local {
            data: Some(data.into()),
            trailers: None,
        }
    }
}

impl Body for Reply {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        match self.get_mut() {
            Reply::Forwarded(answer) => Pin::new(&mut answer.body).poll_frame(cx),
            // The data first, then the trailers, if any, in the next poll.
            Reply::Local { data, trailers } => Poll::Ready(match data.take() {
                Some(data) => Some(Ok(Frame::data(data))),
                None => trailers.take().map(|t| Ok(Frame::trailers(t))),
            }),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            Reply::Forwarded(answer) => answer.body.is_end_stream(),
            Reply::Local { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Reply::Forwarded(answer) => answer.body.size_hint(),
            Reply::Local { data, .. } => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
        }
    }
}
