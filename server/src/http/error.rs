//! Core errors as HTTP responses: Triton's status codes and `{"error": ...}`.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::StatusCode;

use crate::error::{Error, ErrorKind};

pub fn status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::InvalidArgument | ErrorKind::AlreadyExists => StatusCode::BAD_REQUEST,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Unavailable | ErrorKind::NotServing | ErrorKind::ResourceExhausted => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        ErrorKind::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorKind::Unsupported => StatusCode::NOT_IMPLEMENTED,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error on its way out of a handler.
pub struct HttpError(pub Error);

impl From<Error> for HttpError {
    fn from(e: Error) -> Self {
        HttpError(e)
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let body = Json(serde_json::json!({ "error": self.0.message() }));
        let mut response = (status(self.0.kind()), body).into_response();
        if self.0.kind() == ErrorKind::NotServing {
            response
                .headers_mut()
                .insert(nereid_proto::NOT_SERVING_HEADER, http::HeaderValue::from_static("1"));
        }
        response
    }
}

/// An error with an explicit status, for failures found by the HTTP layer itself.
pub fn with_status(status: StatusCode, message: impl Into<String>) -> Response {
    (status, Json(serde_json::json!({ "error": message.into() }))).into_response()
}
