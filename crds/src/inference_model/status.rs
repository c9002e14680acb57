//! What the operator observed about an InferenceModel.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Observed state, derived from the owned Deployment and the pods themselves.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceModelStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Serving pods that exist (the scale subresource's status replicas).
    #[serde(default)]
    pub replicas: i32,
    /// Serving pods that are ready with the model loaded.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Ready serving pods over wanted ones, as kubectl shows Deployments
    /// (e.g. `2/3`): the READY column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// Why the model is not Ready: the Ready condition's reason (e.g.
    /// `InsufficientGPU`); absent while it is Ready. The REASON column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The model's KServe v2 infer URL (`.../v2/models/<name>/infer`):
    /// through nereid-gateway when the operator knows of one that routes
    /// this namespace, else the model's own Service (`endpoints`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The same URL in Knative's and KServe's Addressable shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Address>,
    /// Label selector of the serving pods, as a string (used by the HPA through the scale subresource).
    #[serde(default)]
    pub selector: String,
    /// Ready, ModelLoaded, Progressing and Degraded conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// In-cluster addresses of the model's Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,
    /// Model versions the ready pods report as loaded.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaded_versions: Vec<String>,
    /// The most recent failure seen (image pull, crash, load, scheduling).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<Failure>,
    /// Where autoscaling stands, when `spec.autoscaling` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingStatus>,
    /// With `spec.canary`: the spec's revision (`stable`) and the canary,
    /// each with its readiness, share and requests answered.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revisions: Vec<super::RevisionStatus>,
}

/// What the model's HorizontalPodAutoscaler and the operator's metrics show.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStatus {
    /// The HorizontalPodAutoscaler that scales this model: the operator's, or
    /// the one KEDA made for the operator's ScaledObject; absent when there
    /// is none (yet, or because another autoscaler already targets the pods).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub horizontal_pod_autoscaler: Option<String>,
    /// The external metric the HPA reads (e.g. `nereid_queue_time_microseconds`).
    pub metric: String,
    /// The metric's value at the HPA's last read, as a quantity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_value: Option<String>,
    /// The replicas the HPA last asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_replicas: Option<i32>,
    /// Ready serving pods whose /metrics answered at the operator's last scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pods_scraped: Option<i32>,
    /// Why the model is not scaling, when it is not: the HPA's AbleToScale or
    /// ScalingActive reason (e.g. `FailedGetExternalMetric`), or the operator's
    /// own (`ForeignAutoscaler`, `NoPodMetrics`). Absent while all is well.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The human-readable side of `reason`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// Where a resource is called, in Knative's Addressable shape
/// (`status.address.url`), which KServe's InferenceService also uses.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Address {
    /// The infer URL.
    pub url: String,
}

/// In-cluster addresses of a model's Service.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Endpoints {
    /// gRPC address, host:port (e.g. `mlp-small.default.svc:8001`).
    pub grpc: String,
    /// HTTP base URL (e.g. `http://mlp-small.default.svc:8000`).
    pub http: String,
}

/// A failure the operator observed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// Machine-readable reason (see the reasons in `conditions::reason`).
    pub reason: String,
    /// Human-readable message, e.g. the scheduler's or the server's own.
    pub message: String,
    /// When it was observed.
    pub time: Time,
}
