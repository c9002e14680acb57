//! The PodDisruptionBudget of an InferenceModel's pods.
//!
//! `maxUnavailable: 1` whatever the replica count: with several replicas a
//! node drain takes them one at a time, and with a single replica the drain
//! still proceeds (a `minAvailable: 1` budget would block it forever).
//! `unhealthyPodEvictionPolicy: AlwaysAllow` lets a drain evict pods that are
//! not ready anyway (a crash loop, a failed load) instead of being stuck on them.

use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{Served, labels};

/// The budget, named like the model.
pub fn pdb<S: Served>(model: &S) -> PodDisruptionBudget {
    PodDisruptionBudget {
        metadata: labels::object_meta(model, model.name_any()),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(labels::label_selector(model)),
            unhealthy_pod_eviction_policy: Some("AlwaysAllow".into()),
            ..PodDisruptionBudgetSpec::default()
        }),
        ..PodDisruptionBudget::default()
    }
}
