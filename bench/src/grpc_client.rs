//! Opening a gRPC client of `inference.GRPCInferenceService`.
//!
//! One tonic `Channel` per worker: a channel is one HTTP/2 connection, and
//! sharing one would multiplex every worker onto a single socket (and a
//! single server connection task), which is not the load being asked for.

use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::error::{Error, Result};
use crate::http_client::authority;

pub type GrpcClient = GrpcInferenceServiceClient<Channel>;

/// Large tensors are legitimate; tonic's 4 MiB default is not a limit the
/// server under test would have.
const MAX_MESSAGE: usize = 1 << 30;

/// Connects one channel to `url` (`host:port` or `http://host:port`).
pub async fn connect(url: &str) -> Result<GrpcClient> {
    let uri = format!("http://{}", authority(url));
    let channel = Endpoint::from_shared(uri.clone())
        .map_err(|e| Error::Invalid(format!("invalid gRPC URL '{uri}': {e}")))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| Error::Transport(format!("gRPC connect to {uri}: {e}")))?;
    Ok(GrpcInferenceServiceClient::new(channel)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
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
