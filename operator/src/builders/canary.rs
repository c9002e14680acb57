//! A canary's objects: a ConfigMap, a Deployment and a Service named
//! `<model>-canary`, and a NetworkPolicy when the model has one.
//!
//! They are built by the model's own builders from a derived InferenceModel
//! ([`revision`]): the model with the canary's source, config and replicas,
//! no autoscaling, named `<model>-canary`. So the canary's pods carry
//! `serving.nereid.dev/model: <model>-canary` and the model's Service, PDB
//! and HPA, which select `<model>`, never count or route to them; the
//! canary's own Service is what nereid-gateway reads its endpoints from.
//! Three things differ from a model of that name:
//! - the pods serve the model under its real name (a request for `<model>`
//!   that the gateway sends to a canary pod finds it);
//! - every object is owned by the real model, so the garbage collector and
//!   the controller's watches treat them as the model's;
//! - the pods carry [`CANARY_OF`], which maps their events back to it.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use nereid_crds::{Canary, InferenceModel};

use super::deployment::Repository;
use super::{config_map, deployment, labels, network_policy, service};
use crate::context::OperatorConfig;

/// What a canary's objects are named: `<model>-canary`.
pub const SUFFIX: &str = nereid_crds::CANARY_SUFFIX;
/// On a canary's pods: the InferenceModel they are the canary of.
pub const CANARY_OF: &str = "serving.nereid.dev/canary-of";
/// Pods a canary runs unless `spec.canary.replicas` says.
pub const DEFAULT_REPLICAS: i32 = 1;

/// `<model>-canary`.
pub fn name(model: &impl ResourceExt) -> String {
    format!("{}{SUFFIX}", model.name_any())
}

/// A canary's objects, in the order they are applied.
#[derive(Clone, Debug)]
pub struct CanaryObjects {
    pub config_map: ConfigMap,
    pub deployment: Deployment,
    pub service: Service,
    pub network_policy: Option<NetworkPolicy>,
}

/// The InferenceModel a canary's objects are built from (see the module
/// docs); its `metadata` keeps the model's namespace and uid.
pub fn revision(model: &InferenceModel, canary: &Canary) -> InferenceModel {
    let mut revision = model.clone();
    revision.metadata.name = Some(name(model));
    revision.status = None;
    let spec = &mut revision.spec;
    if let Some(source) = &canary.source {
        spec.source = source.clone();
    }
    if canary.config.is_some() {
        spec.config = canary.config.clone();
    }
    spec.replicas = Some(canary.replicas.unwrap_or(DEFAULT_REPLICAS));
    spec.autoscaling = None;
    spec.canary = None;
    revision
}

/// The canary's objects, or `None` without `spec.canary` (existing ones
/// are then deleted).
pub fn objects(model: &InferenceModel, config: &OperatorConfig) -> Option<CanaryObjects> {
    let canary = model.spec.canary.as_ref()?;
    let revision = revision(model, canary);
    let mut config_map = config_map::config_map(&revision);
    let hash = config_map::config_hash(&config_map);
    let repository = Repository {
        served: Some(model.name_any()),
        ..Repository::of_source(model.name_any(), &revision.spec.source)
    };
    let mut deployment = deployment::deployment(&revision, &repository, config, &hash);
    if let Some(meta) = deployment.spec.template.metadata.as_mut() {
        meta.labels
            .get_or_insert_default()
            .insert(CANARY_OF.to_string(), model.name_any());
    }
    let mut service = service::service(&revision);
    let mut network_policy = network_policy::network_policy(&revision);
    owned_by_model(&mut config_map.metadata, model);
    owned_by_model(&mut deployment.metadata, model);
    owned_by_model(&mut service.metadata, model);
    if let Some(policy) = &mut network_policy {
        owned_by_model(&mut policy.metadata, model);
    }
    Some(CanaryObjects {
        config_map,
        deployment,
        service,
        network_policy,
    })
}

/// Makes the real model the object's controller: the derived one's owner
/// reference would name an InferenceModel that does not exist.
fn owned_by_model(meta: &mut ObjectMeta, model: &InferenceModel) {
    meta.owner_references = Some(labels::owner_references(model));
}
