//! A count of things open, refused at once past its limit: client
//! connections per port, ModelStreamInfer calls per client connection.
//!
//! Never waited on: a client over a cap is told so (its connection closed,
//! its call answered RESOURCE_EXHAUSTED), because waiting would hold the
//! very resource the cap bounds (an accepted socket, an open stream).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

#[derive(Clone, Debug)]
pub struct Cap {
    slots: Arc<Semaphore>,
    limit: usize,
}

/// One thing counted open until dropped.
pub type Slot = OwnedSemaphorePermit;

impl Cap {
    pub fn new(limit: usize) -> Self {
        let limit = limit.min(Semaphore::MAX_PERMITS);
        Cap {
            slots: Arc::new(Semaphore::new(limit)),
            limit,
        }
    }

    /// A slot, or `None` when `limit` are open.
    pub fn try_take(&self) -> Option<Slot> {
        Arc::clone(&self.slots).try_acquire_owned().ok()
    }

    pub fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_over_the_limit_is_refused_until_a_slot_is_given_back() {
        let cap = Cap::new(2);
        let first = cap.try_take().unwrap();
        let _second = cap.try_take().unwrap();
        assert!(cap.try_take().is_none());
        drop(first);
        assert!(cap.try_take().is_some());
        assert_eq!(cap.limit(), 2);
    }
}
