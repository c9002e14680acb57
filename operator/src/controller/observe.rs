//! Every read of the InferenceModel controller, in two rounds around the
//! apply: what decides the objects ([`before_apply`]), and what the objects
//! became ([`after_apply`]). Nothing here decides anything; the plan
//! ([`super::plan`]) does, from the structs these fill.
//!
//! Why two rounds and not one: the status is derived from the Deployment
//! the apply answers with. Its `generation` tells whether the Deployment
//! controller has seen the spec just applied; the Deployment as it was
//! before the apply would call a rollout that has not started "complete".

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use nereid_crds::InferenceModel;

use super::apply::{self, Applied};
use super::{fetch_progress, loaded_versions};
use crate::autoscaling::figures::Figures;
use crate::builders::{Served, canary, deployment, labels, service};
use crate::context::{Autoscaler, Context};
use crate::error::Error;
use crate::status::{self, Missing, fetch::FetchProgress, gpus::GpuCapacity};

/// What decides a model's objects, read before anything is written.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BeforeApply {
    /// What the pods need that does not exist: a pvc:// claim. Not the
    /// credentials Secret: the operator has no right to read Secrets, and
    /// the pods report a missing one (`MissingSecret`, from the kubelet's
    /// own message), their watch bringing the reconcile back when it appears.
    pub missing: Option<Missing>,
    /// Another HPA that scales the model's pods, by name: the operator then
    /// makes none (never two autoscalers over the same pods).
    pub foreign_autoscaler: Option<String>,
}

/// What the cluster shows once a model's objects are applied.
#[derive(Clone, Debug)]
pub struct AfterApply {
    /// The Deployment as the apply answered, with its status.
    pub deployment: Deployment,
    /// The model's HPA (KEDA's, with a ScaledObject) as applied or read, with its status.
    pub hpa: Option<HorizontalPodAutoscaler>,
    /// The model's pods.
    pub pods: Vec<Pod>,
    /// The nodes' free GPUs, read only while pods wait for GPUs, and
    /// `None` when they cannot be read.
    pub gpus: Option<GpuCapacity>,
    /// The versions a ready pod serves; `None` when none answered.
    pub loaded_versions: Option<Vec<String>>,
    /// How far a pod that downloads the model is; `None` when none does
    /// (or none answered).
    pub fetch: Option<FetchProgress>,
    /// The model's figures from the scraper's latest round.
    pub figures: Option<Figures>,
    /// With `spec.canary`: its Deployment, pods and figures.
    pub canary: Option<CanaryAfterApply>,
}

/// What the cluster shows of a model's canary.
#[derive(Clone, Debug)]
pub struct CanaryAfterApply {
    pub deployment: Deployment,
    pub pods: Vec<Pod>,
    pub figures: Option<Figures>,
}

/// Reads what decides `model`'s objects: whether its claim exists (only
/// metadata is read), and, when it asks for autoscaling, whether another
/// autoscaler already scales its pods.
pub async fn before_apply(
    client: &kube::Client,
    namespace: &str,
    model: &InferenceModel,
    autoscaler: &Autoscaler,
) -> Result<BeforeApply, Error> {
    Ok(BeforeApply {
        missing: missing_source(client, namespace, model).await?,
        foreign_autoscaler: foreign_autoscaler(client, namespace, model, autoscaler).await?,
    })
}

/// Reads what `model`'s objects became: the apply's answers, the pods, the
/// nodes' free GPUs while pods wait for them (judged at `now`), the loaded
/// versions (asked of one ready pod) and the scraper's figures.
pub async fn after_apply(
    ctx: &Context,
    namespace: &str,
    model: &InferenceModel,
    applied: Applied,
    now: &Time,
) -> Result<AfterApply, Error> {
    let name = model.name_any();
    let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
        .list(&ListParams::default().labels(&labels::selector_string(model)))
        .await?
        .items;
    let gpus = match status::waits_for_gpus(model, &pods, now) {
        true => gpu_capacity(&ctx.client, model).await,
        false => None,
    };
    let loaded_versions = loaded_versions::query(&pods, &name, service::ports(model).http).await;
    let fetch = fetch_progress::query(&pods).await;
    let canary = match (&model.spec.canary, applied.canary) {
        (Some(spec), Some(deployment)) => {
            let revision = canary::revision(model, spec);
            let pods = Api::<Pod>::namespaced(ctx.client.clone(), namespace)
                .list(&ListParams::default().labels(&labels::selector_string(&revision)))
                .await?
                .items;
            Some(CanaryAfterApply {
                deployment,
                pods,
                figures: ctx.board.get(namespace, &revision.name_any()),
            })
        }
        _ => None,
    };
    Ok(AfterApply {
        canary,
        deployment: applied.deployment,
        hpa: applied.hpa,
        pods,
        gpus,
        loaded_versions,
        fetch,
        figures: ctx.board.get(namespace, &name),
    })
}

