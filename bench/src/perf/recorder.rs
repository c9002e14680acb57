//! Where workers record each request's outcome.
//!
//! One short `std::sync::Mutex` section per completed request (a push onto
//! a `Vec`): uncontended it costs tens of nanoseconds, far below any
//! request, and it never waits across an `.await`, so a std mutex is the
//! right tool (tokio's would only add overhead). The measuring task swaps
//! the whole window out at the end of each interval, so a request counts in
//! the window in which it completed.

use std::sync::Mutex;
use std::time::Duration;

use crate::error::Error;

/// Outcomes recorded during one measurement window.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Window {
    /// Latency of each successful request, in microseconds.
    pub latencies_us: Vec<u64>,
    pub errors: u64,
    pub first_error: Option<String>,
    /// Open loop: requests sent noticeably after their scheduled time.
    pub late: u64,
}

#[derive(Debug, Default)]
pub struct Recorder {
    window: Mutex<Window>,
}

impl Recorder {
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut Window) -> R) -> R {
        // A poisoned lock only means a worker panicked mid-push; the data
        // is still a valid Window.
        let mut guard = self.window.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    pub fn success(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.with(|w| w.latencies_us.push(us));
    }

    pub fn failure(&self, error: &Error) {
        self.with(|w| {
            w.errors += 1;
            if w.first_error.is_none() {
                w.first_error = Some(format!("{}: {error}", error.kind()));
            }
        });
    }

    pub fn late(&self) {
        self.with(|w| w.late += 1);
    }

    /// Takes the window so far and starts a new one, pre-sized like the
    /// last so pushes do not reallocate on the hot path.
    pub fn take(&self) -> Window {
        self.with(|w| {
            let capacity = w.latencies_us.len() + w.latencies_us.len() / 4;
            std::mem::replace(
                w,
                Window {
                    latencies_us: Vec::with_capacity(capacity),
                    ..Window::default()
                },
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_and_swaps() {
        let r = Recorder::new();
        r.success(Duration::from_micros(120));
        r.failure(&Error::Timeout(5));
        r.failure(&Error::Status("second".into()));
        r.late();
        let w = r.take();
        assert_eq!(w.latencies_us, vec![120]);
        assert_eq!(w.errors, 2);
        assert_eq!(w.first_error.as_deref(), Some("timeout: request timed out after 5 ms"));
        assert_eq!(w.late, 1);
        assert_eq!(r.take(), Window::default());
    }
}
