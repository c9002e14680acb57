//! What the builders build from: a resource served by a Deployment of
//! `nereid-server` pods. An InferenceModel (its one model) and a
//! ModelEnsemble (the ensemble, with its members) both are, so both get
//! their Deployment, Service, PodDisruptionBudget, autoscaler, labels and
//! owner references from the same builders; only what fills the pods'
//! model folder differs ([`super::deployment::Repository`]).

use k8s_openapi::NamespaceResourceScope;
use kube::Resource;
use nereid_crds::{
    Autoscaling, InferenceModel, ModelEnsemble, ModelNetworkPolicy, ModelResources, Scheduling, ServerSpec,
};

/// A resource whose pods serve a model named like it.
pub trait Served: Resource<DynamicType = (), Scope = NamespaceResourceScope> {
    /// `spec.replicas`, when set.
    fn replicas_field(&self) -> Option<i32>;
    fn autoscaling(&self) -> Option<&Autoscaling>;
    fn resources(&self) -> Option<&ModelResources>;
    fn scheduling(&self) -> Option<&Scheduling>;
    fn server(&self) -> Option<&ServerSpec>;
    fn network_policy(&self) -> Option<&ModelNetworkPolicy>;
}

impl Served for InferenceModel {
    fn replicas_field(&self) -> Option<i32> {
        self.spec.replicas
    }
    fn autoscaling(&self) -> Option<&Autoscaling> {
        self.spec.autoscaling.as_ref()
    }
    fn resources(&self) -> Option<&ModelResources> {
        self.spec.resources.as_ref()
    }
    fn scheduling(&self) -> Option<&Scheduling> {
        self.spec.scheduling.as_ref()
    }
    fn server(&self) -> Option<&ServerSpec> {
        self.spec.server.as_ref()
    }
    fn network_policy(&self) -> Option<&ModelNetworkPolicy> {
        self.spec.network_policy.as_ref()
    }
}

impl Served for ModelEnsemble {
    fn replicas_field(&self) -> Option<i32> {
        self.spec.replicas
    }
    fn autoscaling(&self) -> Option<&Autoscaling> {
        self.spec.autoscaling.as_ref()
    }
    fn resources(&self) -> Option<&ModelResources> {
        self.spec.resources.as_ref()
    }
    fn scheduling(&self) -> Option<&Scheduling> {
        self.spec.scheduling.as_ref()
    }
    fn server(&self) -> Option<&ServerSpec> {
        self.spec.server.as_ref()
    }
    /// Ensembles have no `spec.networkPolicy` (yet): their callers are
    /// the same as their members'.
    fn network_policy(&self) -> Option<&ModelNetworkPolicy> {
        None
    }
}
