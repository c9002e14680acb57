//! What each serving pod asks for: CPU, memory and GPUs.

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Resources of each serving pod's server container (requests and limits).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelResources {
    /// CPU request and limit: a Kubernetes quantity, written as an integer or
    /// a string (int-or-string; `kubectl explain` shows every such field of a
    /// custom resource as `<Object>`), e.g. 2, "2" or "500m".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Quantity>,
    /// Memory request and limit: a Kubernetes quantity, written as an integer
    /// (bytes) or a string (int-or-string), e.g. "4Gi" or "512M".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Quantity>,
    /// Number of GPUs (of gpuResource) per pod. 0 or unset: CPU only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"), range(max = u32::MAX))]
    pub gpu: Option<u32>,
    /// Extended resource name the GPUs are requested as. Default "nvidia.com/gpu";
    /// may be a MIG profile resource such as "nvidia.com/mig-1g.10gb".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_resource: Option<String>,
}
