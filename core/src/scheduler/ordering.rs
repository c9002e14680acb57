//! `preserve_ordering`: responses leave in the order requests arrived,
//! whatever order their batches finish in.
//!
//! Each accepted request takes a sequence number; a finished response waits
//! here until every earlier one has gone out. A responder that is dropped
//! without an answer still releases its number, so one lost request never
//! holds the others back ([`super::Responder`]; tested there).

use std::collections::BTreeMap;
use std::sync::Arc;

use super::responder::{Outcome, Tx};
use parking_lot::Mutex;

#[derive(Debug, Default)]
pub struct Reorderer {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    next_seq: u64,
    next_out: u64,
    done: BTreeMap<u64, (Tx, Outcome)>,
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

    /// Request `seq` is answered: its answer, and every later one that
    /// was waiting for it, go out.
    pub(super) fn complete(&self, seq: u64, sender: Tx, outcome: Outcome) {
        let mut state = self.state.lock();
        state.done.insert(seq, (sender, outcome));
        loop {
            let next = state.next_out;
            let Some((sender, outcome)) = state.done.remove(&next) else {
                break;
            };
            state.next_out += 1;
            sender.deliver(outcome);
        }
    }
}
