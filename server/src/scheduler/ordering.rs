//! `preserve_ordering`: responses leave in the order requests arrived,
//! whatever order their batches finish in.
//!
//! Each accepted request takes a sequence number; a finished response waits
//! here until every earlier one has gone out. A reply that is dropped
//! without an answer still releases its number, so one lost request never
//! holds the others back.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};

use crate::error::{Error, Result};
use crate::tensor::Tensor;

type Outcome = Result<Vec<Tensor>>;

#[derive(Debug, Default)]
pub struct Reorderer {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_seq: u64,
    next_out: u64,
    done: BTreeMap<u64, (oneshot::Sender<Outcome>, Outcome)>,
}

impl Reorderer {
    pub fn new() -> Arc<Self> {
        Arc::new(Reorderer::default())
    }

    pub fn next_seq(&self) -> u64 {
        let mut state = self.state.lock();
        let seq = state.next_seq;
        state.next_seq += 1;
        seq
    }

    fn complete(&self, seq: u64, sender: oneshot::Sender<Outcome>, outcome: Outcome) {
        let mut state = self.state.lock();
        state.done.insert(seq, (sender, outcome));
        loop {
            let next = state.next_out;
            let Some((sender, outcome)) = state.done.remove(&next) else {
                break;
            };
            state.next_out += 1;
            let _ = sender.send(outcome);
        }
    }
}

/// Where a request's answer goes: straight back, through a [`Reorderer`],
/// or, for a decoupled model, as a stream of responses that ends when the
/// sender is dropped (the final flag).
#[derive(Debug)]
pub struct Reply {
    /// `None` once sent.
    sender: Option<oneshot::Sender<Outcome>>,
    order: Option<(u64, Arc<Reorderer>)>,
    stream: Option<mpsc::Sender<Outcome>>,
}

impl Reply {
    pub fn direct(sender: oneshot::Sender<Outcome>) -> Self {
        Reply {
            sender: Some(sender),
            order: None,
            stream: None,
        }
    }

    /// Takes the next place in `reorderer`'s order.
    pub fn ordered(sender: oneshot::Sender<Outcome>, reorderer: &Arc<Reorderer>) -> Self {
        Reply {
            sender: Some(sender),
            order: Some((reorderer.next_seq(), Arc::clone(reorderer))),
            stream: None,
        }
    }

    /// A decoupled request's responses, any number of them.
    pub fn streaming(stream: mpsc::Sender<Outcome>) -> Self {
        Reply {
            sender: None,
            order: None,
            stream: Some(stream),
        }
    }

    /// The stream of a decoupled request's reply (taken once).
    pub fn take_stream(&mut self) -> Option<mpsc::Sender<Outcome>> {
        self.stream.take()
    }

    /// This reply, now taking the next place in `reorderer`'s order.
    pub fn in_order_of(mut self, reorderer: &Arc<Reorderer>) -> Self {
        match self.sender.take() {
            Some(sender) if self.order.is_none() => Reply::ordered(sender, reorderer),
            sender => {
                self.sender = sender;
                self
            }
        }
    }

    pub fn send(mut self, outcome: Outcome) {
        self.finish(outcome);
    }

    fn finish(&mut self, outcome: Outcome) {
        // A streamed reply's one answer (a model that is not decoupled
        // answering through it): that response, then the end.
        if let Some(stream) = self.stream.take() {
            let _ = stream.try_send(outcome);
            return;
        }
        let Some(sender) = self.sender.take() else {
            return;
        };
        match &self.order {
            Some((seq, reorderer)) => reorderer.complete(*seq, sender, outcome),
            None => {
                let _ = sender.send(outcome);
            }
        }
    }

    /// Whether the client has gone away (no point computing its answer).
    pub fn is_closed(&self) -> bool {
        match &self.stream {
            Some(stream) => stream.is_closed(),
            None => self.sender.as_ref().is_none_or(oneshot::Sender::is_closed),
        }
    }
}

impl Drop for Reply {
    /// An ordered reply dropped unanswered still releases its place.
    fn drop(&mut self) {
        if self.order.is_some() {
            self.finish(Err(Error::internal("the request was dropped before it was answered")));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_leave_in_arrival_order() {
        let reorderer = Reorderer::new();
        let mut receivers = Vec::new();
        let mut replies = Vec::new();
        for _ in 0..3 {
            let (tx, rx) = oneshot::channel();
            receivers.push(rx);
            replies.push(Reply::ordered(tx, &reorderer));
        }
        let third = replies.pop().unwrap();
        let second = replies.pop().unwrap();
        let first = replies.pop().unwrap();
        third.send(Ok(vec![]));
        assert!(receivers[2].try_recv().is_err(), "third waits for the first two");
        drop(second); // lost: releases its place with an error
        first.send(Ok(vec![]));
        assert!(receivers[0].try_recv().unwrap().is_ok());
        assert!(receivers[1].try_recv().unwrap().is_err());
        assert!(receivers[2].try_recv().unwrap().is_ok());
    }
}
