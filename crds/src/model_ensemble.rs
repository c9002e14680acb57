//! `ModelEnsemble`: a DAG of InferenceModels served as one model, as in
//! Triton's ensemble_scheduling. Each step names a member InferenceModel and
//! maps its tensors to the ensemble's.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Address, Autoscaling, AutoscalingStatus, Endpoints, ModelResources, Scheduling, ServerSpec};

/// A DAG of InferenceModels served under one model name.
// clippy reads the repeated `type_ = "string"` of separate printcolumns as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "serving.nereid.dev",
    version = "v1alpha1",
    kind = "ModelEnsemble",
    namespaced,
    status = "ModelEnsembleStatus",
    derive = "PartialEq",
    shortname = "nensemble",
    category = "nereid",
    doc = "A DAG of InferenceModels served as one model, as in Triton's ensemble_scheduling.",
    scale(
        spec_replicas_path = ".spec.replicas",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.ready",
        description = "Ensemble pods ready, over those wanted"
    ),
    printcolumn(
        name = "Placement",
        type_ = "string",
        json_path = ".spec.placement",
        description = "remote or colocated"
    ),
    printcolumn(
        name = "Members",
        type_ = "string",
        json_path = ".status.members",
        description = "Member InferenceModels that are Ready, over all members"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.reason",
        description = "Why the ensemble is not Ready (the Ready condition's reason); empty while Ready"
    ),
    printcolumn(
        name = "URL",
        type_ = "string",
        json_path = ".status.url",
        description = "The ensemble's infer URL"
    ),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct ModelEnsembleSpec {
    /// The steps of the DAG; data dependencies through tensor names order them.
    #[schemars(length(max = 64))]
    #[x_kube(
        validation = crate::rules::STEPS_NOT_EMPTY.cel(),
        validation = crate::rules::STEP_NAMES_UNIQUE.cel()
    )]
    pub steps: Vec<EnsembleStep>,
    /// Tensors the ensemble takes from the client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub inputs: Vec<EnsembleTensor>,
    /// Tensors the ensemble returns to the client.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs: Vec<EnsembleTensor>,
    /// Where the steps run, "remote" (default) or "colocated".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("default" = "remote"))]
    pub placement: Option<Placement>,
    /// Number of ensemble pods (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Horizontal autoscaling of the ensemble pods (minReplicas at least 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = crate::rules::ENSEMBLE_MIN_REPLICAS.cel())]
    pub autoscaling: Option<Autoscaling>,
    /// CPU, memory and GPUs of each ensemble pod (with placement colocated,
    /// enough for every member).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ModelResources>,
    /// Where the ensemble pods may run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduling: Option<Scheduling>,
    /// The ensemble pods' nereid-server container: image, extra args and env, ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<ServerSpec>,
}

/// One step: a member model and how its tensors map to the ensemble's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnsembleStep {
    /// Name of the step, unique in the ensemble.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
    /// Name of the InferenceModel (same namespace) this step runs.
    pub model: String,
    /// Model version to call; default the latest loaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_version: Option<i64>,
    /// Step model input name -> ensemble tensor name it reads.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub input_map: BTreeMap<String, String>,
    /// Step model output name -> ensemble tensor name it produces.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub output_map: BTreeMap<String, String>,
}

/// A tensor of the ensemble's own signature.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnsembleTensor {
    /// Tensor name.
    pub name: String,
    /// Data type, with KServe v2 names (FP32, INT64, BYTES, ...).
    #[schemars(extend("enum" = crate::rules::DATATYPES))]
    pub datatype: String,
    /// Shape without the batch dimension; -1 for a variable dimension.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dims: Vec<i64>,
}

/// Where an ensemble's steps run: "remote" (default; a small ensemble pod
/// calls each member's Service over gRPC, so members scale on their own) or
/// "colocated" (all members and the ensemble in one pod, lowest latency).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum Placement {
    /// A small ensemble pod calls each member's Service over gRPC.
    #[default]
    Remote,
    /// All members and the ensemble run in one pod.
    Colocated,
}

/// Observed state of a ModelEnsemble.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelEnsembleStatus {
    /// The metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Ensemble pods that exist.
    #[serde(default)]
    pub replicas: i32,
    /// Ensemble pods that are ready.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Ready ensemble pods over wanted ones (e.g. `1/1`): the READY column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    /// Member InferenceModels that are Ready over all members (e.g. `1/2`):
    /// the MEMBERS column. A member named by several steps counts once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<String>,
    /// Why the ensemble is not Ready: the Ready condition's reason; absent
    /// while it is Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The ensemble's KServe v2 infer URL, once it is served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The same URL in Knative's and KServe's Addressable shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Address>,
    /// Label selector of the ensemble pods, as a string.
    #[serde(default)]
    pub selector: String,
    /// Ready, MembersReady, Valid, Progressing and Degraded conditions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// In-cluster addresses of the ensemble's Service.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Endpoints>,
    /// Where autoscaling stands, when `spec.autoscaling` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingStatus>,
}
