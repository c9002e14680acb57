//! A worker's connection to the server, and sending one infer on it.
//!
//! One enum instead of a trait object: three transports, no dynamic
//! dispatch or boxed futures on the per-request path. A response counts as
//! a success only if it is 2xx / OK and names the requested outputs.

use http::Method;
use nereid_proto::inference::{ModelInferRequest, ModelInferResponse, ModelStreamInferResponse};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::binary_ext::{self, HEADER_LENGTH};
use crate::error::{Error, Result};
use crate::grpc_client::{self, Infer};
use crate::http_client::{self, HttpConnection};
use crate::request::{Payload, PreparedRequest, Protocol};

/// How workers reach the server.
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub url: String,
    pub protocol: Protocol,
    /// gRPC only: one bidirectional ModelStreamInfer stream per connection.
    pub streaming: bool,
    /// gRPC only: the one connection every worker shares, when given.
    pub shared: Option<Infer>,
}

/// An open bidirectional stream: requests go in, responses come out in
/// order (one per request for a non-decoupled model).
pub struct GrpcStream {
    requests: mpsc::Sender<ModelInferRequest>,
    responses: tonic::Streaming<ModelStreamInferResponse>,
}

pub enum Connection {
    Http(HttpConnection),
    Grpc(Infer),
    Stream(GrpcStream),
}

impl Connection {
    pub async fn open(endpoint: &Endpoint) -> Result<Self> {
        match (endpoint.protocol, endpoint.streaming) {
            (Protocol::Http, _) => Ok(Connection::Http(HttpConnection::connect(&endpoint.url).await?)),
            (Protocol::Grpc, false) => match &endpoint.shared {
                Some(shared) => Ok(Connection::Grpc(shared.clone())),
                None => Ok(Connection::Grpc(Infer::connect(&endpoint.url).await?)),
            },
            (Protocol::Grpc, true) => {
                let mut client = grpc_client::connect(&endpoint.url).await?;
                // Capacity 1: a worker has one request in flight at a time.
                let (requests, rx) = mpsc::channel(1);
                let responses = client
                    .model_stream_infer(ReceiverStream::new(rx))
                    .await
                    .map_err(|s| grpc_client::status_error(&s))?
                    .into_inner();
                Ok(Connection::Stream(GrpcStream { requests, responses }))
            }
        }
    }

    /// Sends one request and checks its response.
    pub async fn infer(&mut self, request: &PreparedRequest) -> Result<()> {
        let expected = &request.expected_outputs;
        match (self, &request.payload) {
            (Connection::Http(conn), Payload::Http { path, body, header_len }) => {
                let extra: &[(&'static str, http::HeaderValue)] = match header_len {
                    Some(v) => &[(HEADER_LENGTH, v.clone())],
                    None => &[],
                };
                let req = conn.build(Method::POST, path, body.body.clone(), extra)?;
                let response = conn.send(req).await?;
                if !response.status.is_success() {
                    return Err(http_client::status_error(&response));
                }
                let header_len =
                    binary_ext::parse_header_len(response.headers.get(HEADER_LENGTH).map(|v| v.as_bytes()))?;
                binary_ext::check_response(&response.body, header_len, expected)
            }
            (Connection::Grpc(client), Payload::Grpc { framed, .. }) => {
                let response = client.call(framed.clone()).await?;
                check_grpc_response(&response, expected)
            }
            (Connection::Stream(stream), Payload::Grpc { message, .. }) => {
                stream
                    .requests
                    .send(message.clone())
                    .await
                    .map_err(|_| Error::Transport("gRPC stream closed".into()))?;
                let answer = stream
                    .responses
                    .message()
                    .await
                    // A failed stream is over: say so, so the worker opens a new one.
                    .map_err(|s| Error::Transport(format!("gRPC stream ended: {:?}: {}", s.code(), s.message())))?
                    .ok_or_else(|| Error::Transport("gRPC stream ended".into()))?;
                if !answer.error_message.is_empty() {
                    return Err(Error::Status(format!("stream error: {}", answer.error_message)));
                }
                let response = answer
                    .infer_response
                    .ok_or_else(|| Error::Protocol("stream response has no infer_response".into()))?;
                check_grpc_response(&response, expected)
            }
            _ => Err(Error::Invalid("request and connection protocols differ".into())),
        }
    }
}

/// The gRPC twin of `binary_ext::check_response`.
pub fn check_grpc_response(response: &ModelInferResponse, expected: &[String]) -> Result<()> {
    if response.outputs.is_empty() {
        return Err(Error::Protocol("response has no outputs".into()));
    }
    if let Some(name) = expected
        .iter()
        .find(|name| !response.outputs.iter().any(|o| &o.name == *name))
    {
        return Err(Error::Protocol(format!("response lacks output '{name}'")));
    }
    let raw = response.raw_output_contents.len();
    if raw != 0 && raw != response.outputs.len() {
        return Err(Error::Protocol(format!(
            "{} outputs but {raw} raw_output_contents",
            response.outputs.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use nereid_proto::inference::model_infer_response::InferOutputTensor;

    use super::*;

    fn response(names: &[&str], raw: usize) -> ModelInferResponse {
        ModelInferResponse {
            outputs: names
                .iter()
                .map(|n| InferOutputTensor {
                    name: n.to_string(),
                    ..Default::default()
                })
                .collect(),
            raw_output_contents: vec![bytes::Bytes::new(); raw],
            ..Default::default()
        }
    }

    #[test]
    fn grpc_response_checks() {
        check_grpc_response(&response(&["A"], 1), &["A".into()]).unwrap();
        check_grpc_response(&response(&["A", "B"], 0), &[]).unwrap();
        assert!(check_grpc_response(&response(&[], 0), &[]).is_err());
        assert!(check_grpc_response(&response(&["A"], 1), &["B".into()]).is_err());
        assert!(check_grpc_response(&response(&["A", "B"], 1), &[]).is_err());
    }
}
