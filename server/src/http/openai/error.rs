//! Errors as OpenAI's clients expect them: `{"error": {"message", "type",
//! "param", "code"}}` with the status the core's error kind maps to.

use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde_json::json;

use super::wire::ErrorBody;
use crate::error::{Error, ErrorKind};

/// An error as OpenAI's JSON: `{"error": {"message", "type", "param", "code"}}`.
pub(super) struct OpenAiError {
    error: Error,
    param: Option<&'static str>,
}

impl From<Error> for OpenAiError {
    fn from(error: Error) -> Self {
        OpenAiError { error, param: None }
    }
}

impl OpenAiError {
    pub(super) fn about(param: &'static str, error: Error) -> Self {
        OpenAiError {
            error,
            param: Some(param),
        }
    }

    pub(super) fn body(&self) -> serde_json::Value {
        let (kind, code) = match self.error.kind() {
            ErrorKind::NotFound => ("invalid_request_error", Some("model_not_found")),
            ErrorKind::InvalidArgument | ErrorKind::AlreadyExists | ErrorKind::Unsupported => {
                ("invalid_request_error", None)
            }
            ErrorKind::Unavailable | ErrorKind::NotServing | ErrorKind::ResourceExhausted => {
                ("server_error", Some("unavailable"))
            }
            ErrorKind::PermissionDenied => ("permission_error", None),
            ErrorKind::Internal => ("server_error", None),
        };
        json!({ "error": ErrorBody { message: self.error.message(), kind, param: self.param, code } })
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        // An unsupported field is the client's mistake here, not a 501.
        let status = match self.error.kind() {
            ErrorKind::Unsupported => StatusCode::BAD_REQUEST,
            kind => crate::http::error::status(kind),
        };
        (status, axum::Json(self.body())).into_response()
    }
}
