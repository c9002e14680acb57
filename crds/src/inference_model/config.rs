//! The model configuration fields users change most, merged by the server
//! over the repository's `config.pbtxt` (names as in Triton's ModelConfig).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Fields of Triton's ModelConfig that override the repository's config.pbtxt.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelConfigOverride {
    /// Largest batch the model accepts (0 disables batching).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_batch_size: Option<i32>,
    /// Enables and tunes the dynamic batcher.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dynamic_batching: Option<DynamicBatching>,
    /// Model instances per pod and where they run (replaces the repository's list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = crate::rules::MAX_INSTANCE_GROUPS))]
    pub instance_group: Option<Vec<InstanceGroup>>,
    /// Backend parameters (Triton's `parameters`, string values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}

/// Triton's dynamic_batching settings.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DynamicBatching {
    /// Batch sizes the batcher tries to form.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_batch_size: Vec<i32>,
    /// How long a request may wait for a batch to fill, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"))]
    pub max_queue_delay_microseconds: Option<u64>,
    /// Return responses in request order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preserve_ordering: Option<bool>,
    /// Number of priority levels (0 disables priorities).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"))]
    pub priority_levels: Option<u64>,
    /// Priority of requests that do not name one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"))]
    pub default_priority_level: Option<u64>,
    /// Queue bound; requests beyond it are rejected (HTTP 503 / gRPC UNAVAILABLE). 0 means unbounded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"), range(max = u32::MAX))]
    pub max_queue_size: Option<u32>,
    /// Queue timeout of requests that do not set one, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"))]
    pub default_timeout_microseconds: Option<u64>,
}

/// Triton's instance_group entry.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InstanceGroup {
    /// Instances of the model (per GPU for KIND_GPU). Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<i32>,
    /// Where the instances run. Default KIND_AUTO.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<InstanceKind>,
}

/// Where model instances run, with Triton's names.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum InstanceKind {
    /// On CPU.
    #[serde(rename = "KIND_CPU")]
    Cpu,
    /// On the pod's GPUs.
    #[serde(rename = "KIND_GPU")]
    Gpu,
    /// On GPUs when the pod has any, else on CPU.
    #[default]
    #[serde(rename = "KIND_AUTO")]
    Auto,
}
