//! The gRPC front end: Triton's `inference.GRPCInferenceService` and
//! `grpc.health.v1.Health`, on tonic's services and router, served by our
//! own loop over hyper ([`transport::serve`]: corked HTTP/2 connections).

pub mod budget;
/// The wire conversions, shared with the remote backend (nereid-core).
pub use nereid_core::wire as convert;
mod deadline;
mod model_infer;
pub mod restricted;
mod settings;
pub mod status;
mod stream;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures::Stream;
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;
use nereid_proto::health::v1::health_check_response::ServingStatus;
use nereid_proto::health::v1::health_server::{Health, HealthServer};
use nereid_proto::health::v1::{HealthCheckRequest, HealthCheckResponse};
use nereid_proto::inference::grpc_inference_service_server::{GrpcInferenceService, GrpcInferenceServiceServer};
use nereid_proto::inference::model_metadata_response::TensorMetadata;
use nereid_proto::inference::model_repository_parameter::ParameterChoice as RepositoryParameter;
use nereid_proto::inference::repository_index_response::ModelIndex;
use nereid_proto::inference::*;
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::metadata::{Ascii, MetadataKey, MetadataValue};
use tonic::{Request, Response, Status, Streaming};
use tower::ServiceExt;

use self::budget::{BudgetLayer, take_reservation};
use self::deadline::DeadlineLayer;
use self::model_infer::ModelInferLayer;
use self::restricted::RestrictLayer;
use self::status::to_status;
use crate::in_flight::{InFlight, InFlightLayer};
use crate::local_control::{self, LocalControl};
use crate::memory_budget::MemoryBudget;
use crate::metrics::Metrics;
use crate::request;
use crate::restricted_api::{ApiGroup, RestrictedApis};
use crate::server::InferenceServer;
use crate::transport::{self, Acceptor, Peer, ServeOptions};

/// Settings of the gRPC front end.
#[derive(Debug, Clone)]
pub struct GrpcOptions {
    /// Largest message accepted or sent, in bytes.
    pub max_message_size: usize,
    /// The port's HTTP/2 limits: streams per connection, keep-alive, idle.
    pub serve: ServeOptions,
    /// A unary request message must arrive whole within this.
    pub body_timeout: Duration,
    /// The server-wide cap on request bytes held at once.
    pub budget: Arc<MemoryBudget>,
    /// Who may change the log and trace settings.
    pub local_control: LocalControl,
    /// `--grpc-restricted-protocol`.
    pub restricted: Arc<RestrictedApis>,
    /// The server's metrics (the front end's in-flight gauge).
    pub metrics: Arc<Metrics>,
}

pub struct InferenceService {
    server: Arc<InferenceServer>,
    local_control: LocalControl,
    restricted: Arc<RestrictedApis>,
}

impl InferenceService {
    /// Refuses a change (of settings, of shared-memory regions) from a
    /// client this server does not take it from (see [`local_control`]).
    fn check_update<T>(&self, what: &str, group: ApiGroup, request: &Request<T>) -> Result<(), Status> {
        let restricted = self.restricted.restriction(group).is_some();
        self.local_control
            .check(what, restricted, request.extensions().get::<Peer>())
            .map_err(to_status)
    }
}

/// Serves until `shutdown` resolves, then lets in-flight calls finish.
pub async fn serve(
    acceptor: Acceptor,
    server: Arc<InferenceServer>,
    options: GrpcOptions,
    in_flight: Arc<InFlight>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let inference = GrpcInferenceServiceServer::new(InferenceService {
        server: Arc::clone(&server),
        local_control: options.local_control,
        restricted: Arc::clone(&options.restricted),
    })
    .max_decoding_message_size(options.max_message_size)
    .max_encoding_message_size(options.max_message_size);
    let health = HealthServer::new(HealthService {
        server: Arc::clone(&server),
    });
    let routes = tonic::service::Routes::new(inference).add_service(health).prepare();
    let stack = tower::ServiceBuilder::new()
        // Outermost: a request counts until its response is fully sent.
        .layer(InFlightLayer::new(in_flight, options.metrics.in_flight("grpc")))
        .layer(DeadlineLayer)
        // Refused calls cost nothing further: checked before the body is read.
        .layer(RestrictLayer::new(options.restricted))
        .layer(BudgetLayer::new(
            options.budget,
            options.body_timeout,
            options.max_message_size,
        ))
        // Innermost: ModelInfer answered here, every other call routed by tonic.
        .layer(ModelInferLayer::new(Arc::clone(&server), options.max_message_size))
        .service(routes)
        .map_request(|request: http::Request<Incoming>| request.map(Body::new));
    // gRPC is HTTP/2 only: a connection that did not open with its preface
    // is closed. (The acceptor set TCP_NODELAY: Nagle's algorithm would hold
    // small responses back by up to 40 ms.)
    transport::serve(acceptor, TowerToHyperService::new(stack), options.serve, shutdown).await
}

