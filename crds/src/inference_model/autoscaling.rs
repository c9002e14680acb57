//! Horizontal autoscaling on the server's own metrics. Shared by
//! InferenceModel and ModelEnsemble; only an InferenceModel may scale to
//! zero (`minReplicas: 0`), since only nereid-gateway's activation wakes one.

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscalerBehavior;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// An HPA over the resource's scale subresource, driven by one server metric.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = crate::rules::MIN_LE_MAX.cel(),
    validation = crate::rules::ZERO_ONLY_FIELDS.cel()
)]
pub struct Autoscaling {
    /// Fewest replicas (default 1). 0 scales the model to zero after
    /// `scaleToZeroAfter` without requests; nereid-gateway wakes it on the
    /// next request. The HPA keeps owning 1..maxReplicas; the operator (or
    /// KEDA, with `--autoscaler keda`) owns the step between 0 and 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = crate::rules::MIN_REPLICAS.cel())]
    pub min_replicas: Option<i32>,
    /// Most replicas (at least 1, and at least minReplicas).
    #[x_kube(validation = crate::rules::MAX_REPLICAS.cel())]
    pub max_replicas: i32,
    /// The metric the HPA tracks, read by the operator from the serving pods.
    pub metric: AutoscalingMetric,
    /// The target, as a quantity string: the model's average for
    /// queueTimeMicros and gpuUtilization (e.g. "500" microseconds of queue
    /// time per request), the value per pod for pendingRequests and
    /// inferenceRate (e.g. "2k" inferences per second per pod).
    #[schemars(length(min = 1, max = 64))]
    #[x_kube(validation = crate::rules::TARGET_QUANTITY.cel())]
    pub target: String,
    /// Scale-up and scale-down behavior, as in an autoscaling/v2 HPA.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<HorizontalPodAutoscalerBehavior>,
    /// With minReplicas 0: how long the model must go without a request
    /// before it is scaled to zero, as a duration ("5m", "90s"; default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = crate::rules::SCALE_TO_ZERO_AFTER.cel())]
    pub scale_to_zero_after: Option<String>,
    /// With minReplicas 0: how long nereid-gateway holds a request for the
    /// model while a replica starts, as a duration (default 60s, at most
    /// 10m); past it the request is answered 503 / UNAVAILABLE.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32))]
    #[x_kube(validation = crate::rules::ACTIVATION_TIMEOUT.cel())]
    pub activation_timeout: Option<String>,
}

/// How long a model with minReplicas 0 waits without requests before it is
/// scaled to zero, when `scaleToZeroAfter` is not set (Knative's default
/// grace is shorter, but a pod start costs a model load: five minutes
/// keeps a model that is called every few minutes awake).
pub const DEFAULT_SCALE_TO_ZERO_AFTER: Duration = Duration::from_secs(300);
/// How long nereid-gateway holds a request for a model waking from zero,
/// when `activationTimeout` is not set.
pub const DEFAULT_ACTIVATION_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest `activationTimeout`: a held request holds its body and a
/// stream in the gateway all that time.
pub const MAX_ACTIVATION_TIMEOUT: Duration = Duration::from_secs(600);

impl Autoscaling {
    /// Whether the model may be scaled to zero (`minReplicas: 0`).
    pub fn scales_to_zero(&self) -> bool {
        self.min_replicas == Some(0)
    }

    /// `scaleToZeroAfter`, or its default when unset or unreadable (an
    /// invalid value never passes validation).
    pub fn scale_to_zero_after(&self) -> Duration {
        self.scale_to_zero_after
            .as_deref()
            .and_then(crate::validate::parse_duration)
            .filter(|d| !d.is_zero())
            .unwrap_or(DEFAULT_SCALE_TO_ZERO_AFTER)
    }

    /// `activationTimeout`, or its default; never above the maximum.
    pub fn activation_timeout(&self) -> Duration {
        self.activation_timeout
            .as_deref()
            .and_then(crate::validate::parse_duration)
            .filter(|d| !d.is_zero())
            .unwrap_or(DEFAULT_ACTIVATION_TIMEOUT)
            .min(MAX_ACTIVATION_TIMEOUT)
    }
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

/// How an HPA compares a metric with its target.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// The figure is already per request or per pod (an average): the HPA
    /// scales by figure / target (`target.type: Value`).
    Value,
    /// The figure is a total over the pods: the HPA divides it by the target
    /// to get the replicas (`target.type: AverageValue`).
    AverageValue,
}

impl AutoscalingMetric {
    /// Every metric, in the order the external metrics API lists them.
    pub const ALL: [AutoscalingMetric; 4] = [
        AutoscalingMetric::QueueTimeMicros,
        AutoscalingMetric::PendingRequests,
        AutoscalingMetric::InferenceRate,
        AutoscalingMetric::GpuUtilization,
    ];

    /// The metric's name in the external metrics API (with a `model` label
    /// naming the InferenceModel) and on the operator's /metrics.
    pub fn external_name(self) -> &'static str {
        match self {
            AutoscalingMetric::QueueTimeMicros => "nereid_queue_time_microseconds",
            AutoscalingMetric::PendingRequests => "nereid_pending_requests",
            AutoscalingMetric::InferenceRate => "nereid_inference_rate",
            AutoscalingMetric::GpuUtilization => "nereid_gpu_utilization_percent",
        }
    }

    /// The metric with this external name.
    pub fn from_external_name(name: &str) -> Option<AutoscalingMetric> {
        AutoscalingMetric::ALL.into_iter().find(|m| m.external_name() == name)
    }

    /// Queue time and GPU utilisation are averages over the model's requests
    /// and GPUs; pending requests and inference rate are totals over its
    /// pods, so the target is per pod.
    pub fn target_kind(self) -> TargetKind {
        match self {
            AutoscalingMetric::QueueTimeMicros | AutoscalingMetric::GpuUtilization => TargetKind::Value,
            AutoscalingMetric::PendingRequests | AutoscalingMetric::InferenceRate => TargetKind::AverageValue,
        }
    }
}
