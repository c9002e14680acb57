//! How far one model folder's fetch is: bytes in all, and bytes in place.
//!
//! Shared between the fetch and whoever reports it (`nereid-fetch` serves
//! it to the operator, which shows it in the InferenceModel's status while
//! a large model downloads). Counters only: reading them never waits for
//! the download.

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct FetchProgress {
    total: AtomicU64,
    done: AtomicU64,
}

impl FetchProgress {
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes fetched so far and bytes in all (0 until the folder is listed).
    pub fn snapshot(&self) -> (u64, u64) {
        let total = self.total.load(Ordering::Relaxed);
        // A retried download counts its bytes again until it is rewound,
        // so `done` may briefly pass `total`.
        (self.done.load(Ordering::Relaxed).min(total), total)
    }

    /// The folder's size, once listed.
    pub(crate) fn set_total(&self, bytes: u64) {
        self.total.store(bytes, Ordering::Relaxed);
    }

    pub(crate) fn add(&self, bytes: u64) {
        self.done.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Takes back what a failed download attempt had counted.
    pub(crate) fn rewind(&self, bytes: u64) {
        let _ = self.done.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |done| {
            Some(done.saturating_sub(bytes))
        });
    }
}
