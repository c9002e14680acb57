//! The desired state of one InferenceModel, as plain Kubernetes objects; the
//! same builders make a ModelEnsemble's ([`crate::ensemble`]), through [`served`].
//!
//! Every builder is a pure function of the InferenceModel (and the operator's
//! settings): no API calls, no clocks, no randomness. The same spec always
//! builds the same objects, so server-side apply is a no-op when nothing
//! changed, and each builder is unit-tested on its own.
//!
//! - [`served`]: what an InferenceModel and a ModelEnsemble share for building.
//! - [`labels`]: the labels, selector and owner reference every object shares.
//! - [`config_map`]: the model config override, as Triton's JSON.
//! - [`deployment`]: the serving pods.
//! - [`service`]: the in-cluster HTTP, gRPC and metrics endpoints.
//! - [`pdb`]: the disruption budget that keeps voluntary evictions gentle.
//! - [`network_policy`]: who may reach the pods, when the spec says.
//! - [`canary`]: a canary's ConfigMap, Deployment and Service, from the
//!   same builders.
//! - [`hpa`]: the HorizontalPodAutoscaler, when the spec asks for autoscaling,
//!   or [`scaled_object`], KEDA's ScaledObject, with `--autoscaler keda`.

pub mod canary;
pub mod config_map;
pub mod deployment;
pub mod hpa;
pub mod labels;
pub mod network_policy;
pub mod pdb;
pub mod scaled_object;
pub mod served;
pub mod service;

pub use served::Served;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::DynamicObject;
use nereid_crds::InferenceModel;

use crate::context::{Autoscaler, OperatorConfig};

/// Everything one InferenceModel turns into, in the order it is applied:
/// the ConfigMap before the Deployment whose pods mount it.
#[derive(Clone, Debug)]
pub struct Desired {
    pub config_map: ConfigMap,
    pub deployment: Deployment,
    pub service: Service,
    pub pdb: PodDisruptionBudget,
    /// `None` when the spec asks for none (an existing one is then deleted).
    pub network_policy: Option<NetworkPolicy>,
    /// What scales the model.
    pub autoscaler: AutoscalerObject,
    /// The canary's objects, when the resource can have one.
    pub canary: CanaryState,
}

/// What the apply does about a canary.
#[derive(Clone, Debug)]
pub enum CanaryState {
    /// The resource has no canaries (a ModelEnsemble): nothing to look for.
    Unsupported,
    /// No `spec.canary`: the objects of one there was are deleted.
    Absent,
    /// `spec.canary`'s objects.
    Present(Box<canary::CanaryObjects>),
}

/// The object `spec.autoscaling` becomes, by the operator's `--autoscaler`;
/// `None` without `spec.autoscaling` (an existing one is then deleted).
#[derive(Clone, Debug)]
pub enum AutoscalerObject {
    Hpa(Option<Box<HorizontalPodAutoscaler>>),
    Keda(Option<Box<DynamicObject>>),
}

impl AutoscalerObject {
    /// Whether the spec asks for autoscaling.
    pub fn is_some(&self) -> bool {
        match self {
            AutoscalerObject::Hpa(hpa) => hpa.is_some(),
            AutoscalerObject::Keda(object) => object.is_some(),
        }
    }

    /// The same kind with no object: what the apply removes ours with,
    /// when another autoscaler already scales the pods.
    pub fn without_object(&self) -> Self {
        match self {
            AutoscalerObject::Hpa(_) => AutoscalerObject::Hpa(None),
            AutoscalerObject::Keda(_) => AutoscalerObject::Keda(None),
        }
    }
}

/// Builds every object of `model`. The Deployment's pod template carries the
/// hash of the ConfigMap, so a config change rolls the pods.
pub fn desired(model: &InferenceModel, config: &OperatorConfig) -> Desired {
    let config_map = config_map::config_map(model);
    let hash = config_map::config_hash(&config_map);
    Desired {
        deployment: deployment::deployment(model, &deployment::Repository::of_model(model), config, &hash),
        service: service::service(model),
        pdb: pdb::pdb(model),
        network_policy: network_policy::network_policy(model),
        autoscaler: match &config.autoscaler {
            Autoscaler::Hpa => AutoscalerObject::Hpa(hpa::hpa(model).map(Box::new)),
            Autoscaler::Keda {
                scaler_address,
                trigger_authentication,
            } => AutoscalerObject::Keda(
                scaled_object::scaled_object(model, scaler_address, trigger_authentication.as_deref()).map(Box::new),
            ),
        },
        canary: match canary::objects(model, config) {
            Some(objects) => CanaryState::Present(Box::new(objects)),
            None => CanaryState::Absent,
        },
        config_map,
    }
}
