//! `InferenceModel`: one model, where it comes from, what it runs on, and
//! how it scales. The operator turns it into a ConfigMap, a Deployment of
//! `nereid-server` pods, a Service, a PodDisruptionBudget and an HPA, and a
//! canary's ConfigMap, Deployment and Service when it has one.
//!
//! The spec's parts each live in their own file under `inference_model/`;
//! this file holds the resource itself and re-exports the parts.

mod autoscaling;
mod canary;
mod config;
mod network;
mod resources;
mod scheduling;
mod server;
mod source;
mod status;

pub use autoscaling::{
    Autoscaling, AutoscalingMetric, DEFAULT_ACTIVATION_TIMEOUT, DEFAULT_SCALE_TO_ZERO_AFTER, MAX_ACTIVATION_TIMEOUT,
    TargetKind,
};
pub use canary::{CANARY_SUFFIX, Canary, RevisionStatus};
pub use config::{DynamicBatching, InstanceGroup, InstanceKind, ModelConfigOverride};
pub use network::ModelNetworkPolicy;
pub use resources::ModelResources;
pub use scheduling::Scheduling;
pub use server::{RepositoryApi, ServerPorts, ServerSpec, ServerTls};
pub use source::{ModelSource, VersionPolicy};
pub use status::{Address, AutoscalingStatus, Endpoints, Failure, InferenceModelStatus};

use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// One model served by a Deployment of `nereid-server` pods.
// clippy reads the repeated `type_ = "string"` of separate printcolumns as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "serving.nereid.dev",
    version = "v1alpha1",
    kind = "InferenceModel",
    namespaced,
    status = "InferenceModelStatus",
    derive = "PartialEq",
    shortname = "nmodel",
    shortname = "nmodels",
    category = "nereid",
    doc = "A model served by Nereid: its source, resources, scheduling, server and autoscaling.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.ready",
        description = "Serving pods ready with the model loaded, over those wanted"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        description = "Why the model is not Ready (the Ready condition's reason); empty while Ready"
    ),
    printcolumn(
        name = "URL",
        type_ = "string",
        json_path = ".status.url",
        description = "The model's infer URL: through nereid-gateway when it is installed, else its Service"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp"),
    printcolumn(
        name = "gRPC",
        type_ = "string",
        json_path = ".status.endpoints.grpc",
        description = "The gRPC address of the model's Service",
        priority = 1
    ),
    printcolumn(
        name = "GPUs",
        type_ = "integer",
        json_path = ".spec.resources.gpu",
        description = "GPUs per serving pod",
        priority = 1
    ),
    printcolumn(
        name = "Min",
        type_ = "integer",
        json_path = ".spec.autoscaling.minReplicas",
        description = "Fewest replicas the autoscaler keeps",
        priority = 1
    ),
    printcolumn(
        name = "Max",
        type_ = "integer",
        json_path = ".spec.autoscaling.maxReplicas",
        description = "Most replicas the autoscaler makes",
        priority = 1
    ),
    printcolumn(
        name = "Current",
        type_ = "integer",
        json_path = ".status.replicas",
        description = "Serving pods that exist now",
        priority = 1
    ),
    printcolumn(
        name = "Model URI",
        type_ = "string",
        json_path = ".spec.source.uri",
        description = "Where the model repository is read from",
        priority = 1
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = crate::rules::CANARY_NOT_ASLEEP.cel())]
#[x_kube(validation = crate::rules::GPU_KIND_NEEDS_GPU.cel())]
pub struct InferenceModelSpec {
    /// Where the model comes from: its storage URI, credentials and version policy.
    pub source: ModelSource,
    /// Model configuration fields merged over the repository's config.pbtxt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ModelConfigOverride>,
    /// Number of serving pods (default 1). Managed by the HPA when autoscaling is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// CPU, memory and GPU requested by each serving pod.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ModelResources>,
    /// Where the serving pods may run: node selector, tolerations, affinity and more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<Scheduling>,
    /// The serving container: image, extra args and env, ports and sidecars.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerSpec>,
    /// Horizontal autoscaling on the server's own metrics (queue time, pending requests, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<Autoscaling>,
    /// Who may reach the serving pods (a NetworkPolicy); absent, no policy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<ModelNetworkPolicy>,
    /// A second revision (another source and/or config) with pods of its
    /// own, given `trafficPercent` of the model's requests by nereid-gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<Canary>,
}