/// The pvc:// claim the model names, when it does not exist. Only
/// metadata is read.
async fn missing_source(
    client: &kube::Client,
    namespace: &str,
    model: &InferenceModel,
) -> Result<Option<Missing>, Error> {
    if let Some((claim, _)) = deployment::pvc_source(&model.spec.source.uri) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
        if claims.get_metadata_opt(claim).await?.is_none() {
            return Ok(Some(Missing::Claim(claim.to_string())));
        }
    }
    Ok(None)
}

/// The free GPUs of the model's GPU resource on the cluster's nodes, or
/// `None` when they cannot be read (an operator limited to some namespaces
/// may not read nodes, or other namespaces' pods): the status then quotes
/// the scheduler alone.
async fn gpu_capacity(client: &kube::Client, model: &InferenceModel) -> Option<GpuCapacity> {
    let (wanted, resource) = deployment::gpus(model);
    let read = async {
        let nodes = Api::<Node>::all(client.clone())
            .list(&ListParams::default())
            .await?
            .items;
        let mut pods = Vec::new();
        let holders = nodes.iter().filter(|node| {
            let allocatable = node.status.as_ref().and_then(|s| s.allocatable.as_ref());
            allocatable.is_some_and(|a| a.contains_key(&resource))
        });
        // Only the pods of nodes that have the resource, by field selector.
        for node in holders {
            let Some(name) = node.metadata.name.as_deref() else {
                continue;
            };
            let on_node = ListParams::default().fields(&format!(
                "spec.nodeName={name},status.phase!=Succeeded,status.phase!=Failed"
            ));
            pods.extend(Api::<Pod>::all(client.clone()).list(&on_node).await?.items);
        }
        Ok::<_, kube::Error>(status::gpus::capacity(&resource, wanted, &nodes, &pods))
    };
    match read.await {
        Ok(capacity) => Some(capacity),
        Err(error) => {
            tracing::debug!(%error, "cannot read the nodes' free GPUs");
            None
        }
    }
}

/// The name of an HPA the model does not own that scales its pods (through
/// the model or its Deployment), if there is one; nothing is read when the
/// model asks for no autoscaling. With KEDA (`autoscaler`), the HPA KEDA
/// made for the model's own ScaledObject is not foreign.
pub(crate) async fn foreign_autoscaler<S: Served>(
    client: &kube::Client,
    namespace: &str,
    model: &S,
    autoscaler: &Autoscaler,
) -> Result<Option<String>, Error> {
    if model.autoscaling().is_none() {
        return Ok(None);
    }
    let keda = matches!(autoscaler, Autoscaler::Keda { .. });
    let hpas: Api<HorizontalPodAutoscaler> = Api::namespaced(client.clone(), namespace);
    let name = model.name_any();
    let kind = S::kind(&());
    let foreign = hpas.list(&ListParams::default()).await?.items.into_iter().find(|hpa| {
        let target = &hpa.spec.scale_target_ref;
        let ours = (target.kind == kind || target.kind == "Deployment") && target.name == name;
        let from_our_scaled_object = keda
            && hpa
                .owner_references()
                .iter()
                .any(|owner| owner.kind == "ScaledObject" && owner.name == name && owner.controller == Some(true));
        ours && !apply::owned_by(&hpa.metadata, model) && !from_our_scaled_object
    });
    Ok(foreign.map(|hpa| hpa.name_any()))
}
