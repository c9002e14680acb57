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
use tokio::sync::mpsc;

use super::{Model, normalize};
use crate::error::{Error, Result};
use crate::memory_budget::Reservation;
use crate::metrics::FailureReason;
use crate::request::{InferRequest, RequestedOutput};
use crate::response::InferResponse;
use crate::scheduler::{CancelOnDrop, Work};
use crate::tensor::Tensor;
use crate::trace::RequestTrace;

/// The responses of one request to a decoupled model.
pub struct ResponseStream {
    model: Arc<Model>,
    id: String,
    wanted: Vec<RequestedOutput>,
    batch_size: usize,
    responses: mpsc::Receiver<Result<Vec<Tensor>>>,
    _cancel: CancelOnDrop,
    _reservation: Reservation,
    arrived: Instant,
    /// What the statistics record when the stream goes: cancelled unless
    /// it ended (well, or with the error it carried).
    failure: Option<FailureReason>,
    ended: bool,
    /// Ended with the stream; dropped unended, it records a cancellation.
    trace: Option<Arc<RequestTrace>>,
}

impl std::fmt::Debug for ResponseStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseStream")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Model {
    /// Queues a request of this decoupled model; its responses come on the
    /// returned stream.
    pub fn infer_stream(self: &Arc<Self>, mut request: InferRequest) -> Result<ResponseStream> {
        if !self.is_decoupled() {
            return Err(Error::internal(format!("model '{}' is not decoupled", self.name)));
        }
        let arrived = Instant::now();
        let id = std::mem::take(&mut request.id);
        let parameters = std::mem::take(&mut request.parameters);
        let reservation = std::mem::take(&mut request.reservation);
        let trace = request.trace.take();
        let stream_trace = trace.clone();
        let trace_parent = std::mem::take(&mut request.trace_parent);
        let normalized = match normalize::normalize(&self.config, &self.name, &id, request) {
            Ok(normalized) => normalized,
            Err(e) => {
                self.statistics
                    .record_request(Some(FailureReason::of(&e)), arrived.elapsed());
                return Err(e);
            }
        };
        let work = Work {
            batch_size: normalized.batch_size,
            id: &id,
            parameters: &parameters,
            trace,
            trace_parent: &trace_parent,
        };
        let (responses, cancel) = match self
            .scheduler
            .schedule_stream(normalized.inputs, work, &self.statistics)
        {
            Ok(queued) => queued,
            Err(e) => {
                self.statistics
                    .record_request(Some(FailureReason::of(&e)), arrived.elapsed());
                return Err(e);
            }
        };
        Ok(ResponseStream {
            model: Arc::clone(self),
            id,
            wanted: normalized.outputs,
            batch_size: normalized.batch_size,
            responses,
            _cancel: cancel,
            _reservation: reservation,
            arrived,
            failure: Some(FailureReason::Canceled),
            ended: false,
            trace: stream_trace,
        })
    }
}

impl ResponseStream {
    /// The request's id, which every response carries.
    pub fn id(&self) -> &str {
        &self.id
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
        match this.responses.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Ok(tensors))) => {
                let response = this
                    .model
                    .respond(this.id.clone(), tensors, &this.wanted, this.batch_size, false);
                Poll::Ready(Some(response))
            }
            Poll::Ready(Some(Err(e))) => {
                this.failure = Some(FailureReason::of(&e));
                this.ended = true;
                if let Some(trace) = this.trace.take() {
                    trace.finish(Some(&e));
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.failure = None;
                this.ended = true;
                if let Some(trace) = this.trace.take() {
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
