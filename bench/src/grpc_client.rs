//! Opening a gRPC client of `inference.GRPCInferenceService`, and the
//! load generator's own ModelInfer call on it.
//!
//! One connection per worker: sharing one would multiplex every worker onto
//! a single socket (and a single server connection task), which is not the
//! load being asked for.
//!
//! The generated client encodes its message on every call: a clone of the
//! request and a prost pass over it, per request, which made nereid-perf
//! slower than the servers it measured (33k requests/s against the echo
//! server where the server could answer more). [`Infer`] sends the request
//! framed once for the run, and decodes only the answer.
//!
//! It also skips tonic's channel. A call through a channel crossed three
//! tasks before its bytes reached the socket (the channel's buffer worker,
//! hyper's connection task, and a task hyper spawns per call for the answer),
//! and the headers and the message left in separate writes. With the h2
//! crate the worker's own task queues both frames and the connection task
//! writes them together. At 4 KiB requests, c=64, against the echo server
//! the client spent 32 us per call through the channel, more than the
//! server it measured, and drove the echo at 33k calls/s; with h2 it
//! spends 17 us and drives the echo at 49k/s (docs/benchmarks-log.md,
//! entry 16).

use bytes::{Bytes, BytesMut};
use h2::RecvStream;
use h2::client::SendRequest;
use http::HeaderValue;
use http::header::{CONTENT_TYPE, TE};
use nereid_proto::frame::{PREFIX_LEN, Prefix};
use nereid_proto::inference::ModelInferResponse;
use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use prost::Message;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};
use crate::http_client::authority;

pub type GrpcClient = GrpcInferenceServiceClient<Channel>;

/// Large tensors are legitimate; tonic's 4 MiB default is not a limit the
/// server under test would have.
const MAX_MESSAGE: usize = 1 << 30;

/// Connects one channel (one HTTP/2 connection) to `url` (`host:port` or
/// `http://host:port`).
async fn connect_channel(url: &str) -> Result<Channel> {
    let uri = format!("http://{}", authority(url));
    Endpoint::from_shared(uri.clone())
        .map_err(|e| Error::Invalid(format!("invalid gRPC URL '{uri}': {e}")))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| Error::Transport(format!("gRPC connect to {uri}: {e}")))
}

