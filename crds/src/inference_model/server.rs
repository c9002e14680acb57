//! The serving container: image, extra args and env, ports, sidecars, and
//! what protects it: the model-repository API and TLS.

use k8s_openapi::api::core::v1::{Container, EnvVar, SecretKeySelector};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Overrides for the `nereid-server` container and extra containers of the pod.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerSpec {
    /// Server image. Default: the operator's `--server-image`
    /// (`NEREID_SERVER_IMAGE`), which the Helm chart sets from its
    /// `serverImage` value (ghcr.io/nereid-dev/nereid at the chart's
    /// appVersion); an operator started without it uses `nereid:latest`.
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
    /// The model-repository API (Triton's load, unload and index). Off when
    /// absent: each pod loads its one model at start and no request can
    /// unload it. Given, the API is on for calls that carry the header.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repository_api: Option<RepositoryApi>,
    /// TLS on the HTTP and gRPC ports, from a `kubernetes.io/tls` Secret
    /// (`tls.crt`, `tls.key`, and `ca.crt` for mutual TLS). Rotated
    /// certificates are picked up without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ServerTls>,
}

/// Turns the serving pods' model-repository API on, behind a header.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RepositoryApi {
    /// The Secret key holding the value calls must send in the header.
    pub key_secret: SecretKeySelector,
    /// The header (gRPC metadata) name. Default `nereid-repository-key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub header: Option<String>,
}

/// TLS for the serving pods.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerTls {
    /// A Secret in the model's namespace with `tls.crt` and `tls.key`
    /// (cert-manager's Certificate writes exactly this).
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Require client certificates signed by the Secret's `ca.crt`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mutual: bool,
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
