//! Where a request's responses go: one channel for every kind of call.
//!
//! A unary call is a stream that carries exactly one response; a decoupled
//! call's carries any number. Either way the stream ends when the
//! [`Responder`] is dropped (Triton's final flag), and an error ends it
//! too. Whoever holds the request's [`Responses`] (the model, turning them
//! into answers) cannot tell which kind of scheduler or backend produced
//! them, so the same code serves unary and streamed calls everywhere.

use std::sync::Arc;

use tokio::sync::mpsc;

use super::ordering::Reorderer;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// One response: every output the model produced for the request, or the
/// error that ends it.
pub type Outcome = Result<Vec<Tensor>>;

/// The receiving end of a request's responses.
pub type Responses = mpsc::Receiver<Outcome>;

/// How many responses a unary request's channel holds: its one answer.
pub const UNARY_DEPTH: usize = 1;

/// How many responses of one decoupled request may wait for its client
/// before the backend sending them waits too.
pub const STREAM_DEPTH: usize = 16;

/// The sending end of a request's responses.
#[derive(Debug)]
pub struct Responder {
    tx: mpsc::Sender<Outcome>,
    /// `preserve_ordering`: the request's place in its model's order, which
    /// its last response keeps.
    order: Option<(u64, Arc<Reorderer>)>,
}

/// A request's two ends: `depth` responses may wait for the receiver.
pub fn channel(depth: usize) -> (Responder, Responses) {
    let (tx, rx) = mpsc::channel(depth.max(1));
    (Responder { tx, order: None }, rx)
}

impl Responder {
    /// This responder, now taking the next place in `reorderer`'s order
    /// (once: a responder already in an order keeps its place).
    pub fn in_order_of(mut self, reorderer: &Arc<Reorderer>) -> Self {
        if self.order.is_none() {
            self.order = Some((reorderer.next_seq(), Arc::clone(reorderer)));
        }
        self
    }

    /// Sends one response of many from a thread outside the runtime (an
    /// instance thread), waiting while the receiver is behind: backpressure
    /// on a backend that streams faster than its client reads. `false` once
    /// the receiver has gone away.
    pub fn blocking_send(&self, outcome: Outcome) -> bool {
        self.tx.blocking_send(outcome).is_ok()
    }

    /// [`Self::blocking_send`] on the runtime.
    pub async fn send(&self, outcome: Outcome) -> bool {
        self.tx.send(outcome).await.is_ok()
    }

    /// The request's last response, and its end. With `preserve_ordering`
    /// it leaves only after every earlier request's.
    pub fn answer(mut self, outcome: Outcome) {
        match self.order.take() {
            Some((seq, reorderer)) => reorderer.complete(seq, self.tx.clone(), outcome),
            // A unary request's channel holds its answer; a stream that is
            // full drops it only when its client stopped reading.
            None => {
                let _ = self.tx.try_send(outcome);
            }
        }
    }

    /// Ends the request with `error`.
    pub fn fail(self, error: Error) {
        self.answer(Err(error));
    }

    /// Whether the receiver has gone away (no point computing for it).
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Resolves when the receiver goes away: a task working for the
    /// request (an ensemble, a remote call) stops there.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

impl Drop for Responder {
    /// An ordered request dropped unanswered still releases its place.
    fn drop(&mut self) {
        if let Some((seq, reorderer)) = self.order.take() {
            let error = Error::internal("the request was dropped before it was answered");
            reorderer.complete(seq, self.tx.clone(), Err(error));
        }
    }
}

/// Waits for a unary request's one response.
pub async fn single(responses: &mut Responses) -> Outcome {
    responses
        .recv()
        .await
        .unwrap_or_else(|| Err(Error::internal("the model instance stopped before answering")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_dropped_responder_ends_the_stream_and_answers_leave_in_order() {
        let (responder, mut responses) = channel(STREAM_DEPTH);
        assert!(responder.send(Ok(vec![])).await);
        drop(responder);
        assert!(responses.recv().await.unwrap().is_ok());
        assert!(responses.recv().await.is_none(), "dropping is the final flag");

        let reorderer = Reorderer::new();
        let mut ends = Vec::new();
        let mut responders = Vec::new();
        for _ in 0..3 {
            let (responder, rx) = channel(UNARY_DEPTH);
            responders.push(responder.in_order_of(&reorderer));
            ends.push(rx);
        }
        let third = responders.pop().unwrap();
        let second = responders.pop().unwrap();
        let first = responders.pop().unwrap();
        third.answer(Ok(vec![]));
        assert!(ends[2].try_recv().is_err(), "the third waits for the first two");
        drop(second);
        first.answer(Ok(vec![]));
        assert!(single(&mut ends[0]).await.is_ok());
        assert!(single(&mut ends[1]).await.is_err(), "dropped unanswered");
        assert!(single(&mut ends[2]).await.is_ok());
    }
}