/// Connects the generated client, for everything but the measured calls.
pub async fn connect(url: &str) -> Result<GrpcClient> {
    Ok(GrpcInferenceServiceClient::new(connect_channel(url).await?)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

const MODEL_INFER: &str = "/inference.GRPCInferenceService/ModelInfer";

/// hyper's HTTP/2 client windows (2 MiB per stream, 5 MiB per connection),
/// which the tonic channel this replaced had: large answers need no window
/// updates mid-answer.
const STREAM_WINDOW: u32 = 2 << 20;
const CONNECTION_WINDOW: u32 = 5 << 20;

/// ModelInfer calls on one HTTP/2 connection, sent with the h2 crate
/// directly (see the module's doc). Cloning shares the connection.
#[derive(Debug, Clone)]
pub struct Infer {
    sender: SendRequest<Bytes>,
    uri: http::Uri,
}

impl Infer {
    /// Opens a TCP connection (Nagle off) and runs the HTTP/2 handshake; the
    /// connection's I/O is driven by a task that ends when every clone of
    /// this value is dropped.
    pub async fn connect(url: &str) -> Result<Self> {
        let authority = authority(url);
        let uri = format!("http://{authority}{MODEL_INFER}")
            .parse::<http::Uri>()
            .map_err(|e| Error::Invalid(format!("invalid gRPC URL '{url}': {e}")))?;
        let stream = TcpStream::connect(authority)
            .await
            .map_err(|e| Error::Transport(format!("gRPC connect to {authority}: {e}")))?;
        stream.set_nodelay(true).map_err(|e| Error::Transport(e.to_string()))?;
        let (sender, connection) = h2::client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake::<_, Bytes>(stream)
            .await
            .map_err(|e| Error::Transport(format!("HTTP/2 handshake with {authority}: {e}")))?;
        tokio::spawn(async move {
            // Errors surface on the next call; nothing to do with them here.
            let _ = connection.await;
        });
        Ok(Infer { sender, uri })
    }

    /// Sends `framed`, a whole `ModelInferRequest` as one gRPC message
    /// ([`nereid_proto::frame::encode`]), and decodes the answer.
    pub async fn call(&mut self, framed: Bytes) -> Result<ModelInferResponse> {
        let transport = |e: h2::Error| Error::Transport(format!("gRPC: {e}"));
        std::future::poll_fn(|cx| self.sender.poll_ready(cx))
            .await
            .map_err(transport)?;
        let request = http::Request::post(self.uri.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/grpc"))
            .header(TE, HeaderValue::from_static("trailers"))
            .body(())
            .map_err(|e| Error::Invalid(format!("invalid gRPC request: {e}")))?;
        let (response, mut body) = self.sender.send_request(request, false).map_err(transport)?;
        body.send_data(framed, true).map_err(transport)?;
        let (head, mut body) = response.await.map_err(transport)?.into_parts();
        if head.status != http::StatusCode::OK {
            return Err(Error::Status(format!(
                "gRPC call answered HTTP {}",
                head.status.as_u16()
            )));
        }
        // A trailers-only answer (an error) carries its status in the headers.
        if head.headers.contains_key(GRPC_STATUS) {
            check_status(&head.headers)?;
            return Err(Error::Protocol("gRPC answer has a status but no message".into()));
        }
        let message = read_message(&mut body).await?;
        let trailers = body
            .trailers()
            .await
            .map_err(transport)?
            .ok_or_else(|| Error::Protocol("gRPC answer ended without trailers".into()))?;
        check_status(&trailers)?;
        decode(message)
    }
}

/// The answer's DATA frames. Usually there is one, kept as it came; the
/// frames are joined only if more follow, up to the message size limit.
async fn read_message(body: &mut RecvStream) -> Result<Bytes> {
    let transport = |e: h2::Error| Error::Transport(format!("gRPC: {e}"));
    let mut next = async || -> Result<Option<Bytes>> {
        let Some(chunk) = body.data().await else {
            return Ok(None);
        };
        let chunk = chunk.map_err(transport)?;
        body.flow_control().release_capacity(chunk.len()).map_err(transport)?;
        Ok(Some(chunk))
    };
    let Some(first) = next().await? else {
        return Ok(Bytes::new());
    };
    let Some(second) = next().await? else {
        return Ok(first);
    };
    let mut joined = BytesMut::from(&first[..]);
    let mut chunk = second;
    loop {
        if joined.len() + chunk.len() > PREFIX_LEN + MAX_MESSAGE {
            return Err(Error::Protocol(format!("gRPC answer longer than {MAX_MESSAGE} bytes")));
        }
        joined.extend_from_slice(&chunk);
        match next().await? {
            Some(more) => chunk = more,
            None => return Ok(joined.freeze()),
        }
    }
}

const GRPC_STATUS: &str = "grpc-status";

/// An error for a non-zero `grpc-status`, named like tonic names its codes.
fn check_status(headers: &http::HeaderMap) -> Result<()> {
    let code = headers
        .get(GRPC_STATUS)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .ok_or_else(|| Error::Protocol("gRPC answer without a valid grpc-status".into()))?;
    if code == 0 {
        return Ok(());
    }
    // Percent-encoded, as gRPC over HTTP/2 says.
    let message = headers
        .get("grpc-message")
        .map(|v| {
            percent_encoding::percent_decode(v.as_bytes())
                .decode_utf8_lossy()
                .into_owned()
        })
        .unwrap_or_default();
    Err(Error::Status(format!(
        "gRPC {:?}: {message}",
        tonic::Code::from_i32(code)
    )))
}

/// One uncompressed length-prefixed message, decoded.
fn decode(framed: Bytes) -> Result<ModelInferResponse> {
    let Some(prefix) = Prefix::read(&framed) else {
        return Err(Error::Protocol(format!(
            "gRPC answer of {} bytes has no message",
            framed.len()
        )));
    };
    if prefix.flag != 0 {
        return Err(Error::Protocol(
            "gRPC answer is compressed, which was not asked for".into(),
        ));
    }
    let message = framed.slice(PREFIX_LEN..);
    if prefix.length != message.len() {
        return Err(Error::Protocol(format!(
            "gRPC message says {} bytes but {} followed",
            prefix.length,
            message.len()
        )));
    }
    ModelInferResponse::decode(message).map_err(|e| Error::Protocol(format!("undecodable ModelInferResponse: {e}")))
}

/// A gRPC failure status as a counted error.
pub fn status_error(status: &tonic::Status) -> Error {
    match status.code() {
        tonic::Code::Unavailable | tonic::Code::Unknown if status.message().contains("transport") => {
            Error::Transport(format!("gRPC {:?}: {}", status.code(), status.message()))
        }
        code => Error::Status(format!("gRPC {code:?}: {}", status.message())),
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderMap;
    use nereid_proto::inference::model_infer_response::InferOutputTensor;

    use super::*;

    #[test]
    fn a_framed_answer_decodes_and_a_malformed_one_does_not() {
        let answer = ModelInferResponse {
            model_name: "m".into(),
            outputs: vec![InferOutputTensor {
                name: "OUTPUT0".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let framed = nereid_proto::frame::encode(&answer).unwrap();
        assert_eq!(decode(framed.clone()).unwrap(), answer);

        let e = decode(framed.slice(..3)).unwrap_err();
        assert!(e.to_string().contains("has no message"), "{e}");
        let e = decode(framed.slice(..framed.len() - 1)).unwrap_err();
        assert!(e.to_string().contains("followed"), "{e}");
        let mut compressed = framed.to_vec();
        compressed[0] = 1;
        let e = decode(Bytes::from(compressed)).unwrap_err();
        assert!(e.to_string().contains("compressed"), "{e}");
    }

    #[test]
    fn a_status_other_than_ok_is_an_error_with_its_decoded_message() {
        let mut headers = HeaderMap::new();
        headers.insert(GRPC_STATUS, HeaderValue::from_static("0"));
        check_status(&headers).unwrap();

        headers.insert(GRPC_STATUS, HeaderValue::from_static("3"));
        headers.insert("grpc-message", HeaderValue::from_static("unexpected%20shape%20%5B1%5D"));
        let e = check_status(&headers).unwrap_err();
        assert_eq!(e.kind(), "status");
        assert_eq!(e.to_string(), "gRPC InvalidArgument: unexpected shape [1]");

        headers.insert(GRPC_STATUS, HeaderValue::from_static("ok"));
        assert_eq!(check_status(&headers).unwrap_err().kind(), "protocol");
    }
}
