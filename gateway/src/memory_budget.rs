//! The request bytes the gateway buffers at once, all connections together
//! (`--max-in-flight-bytes`).
//!
//! A request body is read whole before it is forwarded, so that it can be
//! sent again to another pod if the first cannot be reached; a
//! ModelStreamInfer call is read until its first message names the model.
//! Each chunk is charged here before it is kept. A chunk that would take
//! the total over the limit ends the read with [`OverBudget`] (503 /
//! RESOURCE_EXHAUSTED), and the chunks already kept are freed with the
//! refused request. A [`Charge`] gives its bytes back when dropped: when the
//! forwarded request's chunks are dropped (the pod has answered), or when
//! the read failed. With `--body-timeout-secs`, an upload held one byte
//! short holds its bytes for that long at most, and all of them together
//! never more than the budget.
//!
//! What is passed through rather than buffered is bounded by HTTP/2 flow
//! control instead: the rest of a stream after its first message is read
//! one chunk at a time, the next only once the pod's window has taken the
//! last ([`crate::forward`]'s pump), so what waits in the gateway is at most
//! the client connection's receive window ([`crate::listen::CONNECTION_WINDOW`])
//! per connection, whatever the client sends.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use thiserror::Error;

use crate::limits::flag;

#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    held: AtomicUsize,
}

/// A charge the budget could not take.
#[derive(Clone, Copy, Debug, Error, PartialEq, Eq)]
#[error(
    "the gateway is buffering {held} bytes of request bodies and may buffer {limit} at once ({flag}): retry later",
    flag = flag::MAX_IN_FLIGHT_BYTES
)]
pub struct OverBudget {
    pub held: usize,
    pub limit: usize,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(MemoryBudget {
            limit,
            held: AtomicUsize::new(0),
        })
    }

    /// The bytes charged now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }
}

/// Bytes charged to a [`MemoryBudget`], given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<MemoryBudget>,
    bytes: usize,
}

impl Charge {
    /// A charge of nothing yet.
    pub fn new(budget: &Arc<MemoryBudget>) -> Self {
        Charge {
            budget: Arc::clone(budget),
            bytes: 0,
        }
    }

    /// Charges `more` bytes, unless the budget cannot hold them (then
    /// nothing is charged).
    pub fn add(&mut self, more: usize) -> Result<(), OverBudget> {
        let limit = self.budget.limit;
        self.budget
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_add(more).filter(|&total| total <= limit)
            })
            .map_err(|held| OverBudget { held, limit })?;
        self.bytes += more;
        Ok(())
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stop_at_the_limit_and_come_back_when_dropped() {
        let budget = MemoryBudget::new(100);
        let mut held_short = Charge::new(&budget);
        held_short.add(60).unwrap();
        held_short.add(30).unwrap();
        let mut other = Charge::new(&budget);
        assert_eq!(other.add(20), Err(OverBudget { held: 90, limit: 100 }));
        // A refused charge takes nothing: a smaller one still fits.
        other.add(10).unwrap();
        assert_eq!((budget.held(), other.bytes()), (100, 10));
        drop(held_short);
        assert_eq!(budget.held(), 10);
        other.add(90).unwrap();
        drop(other);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn the_refusal_names_the_flag() {
        let refusal = OverBudget { held: 5, limit: 8 }.to_string();
        assert!(refusal.contains("--max-in-flight-bytes"), "{refusal}");
    }

    #[test]
    fn a_charge_cannot_overflow_the_count() {
        let budget = MemoryBudget::new(usize::MAX);
        let mut first = Charge::new(&budget);
        first.add(usize::MAX - 1).unwrap();
        assert!(Charge::new(&budget).add(2).is_err());
    }
}
