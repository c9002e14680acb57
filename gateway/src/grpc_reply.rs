//! Answers the gateway makes itself on the gRPC port: a message with an OK
//! status, or a status alone ("trailers-only", as gRPC sends an error that
//! comes before any message).

use http::{HeaderMap, HeaderValue, Response, header};
use percent_encoding::{AsciiSet, CONTROLS, utf8_percent_encode};

use crate::reply_body::Reply;

/// gRPC status codes the gateway answers with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Code {
    Ok = 0,
    InvalidArgument = 3,
    DeadlineExceeded = 4,
    NotFound = 5,
    FailedPrecondition = 9,
    ResourceExhausted = 8,
    Unimplemented = 12,
    Internal = 13,
    Unavailable = 14,
    Unauthenticated = 16,
}

const GRPC: HeaderValue = HeaderValue::from_static("application/grpc");

/// `message` as a gRPC answer, with status OK.
pub fn message(message: &impl prost::Message) -> Response<Reply> {
    let frame = match nereid_proto::frame::encode(message) {
        Ok(frame) => frame,
        Err(e) => return status(Code::Internal, &e.to_string()),
    };
    let mut trailers = HeaderMap::new();
    trailers.insert("grpc-status", HeaderValue::from(Code::Ok as i32));
    let mut response = Response::new(Reply::Local {
        data: Some(frame),
        trailers: Some(trailers),
    });
    response.headers_mut().insert(header::CONTENT_TYPE, GRPC);
    response
}

/// A status alone, with its message.
pub fn status(code: Code, text: &str) -> Response<Reply> {
    let mut response = Response::new(Reply::empty());
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, GRPC);
    headers.insert("grpc-status", HeaderValue::from(code as i32));
    if let Ok(value) = HeaderValue::from_str(&percent_encode(text)) {
        headers.insert("grpc-message", value);
    }
    response
}

/// What `grpc-message` percent-encodes: every byte outside printable ASCII
/// (the controls here, every non-ASCII byte always), and `%` itself.
const GRPC_MESSAGE: &AsciiSet = &CONTROLS.add(b'%');

fn percent_encode(text: &str) -> String {
    utf8_percent_encode(text, GRPC_MESSAGE).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_percent_encoded() {
        assert_eq!(percent_encode("no ready replicas: 0/2"), "no ready replicas: 0/2");
        assert_eq!(percent_encode("100% \"é\"\n"), "100%25 \"%C3%A9\"%0A");
        let response = status(Code::NotFound, "unknown model \"x\"");
        assert_eq!(response.headers()["grpc-status"], "5");
        assert_eq!(response.headers()["grpc-message"], "unknown model \"x\"");
    }
}
