//! `--grpc-restricted-protocol`: each RPC belongs to one of Triton's API
//! groups, and a restricted group's calls must carry its metadata header.

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::{Either, Ready, ready};
use tower::{Layer, Service};

use super::status::to_status;
use crate::restricted_api::{ApiGroup, RestrictedApis};

/// The group of a gRPC method, by its path (`/package.Service/Method`).
pub fn group(path: &str) -> Option<ApiGroup> {
    let (service, method) = path.trim_start_matches('/').split_once('/')?;
    if service == "grpc.health.v1.Health" {
        return Some(ApiGroup::Health);
    }
    if service != "inference.GRPCInferenceService" {
        return None;
    }
    Some(match method {
        "ServerLive" | "ServerReady" => ApiGroup::Health,
        "ModelReady" | "ServerMetadata" | "ModelMetadata" => ApiGroup::Metadata,
        "ModelInfer" | "ModelStreamInfer" => ApiGroup::Inference,
        "ModelConfig" => ApiGroup::ModelConfig,
        "ModelStatistics" => ApiGroup::Statistics,
        "RepositoryIndex" | "RepositoryModelLoad" | "RepositoryModelUnload" => ApiGroup::ModelRepository,
        "SystemSharedMemoryStatus"
        | "SystemSharedMemoryRegister"
        | "SystemSharedMemoryUnregister"
        | "CudaSharedMemoryStatus"
        | "CudaSharedMemoryRegister"
        | "CudaSharedMemoryUnregister" => ApiGroup::SharedMemory,
        "TraceSetting" => ApiGroup::Trace,
        "LogSettings" => ApiGroup::Logging,
        _ => return None,
    })
}

#[derive(Debug, Clone)]
pub struct RestrictLayer(Arc<RestrictedApis>);

impl RestrictLayer {
    pub fn new(apis: Arc<RestrictedApis>) -> Self {
        RestrictLayer(apis)
    }
}

impl<S> Layer<S> for RestrictLayer {
    type Service = RestrictService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RestrictService {
            inner,
            apis: Arc::clone(&self.0),
        }
    }
}

#[derive(Debug, Clone)]
pub struct RestrictService<S> {
    inner: S,
    apis: Arc<RestrictedApis>,
}

impl<S, B> Service<http::Request<B>> for RestrictService<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Ready<Result<S::Response, S::Error>>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Some(group) = group(request.uri().path()) else {
            return Either::Left(self.inner.call(request));
        };
        let headers = request.headers();
        match self
            .apis
            .check(group, |key| headers.get(key).map(http::HeaderValue::as_bytes))
        {
            Ok(()) => Either::Left(self.inner.call(request)),
            Err(e) => Either::Right(ready(Ok(to_status(e).into_http()))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_has_its_group() {
        assert_eq!(
            group("/inference.GRPCInferenceService/ModelInfer"),
            Some(ApiGroup::Inference)
        );
        assert_eq!(
            group("/inference.GRPCInferenceService/RepositoryModelUnload"),
            Some(ApiGroup::ModelRepository)
        );
        assert_eq!(group("/grpc.health.v1.Health/Check"), Some(ApiGroup::Health));
        assert_eq!(
            group("/inference.GRPCInferenceService/LogSettings"),
            Some(ApiGroup::Logging)
        );
        assert_eq!(group("/other.Service/ModelInfer"), None);
    }
}
