//! The crate's one error type.
//!
//! The load generator never aborts a run on a failed request: it counts it
//! and keeps the first message. `kind()` is the stable label that groups
//! failures (a reconnect is due after `transport` and `timeout`, not after an
//! error status the server answered cleanly).

/// What went wrong, from bad flags to a server that answered wrongly.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// A flag, input-data file or tensor that cannot be used.
    #[error("{0}")]
    Invalid(String),
    /// Connecting, sending or receiving failed.
    #[error("{0}")]
    Transport(String),
    /// The server answered with an error (non-2xx HTTP, gRPC status).
    #[error("{0}")]
    Status(String),
    /// The server answered 2xx/OK but not with what was asked for.
    #[error("{0}")]
    Protocol(String),
    /// No answer within the request timeout.
    #[error("request timed out after {0} ms")]
    Timeout(u64),
}

impl Error {
    /// A stable, lower-case label for the error's kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Invalid(_) => "invalid",
            Error::Transport(_) => "transport",
            Error::Status(_) => "status",
            Error::Protocol(_) => "protocol",
            Error::Timeout(_) => "timeout",
        }
    }

    /// Whether the connection that saw this error must be replaced: after a
    /// timeout or transport failure a late answer could still arrive on it.
    pub fn needs_reconnect(&self) -> bool {
        matches!(self, Error::Transport(_) | Error::Timeout(_))
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
