//! Opening a gRPC client of `inference.GRPCInferenceService`, and the
//! load generator's own ModelInfer call on it.
//!
//! One tonic `Channel` per worker: a channel is one HTTP/2 connection, and
//! sharing one would multiplex every worker onto a single socket (and a
//! single server connection task), which is not the load being asked for.
//!
//! The generated client encodes its message on every call: a clone of the
//! request and a prost pass over it, per request, which made nereid-perf
//! slower than the servers it measured (33k requests/s against the echo
//! server where the server could answer more). [`Infer`] sends the
//! request's bytes, encoded once for the run, and decodes only the answer.

use bytes::{BufMut, Bytes};
use http::uri::PathAndQuery;
use nereid_proto::inference::ModelInferResponse;
use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};
use crate::http_client::authority;

pub type GrpcClient = GrpcInferenceServiceClient<Channel>;

/// Large tensors are legitimate; tonic's 4 MiB default is not a limit the
/// server under test would have.
const MAX_MESSAGE: usize = 1 << 30;

/// Connects one channel (one HTTP/2 connection) to `url` (`host:port` or
/// `http://host:port`).
pub async fn connect_channel(url: &str) -> Result<Channel> {
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

/// ModelInfer with a request encoded once (see the module's doc).
#[derive(Debug, Clone)]
pub struct Infer {
    grpc: tonic::client::Grpc<Channel>,
}

impl Infer {
    pub fn new(channel: Channel) -> Self {
        Infer {
            grpc: tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE),
        }
    }

    /// Sends `encoded`, a whole protobuf `ModelInferRequest`.
    pub async fn call(&mut self, encoded: Bytes) -> std::result::Result<ModelInferResponse, tonic::Status> {
        self.grpc
            .ready()
            .await
            .map_err(|e| tonic::Status::unavailable(format!("transport not ready: {e}")))?;
        let path = PathAndQuery::from_static(MODEL_INFER);
        let response = self
            .grpc
            .unary(tonic::Request::new(encoded), path, EncodedCodec)
            .await?;
        Ok(response.into_inner())
    }
}

/// Writes a message that is already encoded; decodes `ModelInferResponse`.
#[derive(Debug, Clone, Copy, Default)]
struct EncodedCodec;

impl Codec for EncodedCodec {
    type Encode = Bytes;
    type Decode = ModelInferResponse;
    type Encoder = EncodedCodec;
    type Decoder = EncodedCodec;

    fn encoder(&mut self) -> Self::Encoder {
        EncodedCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        EncodedCodec
    }
}

impl Encoder for EncodedCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> std::result::Result<(), Self::Error> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for EncodedCodec {
    type Item = ModelInferResponse;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> std::result::Result<Option<Self::Item>, Self::Error> {
        ModelInferResponse::decode(src)
            .map(Some)
            .map_err(|e| tonic::Status::internal(format!("undecodable ModelInferResponse: {e}")))
    }
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
