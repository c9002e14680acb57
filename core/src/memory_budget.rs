//! A global cap on the bytes of request data the server holds at once.
//!
//! Each front end limits one message (`--http-max-input-size`,
//! `--grpc-max-message-size`), but N concurrent maximum-size requests would
//! still need N times that. Every byte of request data is therefore reserved
//! here before it is held: body frames as they arrive, decompressed bodies as
//! they inflate, typed buffers decoded from JSON before they are allocated,
//! inputs read from a shared memory region before they are copied. A
//! [`Reservation`] travels with the request's inputs and gives its bytes
//! back when they are dropped (answered, failed or cancelled), so the cap
//! bounds what is really resident. An HTTP answer is reserved as well: at
//! its worst-case size before it is written, then at what was written until
//! it has been sent.
//!
//! Nothing ever waits for room: a request that does not fit is refused at
//! once (HTTP 503, gRPC RESOURCE_EXHAUSTED), which is load shedding, not
//! queueing, so a flood cannot pile up memory in waiters either.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{Error, ErrorKind};

/// The shared count of reserved bytes against a limit.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
}

impl MemoryBudget {
    /// A budget of `limit` bytes; 0 means unlimited.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(MemoryBudget {
            limit: if limit == 0 { usize::MAX } else { limit },
            used: AtomicUsize::new(0),
        })
    }

    /// Bytes reserved right now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// An empty reservation that can grow against this budget.
    pub fn reservation(self: &Arc<Self>) -> Reservation {
        Reservation {
            budget: Some(Arc::clone(self)),
            bytes: 0,
        }
    }

    fn try_take(&self, bytes: usize) -> bool {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(bytes).filter(|n| *n <= self.limit) else {
                return false;
            };
            match self
                .used
                .compare_exchange_weak(used, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => return true,
                Err(actual) => used = actual,
            }
        }
    }

    fn take_anyway(&self, bytes: usize) {
        self.used.fetch_add(bytes, Ordering::AcqRel);
    }

    fn give_back(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// Bytes held by one request; returned to the budget on drop.
///
/// The default reservation belongs to no budget and never refuses: requests
/// built in-process carry one, in tests and for each step of an ensemble
/// (the client's request to the ensemble holds its reservation while the
/// ensemble runs; the tensors passed between steps are not counted apart).
#[derive(Debug, Default)]
pub struct Reservation {
    budget: Option<Arc<MemoryBudget>>,
    bytes: usize,
}

/// Why a reservation could not grow.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the server is holding its maximum of {limit} bytes of request data (--max-in-flight-bytes); {wanted} more bytes were refused, try again later"
)]
pub struct Exhausted {
    pub limit: usize,
    pub wanted: usize,
}

impl From<Exhausted> for Error {
    fn from(e: Exhausted) -> Self {
        Error::new(ErrorKind::ResourceExhausted, e.to_string())
    }
}

impl Reservation {
    /// Reserves `bytes` more, or refuses without changing anything.
    pub fn grow(&mut self, bytes: usize) -> Result<(), Exhausted> {
        let Some(budget) = &self.budget else {
            return Ok(());
        };
        if bytes == 0 {
            return Ok(());
        }
        if !budget.try_take(bytes) {
            return Err(Exhausted {
                limit: budget.limit,
                wanted: bytes,
            });
        }
        self.bytes += bytes;
        Ok(())
    }

    /// Counts `bytes` more without ever refusing, for memory that exists
    /// already, where refusing would only waste the work; it still makes the
    /// budget refuse new requests while it is held. Only the tests call it
    /// now: an HTTP answer, which it was for, is reserved with
    /// [`Reservation::grow`] at its worst case before it is written, and
    /// refused when that does not fit.
    pub fn charge(&mut self, bytes: usize) {
        if let Some(budget) = &self.budget {
            budget.take_anyway(bytes);
            self.bytes += bytes;
        }
    }

    /// Gives back all but `bytes` (when it holds more): for memory reserved
    /// for a worst case that turned out smaller.
    pub fn shrink_to(&mut self, bytes: usize) {
        if let Some(budget) = &self.budget
            && self.bytes > bytes
        {
            budget.give_back(self.bytes - bytes);
            self.bytes = bytes;
        }
    }

    /// Takes everything out, leaving this reservation empty (same budget).
    pub fn take(&mut self) -> Reservation {
        Reservation {
            budget: self.budget.clone(),
            bytes: std::mem::take(&mut self.bytes),
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(budget) = &self.budget
            && self.bytes > 0
        {
            budget.give_back(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_past_the_limit_and_frees_on_drop() {
        let budget = MemoryBudget::new(100);
        let mut a = budget.reservation();
        a.grow(60).unwrap();
        let mut b = budget.reservation();
        let refused = b.grow(41).unwrap_err();
        assert_eq!(refused, Exhausted { limit: 100, wanted: 41 });
        assert_eq!(b.bytes(), 0, "a refused grow holds nothing");
        b.grow(40).unwrap();
        assert_eq!(budget.used(), 100);
        drop(a);
        assert_eq!(budget.used(), 40);
        b.grow(60).unwrap();
        drop(b);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn take_moves_bytes_and_a_charge_is_never_refused() {
        let budget = MemoryBudget::new(100);
        let mut a = budget.reservation();
        a.grow(30).unwrap();
        let taken = a.take();
        assert_eq!((a.bytes(), taken.bytes(), budget.used()), (0, 30, 30));
        drop(taken);
        assert_eq!(budget.used(), 0);

        let mut answer = budget.reservation();
        answer.charge(150);
        assert_eq!(budget.used(), 150, "held memory is counted even past the limit");
        assert!(
            budget.reservation().grow(1).is_err(),
            "and new requests are refused meanwhile"
        );
        drop(answer);
        assert_eq!(budget.used(), 0);
    }

    #[test]
    fn zero_means_unlimited() {
        let budget = MemoryBudget::new(0);
        let mut r = budget.reservation();
        r.grow(usize::MAX / 2).unwrap();
        r.grow(usize::MAX / 4).unwrap();
    }
}
