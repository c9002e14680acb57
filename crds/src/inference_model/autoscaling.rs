//! Horizontal autoscaling on the server's own metrics. Shared by
//! InferenceModel and ModelEnsemble.

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerBehavior;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An HPA over the resource's scale subresource, driven by one server metric.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = crate::rules::MIN_LE_MAX.cel())]
pub struct Autoscaling {
    /// Fewest replicas (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = crate::rules::MIN_REPLICAS.cel())]
    pub min_replicas: Option<i32>,
    /// Most replicas (at least 1, and at least minReplicas).
    #[x_kube(validation = crate::rules::MAX_REPLICAS.cel())]
    pub max_replicas: i32,
    /// The per-pod metric the HPA tracks.
    pub metric: AutoscalingMetric,
    /// Target average value of the metric per pod, as a quantity string
    /// (e.g. "500" microseconds of queue time, "2k" inferences per second).
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = crate::rules::TARGET_QUANTITY.cel())]
    pub target: String,
    /// Scale-up and scale-down behavior, as in an autoscaling/v2 HPA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<HorizontalPodAutoscalerBehavior>,
}

/// The metric an autoscaled resource scales on, read from its serving pods.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum AutoscalingMetric {
    /// Average time a request waits in the queue, in microseconds.
    #[default]
    QueueTimeMicros,
    /// Requests queued or executing per pod.
    PendingRequests,
    /// Inferences per second per pod.
    InferenceRate,
    /// GPU utilization percent (0-100) of the pod's GPUs.
    GpuUtilization,
}
