//! Where a request's responses go: one channel for every kind of call.
//!
//! A unary call is a stream that carries exactly one response; a decoupled
//! call's carries any number. Either way the stream ends when the
//! [`Responder`] is dropped (Triton's final flag), and an error ends it
//! too. Whoever holds the request's [`Responses`] (the model, turning them
//! into answers) cannot tell which kind of scheduler or backend produced
//! them, so the same code serves unary and streamed calls everywhere.

use std::future::poll_fn;
use std::sync::Arc;
use std::task::{Context, Poll};

use parking_lot::Mutex;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::{mpsc, oneshot};

use super::ordering::Reorderer;
use crate::error::{Error, Result};
use crate::response::Produced;

/// One response: what the model produced for the request, or the error
/// that ends it.
pub type Outcome = Result<Produced>;

/// How many responses a unary request's channel holds: its one answer.
pub const UNARY_DEPTH: usize = 1;

/// How many responses of one decoupled request may wait for its client
/// before the backend sending them waits too.
pub const STREAM_DEPTH: usize = 16;

/// The sending end of a request's responses.
#[derive(Debug)]
pub struct Responder {
    tx: Tx,
    /// `preserve_ordering`: the request's place in its model's order, which
    /// its last response keeps.
    order: Option<(u64, Arc<Reorderer>)>,
}

/// The channel under a responder, chosen by its depth. A unary call's is
/// a one-shot: a bounded multi-message channel costs two allocations per
/// request, one of them a cache-aligned kilobyte, on the per-request path
/// of every batched model. (bench/ab.sh on mlp_small over HTTP, c=64,
/// alternating with the commit before the one request path, read the
/// server's CPU per request 14 % higher with the bounded channel in one
/// order of runs; with the one-shot, 2 % apart over both orders, within
/// this VM's noise.)
#[derive(Debug)]
pub(super) enum Tx {
    /// One response; `None` once it is sent.
    One(Mutex<Option<oneshot::Sender<Outcome>>>),
    Many(mpsc::Sender<Outcome>),
}

/// The receiving end of a request's responses.
#[derive(Debug)]
pub struct Responses(Rx);

#[derive(Debug)]
enum Rx {
    /// `None` once the response (or the end) has been read.
    One(Option<oneshot::Receiver<Outcome>>),
    Many(mpsc::Receiver<Outcome>),
}

/// A request's two ends: `depth` responses may wait for the receiver (a
/// depth of [`UNARY_DEPTH`] carries exactly one).
pub fn channel(depth: usize) -> (Responder, Responses) {
    let (tx, rx) = if depth <= UNARY_DEPTH {
        let (tx, rx) = oneshot::channel();
        (Tx::One(Mutex::new(Some(tx))), Rx::One(Some(rx)))
    } else {
        let (tx, rx) = mpsc::channel(depth);
        (Tx::Many(tx), Rx::Many(rx))
    };
    (Responder { tx, order: None }, Responses(rx))
}

impl Tx {
    /// Sends without waiting: a unary response, or a stream's last.
    pub(super) fn deliver(&self, outcome: Outcome) -> bool {
        match self {
            Tx::One(slot) => slot.lock().take().is_some_and(|tx| tx.send(outcome).is_ok()),
            // A stream that is full drops it only when its client stopped reading.
            Tx::Many(tx) => tx.try_send(outcome).is_ok(),
        }
    }
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
    /// the receiver has gone away (or a unary request has had its one).
    pub fn blocking_send(&self, outcome: Outcome) -> bool {
        match &self.tx {
            Tx::One(_) => self.tx.deliver(outcome),
            Tx::Many(tx) => tx.blocking_send(outcome).is_ok(),
        }
    }

    /// [`Self::blocking_send`] on the runtime.
    pub async fn send(&self, outcome: Outcome) -> bool {
        match &self.tx {
            Tx::One(_) => self.tx.deliver(outcome),
            Tx::Many(tx) => tx.send(outcome).await.is_ok(),
        }
    }

    /// The request's last response, and its end. With `preserve_ordering`
    /// it leaves only after every earlier request's.
    pub fn answer(mut self, outcome: Outcome) {
        match self.order.take() {
            Some((seq, reorderer)) => reorderer.complete(seq, self.take_tx(), outcome),
            None => {
                self.tx.deliver(outcome);
            }
        }
    }

    /// Ends the request with `error`.
    pub fn fail(self, error: Error) {
        self.answer(Err(error));
    }

    /// Whether the receiver has gone away (no point computing for it).
    pub fn is_closed(&self) -> bool {
        match &self.tx {
            Tx::One(slot) => slot.lock().as_ref().is_none_or(oneshot::Sender::is_closed),
            Tx::Many(tx) => tx.is_closed(),
        }
    }

    /// Resolves when the receiver goes away: a task working for the
    /// request (an ensemble, a remote call) stops there. Never, once a
    /// unary request has had its response.
    pub async fn closed(&self) {
        match &self.tx {
            Tx::One(slot) => {
                poll_fn(|cx: &mut Context<'_>| match slot.lock().as_mut() {
                    Some(tx) => tx.poll_closed(cx),
                    None => Poll::Pending,
                })
                .await;
            }
            Tx::Many(tx) => tx.closed().await,
        }
    }

    /// The channel, leaving an answered one-shot in its place.
    fn take_tx(&mut self) -> Tx {
        std::mem::replace(&mut self.tx, Tx::One(Mutex::new(None)))
    }
}

impl Drop for Responder {
    /// An ordered request dropped unanswered still releases its place.
    fn drop(&mut self) {
        if let Some((seq, reorderer)) = self.order.take() {
            let error = Error::internal("the request was dropped before it was answered");
            reorderer.complete(seq, self.take_tx(), Err(error));
        }
    }
}

impl Responses {
    /// The next response; `None` at the end (a unary request's after its one).
    pub async fn recv(&mut self) -> Option<Outcome> {
        poll_fn(|cx| self.poll_recv(cx)).await
    }

    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Outcome>> {
        match &mut self.0 {
            Rx::One(slot) => {
                let Some(rx) = slot else {
                    return Poll::Ready(None);
                };
                match std::pin::Pin::new(rx).poll(cx) {
                    Poll::Pending => Poll::Pending,
                    Poll::Ready(received) => {
                        *slot = None;
                        Poll::Ready(received.ok())
                    }
                }
            }
            Rx::Many(rx) => rx.poll_recv(cx),
        }
    }

    /// The next response if one is there.
    pub fn try_recv(&mut self) -> std::result::Result<Outcome, TryRecvError> {
        match &mut self.0 {
            Rx::One(slot) => {
                let Some(rx) = slot else {
                    return Err(TryRecvError::Disconnected);
                };
                match rx.try_recv() {
                    Ok(outcome) => {
                        *slot = None;
                        Ok(outcome)
                    }
                    Err(oneshot::error::TryRecvError::Empty) => Err(TryRecvError::Empty),
                    Err(oneshot::error::TryRecvError::Closed) => {
                        *slot = None;
                        Err(TryRecvError::Disconnected)
                    }
                }
            }
            Rx::Many(rx) => rx.try_recv(),
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
        assert!(responder.send(Ok(vec![].into())).await);
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
        third.answer(Ok(vec![].into()));
        assert!(ends[2].try_recv().is_err(), "the third waits for the first two");
        drop(second);
        first.answer(Ok(vec![].into()));
        assert!(single(&mut ends[0]).await.is_ok());
        assert!(single(&mut ends[1]).await.is_err(), "dropped unanswered");
        assert!(single(&mut ends[2]).await.is_ok());
    }
}