type GrpcResult<T> = Result<Response<T>, Status>;

/// ModelInfer: one request, one response.
async fn infer(server: &InferenceServer, request: Request<ModelInferRequest>) -> GrpcResult<ModelInferResponse> {
    let reservation = take_reservation(request.extensions());
    let trace_parent = trace_parent(request.metadata());
    let mut request = convert::request(request.into_inner()).map_err(to_status)?;
    request.reservation = reservation;
    request.trace_parent = trace_parent;
    let response = server.infer(request).await.map_err(to_status)?;
    let queue_depth = response.queue_depth;
    let mut reply = Response::new(convert::response(response));
    if let Some(depth) = queue_depth {
        reply
            .metadata_mut()
            .insert(nereid_proto::QUEUE_DEPTH_HEADER, MetadataValue::from(depth));
    }
    Ok(reply)
}

#[tonic::async_trait]
impl GrpcInferenceService for InferenceService {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> GrpcResult<ServerLiveResponse> {
        Ok(Response::new(ServerLiveResponse {
            live: self.server.is_live(),
        }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> GrpcResult<ServerReadyResponse> {
        Ok(Response::new(ServerReadyResponse {
            ready: self.server.is_ready(),
        }))
    }

    async fn model_ready(&self, request: Request<ModelReadyRequest>) -> GrpcResult<ModelReadyResponse> {
        // An unknown or unloaded model is simply not ready: tritonclient's
        // `is_model_ready` raises on an error status instead of returning False.
        let r = request.into_inner();
        let ready = self.server.model_ready(&r.name, &r.version).unwrap_or(false);
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(&self, _: Request<ServerMetadataRequest>) -> GrpcResult<ServerMetadataResponse> {
        let m = self.server.metadata();
        Ok(Response::new(ServerMetadataResponse {
            name: m.name,
            version: m.version,
            extensions: m.extensions,
        }))
    }

    async fn model_metadata(&self, request: Request<ModelMetadataRequest>) -> GrpcResult<ModelMetadataResponse> {
        let r = request.into_inner();
        let m = self.server.model_metadata(&r.name, &r.version).map_err(to_status)?;
        let tensors = |ts: Vec<crate::server::TensorMetadata>| {
            ts.into_iter()
                .map(|t| TensorMetadata {
                    name: t.name,
                    datatype: t.datatype.as_wire().to_string(),
                    shape: t.shape,
                })
                .collect()
        };
        Ok(Response::new(ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: tensors(m.inputs),
            outputs: tensors(m.outputs),
        }))
    }

    /// Reached only for what [`model_infer::ModelInferService`] hands on
    /// (compressed calls); the same handler either way.
    async fn model_infer(&self, request: Request<ModelInferRequest>) -> GrpcResult<ModelInferResponse> {
        infer(&self.server, request).await
    }

    type ModelStreamInferStream = Pin<Box<dyn Stream<Item = Result<ModelStreamInferResponse, Status>> + Send>>;

    /// Many requests on one stream; see [`stream`].
    async fn model_stream_infer(
        &self,
        request: Request<Streaming<ModelInferRequest>>,
    ) -> GrpcResult<Self::ModelStreamInferStream> {
        let context = stream::StreamContext {
            server: Arc::clone(&self.server),
            account: request.extensions().get::<budget::BodyAccount>().cloned(),
            trace_parent: trace_parent(request.metadata()),
            errors_close: request
                .metadata()
                .get(stream::GRPC_ERROR_HEADER)
                .is_some_and(|v| v.to_str().is_ok_and(|v| v.eq_ignore_ascii_case("true"))),
        };
        let outbox = stream::serve(context, request.into_inner());
        Ok(Response::new(Box::pin(ReceiverStream::new(outbox))))
    }

    async fn model_config(&self, request: Request<ModelConfigRequest>) -> GrpcResult<ModelConfigResponse> {
        let r = request.into_inner();
        let config = self.server.model_config(&r.name, &r.version).map_err(to_status)?;
        Ok(Response::new(ModelConfigResponse {
            config: Some((*config).clone()),
        }))
    }

    async fn model_statistics(&self, request: Request<ModelStatisticsRequest>) -> GrpcResult<ModelStatisticsResponse> {
        let r = request.into_inner();
        let name = (!r.name.is_empty()).then_some(r.name.as_str());
        let stats = self.server.statistics(name, &r.version).map_err(to_status)?;
        Ok(Response::new(ModelStatisticsResponse {
            model_stats: stats.into_iter().map(convert::statistics).collect(),
        }))
    }

    async fn repository_index(&self, request: Request<RepositoryIndexRequest>) -> GrpcResult<RepositoryIndexResponse> {
        let r = request.into_inner();
        if !r.repository_name.is_empty() {
            return Err(Status::unimplemented(
                "'repository_name' specification is not supported",
            ));
        }
        let models = self
            .server
            .repository_index(r.ready)
            .await
            .map_err(to_status)?
            .into_iter()
            .map(|row| ModelIndex {
                name: row.name,
                version: row.version.map(|v| v.to_string()).unwrap_or_default(),
                state: row.state.map(|s| s.as_str().to_string()).unwrap_or_default(),
                reason: row.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> GrpcResult<RepositoryModelLoadResponse> {
        let r = request.into_inner();
        if !r.repository_name.is_empty() {
            return Err(Status::unimplemented(
                "'repository_name' specification is not supported",
            ));
        }
        let mut config = None;
        for (key, value) in &r.parameters {
            match (key.as_str(), value.parameter_choice.as_ref()) {
                ("config", Some(RepositoryParameter::StringParam(text))) => {
                    config = Some(self.server.config_override(&r.model_name, text).map_err(to_status)?);
                }
                ("config", _) => {
                    return Err(Status::invalid_argument(
                        "invalid value type for load parameter 'config', expected string_param.",
                    ));
                }
                (k, _) if k.starts_with("file:") => {
                    return Err(Status::unimplemented(
                        "model file overrides ('file:' load parameters) are not supported",
                    ));
                }
                (k, _) => {
                    return Err(Status::invalid_argument(format!("unrecognized load parameter '{k}'.")));
                }
            }
        }
        self.server.load_model(&r.model_name, config).await.map_err(to_status)?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> GrpcResult<RepositoryModelUnloadResponse> {
        let r = request.into_inner();
        self.server.unload_model(&r.model_name).await.map_err(to_status)?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<SystemSharedMemoryStatusRequest>,
    ) -> GrpcResult<SystemSharedMemoryStatusResponse> {
        let name = request.into_inner().name;
        let regions = self
            .server
            .shared_memory()
            .status((!name.is_empty()).then_some(name.as_str()))
            .map_err(to_status)?;
        let regions = regions
            .into_iter()
            .map(|r| {
                let status = system_shared_memory_status_response::RegionStatus {
                    name: r.name.clone(),
                    key: r.key,
                    offset: r.offset as u64,
                    byte_size: r.byte_size as u64,
                };
                (r.name, status)
            })
            .collect();
        Ok(Response::new(SystemSharedMemoryStatusResponse { regions }))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<SystemSharedMemoryRegisterRequest>,
    ) -> GrpcResult<SystemSharedMemoryRegisterResponse> {
        self.check_update(local_control::SHARED_MEMORY, ApiGroup::SharedMemory, &request)?;
        let r = request.into_inner();
        let size =
            |v: u64| usize::try_from(v).map_err(|_| Status::invalid_argument("offset or byte_size is too large"));
        self.server
            .shared_memory()
            .register(&r.name, &r.key, size(r.offset)?, size(r.byte_size)?)
            .map_err(to_status)?;
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    /// An empty name unregisters every region.
    async fn system_shared_memory_unregister(
        &self,
        request: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> GrpcResult<SystemSharedMemoryUnregisterResponse> {
        self.check_update(local_control::SHARED_MEMORY, ApiGroup::SharedMemory, &request)?;
        let name = request.into_inner().name;
        self.server
            .shared_memory()
            .unregister((!name.is_empty()).then_some(name.as_str()));
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        request: Request<CudaSharedMemoryStatusRequest>,
    ) -> GrpcResult<CudaSharedMemoryStatusResponse> {
        let name = request.into_inner().name;
        let regions = self
            .server
            .cuda_shared_memory()
            .status((!name.is_empty()).then_some(name.as_str()))
            .map_err(to_status)?;
        let regions = regions
            .into_iter()
            .map(|r| {
                let status = cuda_shared_memory_status_response::RegionStatus {
                    name: r.name.clone(),
                    device_id: r.device_id,
                    byte_size: r.byte_size,
                };
                (r.name, status)
            })
            .collect();
        Ok(Response::new(CudaSharedMemoryStatusResponse { regions }))
    }

    async fn cuda_shared_memory_register(
        &self,
        request: Request<CudaSharedMemoryRegisterRequest>,
    ) -> GrpcResult<CudaSharedMemoryRegisterResponse> {
        self.check_update(local_control::SHARED_MEMORY, ApiGroup::SharedMemory, &request)?;
        let r = request.into_inner();
        self.server
            .cuda_shared_memory()
            .register(&r.name, &r.raw_handle, r.device_id, r.byte_size)
            .map_err(to_status)?;
        Ok(Response::new(CudaSharedMemoryRegisterResponse {}))
    }

    /// An empty name unregisters every region.
    async fn cuda_shared_memory_unregister(
        &self,
        request: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> GrpcResult<CudaSharedMemoryUnregisterResponse> {
        self.check_update(local_control::SHARED_MEMORY, ApiGroup::SharedMemory, &request)?;
        let name = request.into_inner().name;
        self.server
            .cuda_shared_memory()
            .unregister((!name.is_empty()).then_some(name.as_str()));
        Ok(Response::new(CudaSharedMemoryUnregisterResponse {}))
    }

    async fn trace_setting(&self, request: Request<TraceSettingRequest>) -> GrpcResult<TraceSettingResponse> {
        if !request.get_ref().settings.is_empty() {
            self.check_update(local_control::TRACE_SETTINGS, ApiGroup::Trace, &request)?;
        }
        settings::trace(&self.server, request.into_inner()).map(Response::new)
    }

    async fn log_settings(&self, request: Request<LogSettingsRequest>) -> GrpcResult<LogSettingsResponse> {
        if !request.get_ref().settings.is_empty() {
            self.check_update(local_control::LOG_SETTINGS, ApiGroup::Logging, &request)?;
        }
        settings::log(&self.server, request.into_inner()).map(Response::new)
    }
}

/// The client's W3C trace context from the call's metadata.
fn trace_parent(metadata: &tonic::metadata::MetadataMap) -> Vec<(String, String)> {
    static KEYS: LazyLock<[MetadataKey<Ascii>; 2]> =
        LazyLock::new(|| request::TRACE_HEADERS.map(MetadataKey::from_static));
    request::trace_parent(KEYS.each_ref().map(|key| metadata.get(key)?.to_str().ok()))
}

/// `grpc.health.v1`: SERVING while the server is ready, for any service name.
pub struct HealthService {
    server: Arc<InferenceServer>,
}

impl HealthService {
    fn status(&self) -> HealthCheckResponse {
        let status = if self.server.is_ready() {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        HealthCheckResponse { status: status as i32 }
    }
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(&self, _: Request<HealthCheckRequest>) -> GrpcResult<HealthCheckResponse> {
        Ok(Response::new(self.status()))
    }

    type WatchStream = Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send>>;

    /// Sends the current status once; the server does not yet push changes.
    async fn watch(&self, _: Request<HealthCheckRequest>) -> GrpcResult<Self::WatchStream> {
        let current = self.status();
        Ok(Response::new(Box::pin(futures::stream::once(
            async move { Ok(current) },
        ))))
    }
}
