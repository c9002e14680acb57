//! nereid-echo's gRPC side: a bare tonic `GRPCInferenceService` whose
//! ModelInfer (and ModelStreamInfer) answer with the inputs as outputs.
//!
//! The echo moves the request's `raw_input_contents` (`Bytes`) into the
//! response's `raw_output_contents`: no tensor byte is copied, so what is
//! measured is tonic, HTTP/2 and protobuf, nothing else.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;

use nereid_proto::inference::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use nereid_proto::inference::model_infer_response::InferOutputTensor;
use nereid_proto::inference::model_metadata_response::TensorMetadata;
use nereid_proto::inference::*;
use tokio::net::TcpListener;
use tokio_stream::{Stream, StreamExt};
use tokio_util::sync::CancellationToken;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

use crate::echo::model::{EchoModel, VERSION};

/// Large tensors are legitimate; tonic's 4 MiB default is not the limit
/// being measured.
const MAX_MESSAGE: usize = 1 << 30;

pub struct EchoService {
    model: Arc<EchoModel>,
}

/// The echo of one request.
pub fn echo(model: &EchoModel, request: ModelInferRequest) -> ModelInferResponse {
    ModelInferResponse {
        model_name: request.model_name,
        model_version: if request.model_version.is_empty() {
            VERSION.to_string()
        } else {
            request.model_version
        },
        id: request.id,
        parameters: HashMap::new(),
        outputs: request
            .inputs
            .into_iter()
            .enumerate()
            .map(|(i, t)| InferOutputTensor {
                name: model.output_name(i),
                datatype: t.datatype,
                shape: t.shape,
                parameters: HashMap::new(),
                contents: t.contents,
            })
            .collect(),
        raw_output_contents: request.raw_input_contents,
    }
}

type EchoStream = Pin<Box<dyn Stream<Item = Result<ModelStreamInferResponse, Status>> + Send>>;

/// Writes the RPCs the echo does not serve, each answering Unimplemented,
/// around the ones it does (an `async_trait` impl cannot take a macro
/// inside it, so the macro writes the whole impl).
macro_rules! echo_service_impl {
    ($($method:ident($req:ident) -> $resp:ident;)*) => {
        #[tonic::async_trait]
        impl GrpcInferenceService for EchoService {
            type ModelStreamInferStream = EchoStream;

            async fn server_live(&self, _: Request<ServerLiveRequest>) -> Result<Response<ServerLiveResponse>, Status> {
                Ok(Response::new(ServerLiveResponse { live: true }))
            }

            async fn server_ready(&self, _: Request<ServerReadyRequest>) -> Result<Response<ServerReadyResponse>, Status> {
                Ok(Response::new(ServerReadyResponse { ready: true }))
            }

            async fn model_ready(&self, _: Request<ModelReadyRequest>) -> Result<Response<ModelReadyResponse>, Status> {
                Ok(Response::new(ModelReadyResponse { ready: true }))
            }

            async fn model_metadata(
                &self,
                request: Request<ModelMetadataRequest>,
            ) -> Result<Response<ModelMetadataResponse>, Status> {
                Ok(Response::new(self.metadata(request.into_inner().name)))
            }

            async fn model_infer(&self, request: Request<ModelInferRequest>) -> Result<Response<ModelInferResponse>, Status> {
                Ok(Response::new(echo(&self.model, request.into_inner())))
            }

            async fn model_stream_infer(
                &self,
                request: Request<Streaming<ModelInferRequest>>,
            ) -> Result<Response<EchoStream>, Status> {
                let model = self.model.clone();
                let responses = request.into_inner().map(move |item| {
                    item.map(|r| ModelStreamInferResponse {
                        error_message: String::new(),
                        infer_response: Some(echo(&model, r)),
                    })
                });
                Ok(Response::new(Box::pin(responses)))
            }

            $(
                async fn $method(&self, _: Request<$req>) -> Result<Response<$resp>, Status> {
                    Err(Status::unimplemented(concat!("nereid-echo does not serve ", stringify!($method))))
                }
            )*
        }
    };
}

echo_service_impl! {
    server_metadata(ServerMetadataRequest) -> ServerMetadataResponse;
    model_config(ModelConfigRequest) -> ModelConfigResponse;
    model_statistics(ModelStatisticsRequest) -> ModelStatisticsResponse;
    repository_index(RepositoryIndexRequest) -> RepositoryIndexResponse;
    repository_model_load(RepositoryModelLoadRequest) -> RepositoryModelLoadResponse;
    repository_model_unload(RepositoryModelUnloadRequest) -> RepositoryModelUnloadResponse;
    system_shared_memory_status(SystemSharedMemoryStatusRequest) -> SystemSharedMemoryStatusResponse;
    system_shared_memory_register(SystemSharedMemoryRegisterRequest) -> SystemSharedMemoryRegisterResponse;
    system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest) -> SystemSharedMemoryUnregisterResponse;
    cuda_shared_memory_status(CudaSharedMemoryStatusRequest) -> CudaSharedMemoryStatusResponse;
    cuda_shared_memory_register(CudaSharedMemoryRegisterRequest) -> CudaSharedMemoryRegisterResponse;
    cuda_shared_memory_unregister(CudaSharedMemoryUnregisterRequest) -> CudaSharedMemoryUnregisterResponse;
    trace_setting(TraceSettingRequest) -> TraceSettingResponse;
    log_settings(LogSettingsRequest) -> LogSettingsResponse;
}

impl EchoService {
    pub fn new(model: Arc<EchoModel>) -> Self {
        EchoService { model }
    }

    fn metadata(&self, name: String) -> ModelMetadataResponse {
        let tensor = |name: String, t: &crate::flags::TensorFlag| TensorMetadata {
            name,
            datatype: t.datatype.as_wire().to_string(),
            shape: t.dims.clone(),
        };
        ModelMetadataResponse {
            name,
            versions: vec![VERSION.to_string()],
            platform: "nereid_echo".into(),
            inputs: self.model.inputs.iter().map(|t| tensor(t.name.clone(), t)).collect(),
            outputs: self
                .model
                .inputs
                .iter()
                .enumerate()
                .map(|(i, t)| tensor(self.model.output_name(i), t))
                .collect(),
        }
    }
}

/// Serves until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    model: Arc<EchoModel>,
    shutdown: CancellationToken,
) -> Result<(), tonic::transport::Error> {
    let service = GrpcInferenceServiceServer::new(EchoService::new(model))
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_incoming_shutdown(incoming, shutdown.cancelled_owned())
        .await
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use nereid_proto::inference::model_infer_request::InferInputTensor;

    use super::*;

    #[test]
    fn echo_moves_raw_contents_and_renames() {
        let raw = Bytes::from_static(&[1, 2, 3, 4]);
        let request = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![InferInputTensor {
                name: "INPUT0".into(),
                datatype: "FP32".into(),
                shape: vec![1, 1],
                ..Default::default()
            }],
            raw_input_contents: vec![raw.clone()],
            ..Default::default()
        };
        let model = EchoModel::new(vec![], vec!["Y".into()]);
        let response = echo(&model, request);
        assert_eq!(response.outputs[0].name, "Y");
        assert_eq!(response.outputs[0].shape, vec![1, 1]);
        assert_eq!(response.model_version, "1");
        assert_eq!(response.raw_output_contents[0].as_ptr(), raw.as_ptr());
    }
}
