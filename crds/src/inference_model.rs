//! `InferenceModel`: one model, where it comes from, what it runs on, and
//! how it scales. The operator turns it into a ConfigMap, a Deployment of
//! `nereid-server` pods, a Service, a PodDisruptionBudget and an HPA.
//!
//! The spec's parts each live in their own file under `inference_model/`;
//! this file holds the resource itself and re-exports the parts.

mod autoscaling;
mod config;
mod network;
mod resources;
mod scheduling;
mod server;
mod source;
mod status;

pub use autoscaling::{Autoscaling, AutoscalingMetric, TargetKind};
pub use config::{DynamicBatching, InstanceGroup, InstanceKind, ModelConfigOverride};
pub use network::ModelNetworkPolicy;
pub use resources::ModelResources;
pub use scheduling::Scheduling;
pub use server::{RepositoryApi, ServerPorts, ServerSpec, ServerTls};
pub use source::{ModelSource, VersionPolicy};
pub use status::{AutoscalingStatus, Endpoints, Failure, InferenceModelStatus};

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
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#,
        description = "Whether every wanted replica serves the model"
    ),
    printcolumn(
        name = "Replicas",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Ready serving pods"
    ),
    printcolumn(
        name = "Model URI",
        type_ = "string",
        json_path = ".spec.source.uri",
        description = "Where the model repository is read from"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct InferenceModelSpec {
    /// Where the model comes from: its storage URI, credentials and version policy.
    pub source: ModelSource,
    /// Model configuration fields merged over the repository's config.pbtxt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ModelConfigOverride>,
    /// Number of serving pods (default 1). Managed by the HPA when autoscaling is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = crate::rules::REPLICAS.cel())]
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
}
