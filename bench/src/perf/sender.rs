//! Sending one request on a worker's connection, bounded and recorded.
//!
//! Shared by both load modes. Every connect and every request runs under
//! the request timeout; a timeout or transport failure drops the
//! connection (a late answer could otherwise arrive on it and be taken for
//! the next request's), and the next send opens a fresh one.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::connection::{Connection, Endpoint};
use crate::error::Error;
use crate::perf::recorder::Recorder;
use crate::request::PreparedRequest;

/// Pause after a failed connect, so a server that is down is not hammered
/// by a tight reconnect loop.
const CONNECT_BACKOFF: Duration = Duration::from_millis(50);

/// Everything a worker needs; cheap to clone (all shared).
#[derive(Clone)]
pub struct Sender {
    pub endpoint: Arc<Endpoint>,
    pub request: Arc<PreparedRequest>,
    pub recorder: Arc<Recorder>,
    pub timeout: Duration,
}

impl Sender {
    fn timeout_error(&self) -> Error {
        Error::Timeout(u64::try_from(self.timeout.as_millis()).unwrap_or(u64::MAX))
    }

    /// Opens a connection; a failure is recorded and followed by a short
    /// back-off, and yields `None`.
    pub async fn connect(&self) -> Option<Connection> {
        let error = match tokio::time::timeout(self.timeout, Connection::open(&self.endpoint)).await {
            Ok(Ok(conn)) => return Some(conn),
            Ok(Err(e)) => e,
            Err(_) => self.timeout_error(),
        };
        self.recorder.failure(&error);
        tokio::time::sleep(CONNECT_BACKOFF).await;
        None
    }

    /// Sends one request and records the outcome. Returns whether the
    /// connection may be used again.
    pub async fn send(&self, conn: &mut Connection) -> bool {
        let start = Instant::now();
        let result = match tokio::time::timeout(self.timeout, conn.infer(&self.request)).await {
            Ok(result) => result,
            Err(_) => Err(self.timeout_error()),
        };
        match result {
            Ok(()) => {
                self.recorder.success(start.elapsed());
                true
            }
            Err(e) => {
                self.recorder.failure(&e);
                !e.needs_reconnect()
            }
        }
    }
}
