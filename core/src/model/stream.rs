//! A decoupled model's answer to one request: a stream of responses (any
//! number, each shaped like a unary answer), ended when the model is done
//! with the request. Dropping the stream (the client went away, the gRPC
//! stream closed) cancels the request: its inputs go if it is still
//! queued, and the backend, sending its next response, is told to stop.
//! The request counts in the statistics once, when the stream ends or is
//! dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use futures::Stream;

use super::{Model, Submitted};
use crate::error::{Error, Result};
use crate::metrics::FailureReason;
use crate::request::InferRequest;
use crate::response::InferResponse;
use crate::scheduler::responder::STREAM_DEPTH;

/// The responses of one request to a decoupled model.
pub struct ResponseStream {
    model: Arc<Model>,
    submitted: Submitted,
    arrived: Instant,
    /// What the statistics record when the stream goes: cancelled unless
    /// it ended (well, or with the error it carried).
    failure: Option<FailureReason>,
    ended: bool,
}

impl std::fmt::Debug for ResponseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStream")
            .field("id", &self.submitted.id)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Queues a request of this decoupled model; its responses come on the
    /// returned stream. The same way in as a unary call ([`Model::infer`]),
    /// with room for more responses.
    pub fn infer_stream(self: &Arc<Self>, request: InferRequest) -> Result<ResponseStream> {
        if !self.is_decoupled() {
            return Err(Error::internal(format!("model '{}' is not decoupled", self.name)));
        }
        let arrived = Instant::now();
        let span = tracing::debug_span!("infer", model = %self.name, version = self.version, request_id = %request.id);
        match self.submit(request, STREAM_DEPTH, span) {
            Ok(submitted) => Ok(ResponseStream {
                model: Arc::clone(self),
                submitted,
                arrived,
                failure: Some(FailureReason::Canceled),
                ended: false,
            }),
            Err(e) => {
                self.statistics
                    .record_request(Some(FailureReason::of(&e)), arrived.elapsed());
                Err(e)
            }
        }
    }
}

impl ResponseStream {
    /// The request's id, which every response carries.
    pub fn id(&self) -> &str {
        &self.submitted.id
    }

    /// The version answering.
    pub fn model_version(&self) -> i64 {
        self.model.version()
    }
}

impl Stream for ResponseStream {
    type Item = Result<InferResponse>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let this = &mut *self;
        match this.submitted.responses.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(produced))) => {
                let submitted = &this.submitted;
                let response = this.model.respond(
                    submitted.id.clone(),
                    produced,
                    &submitted.wanted,
                    submitted.batch_size,
                    false,
                );
                Poll::Ready(Some(response))
            }
            Poll::Ready(Some(Err(e))) => {
                this.failure = Some(FailureReason::of(&e));
                this.ended = true;
                if let Some(trace) = this.submitted.trace.take() {
                    trace.finish(Some(&e));
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.failure = None;
                this.ended = true;
                if let Some(trace) = this.submitted.trace.take() {
                    trace.finish(None);
                }
                Poll::Ready(None)
            }
        }
    }
}

impl Drop for ResponseStream {
    fn drop(&mut self) {
        self.model
            .statistics
            .record_request(self.failure, self.arrived.elapsed());
    }
}
