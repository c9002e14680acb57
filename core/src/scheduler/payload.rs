//! A request's inputs on their way to an instance, droppable by either end.
//!
//! The inputs are shared between the caller awaiting the answer and the
//! queue entry travelling through the scheduler. The instance takes them
//! when it runs the request; if the caller gives up first (the client
//! disconnected, the handler future was dropped), [`CancelOnDrop`] drops
//! them at once, wherever the entry is queued: a cancelled request never
//! holds its memory until dispatch, and the instance finds nothing to
//! compute. (The request's memory reservation stays with the caller, so it
//! is given back in the same moment.)

use std::sync::Arc;

use parking_lot::Mutex;

use crate::tensor::Tensor;

#[derive(Debug, Default)]
pub struct Payload {
    slot: Mutex<Option<Vec<Tensor>>>,
}

impl Payload {
    pub fn new(inputs: Vec<Tensor>) -> Arc<Self> {
        Arc::new(Payload {
            slot: Mutex::new(Some(inputs)),
        })
    }

    /// The inputs, once; `None` when the request was cancelled (or already taken).
    pub fn take(&self) -> Option<Vec<Tensor>> {
        self.slot.lock().take()
    }

    /// Whether the inputs are still there to run.
    pub fn is_live(&self) -> bool {
        self.slot.lock().is_some()
    }

    /// Drops the inputs.
    pub fn cancel(&self) {
        drop(self.take());
    }
}

/// Held by the caller while it waits: dropping it unanswered cancels.
#[derive(Debug)]
pub struct CancelOnDrop(pub Arc<Payload>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn the_first_to_act_wins_and_cancelling_drops_the_inputs() {
        let data = Bytes::from(vec![0u8; 64]);
        let tensor = Tensor::new("X", crate::datatype::DataType::Uint8, vec![64], data.clone());
        let payload = Payload::new(vec![tensor]);
        let guard = CancelOnDrop(Arc::clone(&payload));
        assert!(payload.is_live());
        assert!(!data.is_unique(), "the payload holds the data");
        drop(guard);
        assert!(!payload.is_live());
        assert!(payload.take().is_none());
        assert!(data.is_unique(), "cancelled inputs are dropped at once");

        let payload = Payload::new(Vec::new());
        let guard = CancelOnDrop(Arc::clone(&payload));
        assert!(payload.take().is_some());
        drop(guard); // after the instance took them: nothing to do
        assert!(payload.take().is_none());
    }
}
