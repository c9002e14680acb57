//! A canary: a second revision of a model beside the spec's, with pods of
//! its own, given a share of the model's requests by nereid-gateway.
//!
//! KServe's `canaryTrafficPercent` is the reference: the user edits the spec
//! to start one, to move its share, to promote it (the canary's source and
//! config become the spec's, `canary` goes) and to roll it back (`canary`
//! goes). Requests through the model's own Service are not split: only the
//! gateway knows the percent.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{ModelConfigOverride, ModelSource};

/// What a canary's objects are named after their model's: `<model>-canary`
/// is its Deployment, and the Service nereid-gateway reads its endpoints from.
pub const CANARY_SUFFIX: &str = "-canary";

/// The canary revision of an InferenceModel.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct Canary {
    /// Where the canary's model comes from; default: `spec.source`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ModelSource>,
    /// The canary's config override, in place of `spec.config`; default: `spec.config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ModelConfigOverride>,
    /// Percent of the model's requests nereid-gateway sends to the canary,
    /// 0 to 100. While one revision has no ready pod the other takes all.
    #[schemars(range(min = 0, max = 100))] // validate.rs: canary_percent
    pub traffic_percent: i32,
    /// Serving pods of the canary (default 1); never autoscaled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,
}

/// One revision of a model with a canary: the spec's (`stable`) or the
/// canary's.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RevisionStatus {
    /// `stable` or `canary`.
    pub name: String,
    /// Where the revision's model comes from.
    pub source: String,
    /// Ready pods over wanted ones (e.g. `1/1`).
    pub ready: String,
    /// Its pods that are ready with the model loaded.
    pub ready_replicas: i32,
    /// The percent of the model's requests the gateway sends it.
    pub traffic_percent: i32,
    /// Inference requests its ready pods answered successfully since they
    /// started (`nv_inference_request_success`), as their /metrics said at
    /// `countedAt` (refreshed every 30 s at most); absent before a scrape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_at: Option<Time>,
}
