//! The serving container: image, extra args and env, ports, sidecars.

use k8s_openapi::api::core::v1::{Container, EnvVar};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Overrides for the `nereid-server` container and extra containers of the pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerSpec {
    /// Server image. Default: the operator's own nereid image.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// Extra command-line arguments appended to the server's own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Extra environment variables of the server container.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Ports the server listens on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<ServerPorts>,
    /// Extra containers added to every serving pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sidecars: Vec<Container>,
}

/// Ports of the server container and the Service.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerPorts {
    /// HTTP/REST (KServe v2) port. Default 8000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub http: Option<i32>,
    /// gRPC (KServe v2) port. Default 8001.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub grpc: Option<i32>,
    /// Prometheus metrics port. Default 8002.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub metrics: Option<i32>,
}
