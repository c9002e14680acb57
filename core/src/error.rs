//! The one error type of the server core.
//!
//! Every failure a client can see is one of a handful of kinds, the same
//! kinds Triton uses (`TRITONSERVER_Error_Code`). The core only says *what*
//! went wrong; the front ends turn a kind into an HTTP status or a gRPC code
//! in exactly one place each (`http::error`, `grpc::status`).

/// What kind of failure, independent of the wire protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// The request is malformed or does not match the model (HTTP 400, gRPC INVALID_ARGUMENT).
    InvalidArgument,
    /// The model or version is not known (HTTP 404, gRPC NOT_FOUND).
    NotFound,
    /// The model exists but cannot serve now: not loaded, queue full.
    Unavailable,
    /// The server is starting or shutting down and ran nothing of the
    /// request: HTTP 503 and gRPC UNAVAILABLE like [`ErrorKind::Unavailable`],
    /// marked with [`nereid_proto::NOT_SERVING_HEADER`] so that a router may
    /// send the request to another replica.
    NotServing,
    /// The request asks for something the server does not support.
    Unsupported,
    /// The server failed while handling a valid request.
    Internal,
    /// The resource being created already exists.
    AlreadyExists,
    /// The server is at a limit it sheds load at (request bytes in flight,
    /// `--max-in-flight-bytes`; shared memory regions registered): HTTP 503,
    /// gRPC RESOURCE_EXHAUSTED. Retrying later may work. (A connection past
    /// its port's cap is closed at once, with no error to carry.)
    ResourceExhausted,
    /// The API is restricted and the request lacks its header (HTTP 403,
    /// gRPC PERMISSION_DENIED).
    PermissionDenied,
}

impl ErrorKind {
    /// A stable label: a failed request's trace span carries it as
    /// `error.kind`. Metrics do not use it; they count a failure under
    /// Triton's `reason` instead (`metrics::model::FailureReason`).
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::InvalidArgument => "invalid_argument",
            ErrorKind::NotFound => "not_found",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::NotServing => "not_serving",
            ErrorKind::Unsupported => "unsupported",
            ErrorKind::Internal => "internal",
            ErrorKind::AlreadyExists => "already_exists",
            ErrorKind::ResourceExhausted => "resource_exhausted",
            ErrorKind::PermissionDenied => "permission_denied",
        }
    }
}

/// An error with its kind and a message meant for the client.
///
/// Messages follow Triton's wording where clients are known to match on it
/// (for example "Request for unknown model").
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn permission_denied(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::PermissionDenied, message)
    }

    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefixes the message with context, keeping the kind.
    pub fn context(self, prefix: impl std::fmt::Display) -> Self {
        Error {
            kind: self.kind,
            message: format!("{prefix}: {}", self.message),
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
