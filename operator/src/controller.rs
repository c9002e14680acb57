//! The InferenceModel controller: one reconcile, its error policy, and the
//! watches that trigger it.
//!
//! A reconcile is a row of stages, each small enough to read on its own:
//!
//! 1. validate the spec ([`validate`]); an invalid one gets a status that
//!    says why and nothing is applied;
//! 2. check that a `pvc://` claim exists (a missing one is a status
//!    condition, not a reason to stop: the pods start once it appears); a
//!    missing credentials Secret is seen on the pods instead, since the
//!    operator never reads Secrets;
//! 3. build the desired objects ([`crate::builders`], pure);
//! 4. server-side apply each of them with one field manager ([`apply`]),
//!    except an HPA when another autoscaler already scales the pods;
//! 5. list the model's pods and derive the status ([`crate::status`], pure),
//!    asking one ready pod which versions it serves ([`loaded_versions`]),
//!    and reading the nodes' free GPUs while pods wait for GPUs;
//! 6. write the status only when it changed, and tell about condition
//!    transitions with Kubernetes Events ([`events`]).
//!
//! Every object the reconcile writes is owned by the InferenceModel, so the
//! watches of those objects ([`watches`]) bring the controller back whenever
//! someone else changes them or their pods move.

pub mod apply;
pub mod events;
pub mod loaded_versions;
pub mod validate;
pub mod watches;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Node, PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::runtime::controller::{Action, Config, Error as ControllerError};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use nereid_crds::conditions::PROGRESSING;
use nereid_crds::{InferenceModel, InferenceModelStatus};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::builders::{self, AutoscalerObject, Served, deployment, labels, service};
use crate::context::Context;
use crate::error::Error;
use crate::status::{self, Missing, gpus::GpuCapacity};

/// The `kind` label of this controller's metrics.
pub const KIND: &str = "InferenceModel";
/// Requeue of a settled model: a safety net, since watches bring changes sooner.
pub const SETTLED_REQUEUE: Duration = Duration::from_secs(60);
/// Requeue while a rollout is in progress: soon enough to notice a failed
/// load (which no watch event announces) within seconds of the grace period.
pub const PROGRESSING_REQUEUE: Duration = Duration::from_secs(10);

/// Brings one InferenceModel's objects and status in line with its spec.
pub async fn reconcile(model: Arc<InferenceModel>, ctx: Arc<Context>) -> Result<Action, Error> {
    measured(KIND, &ctx, reconcile_stages(&model, &ctx)).await
}

/// What to do after a failed reconcile: count it, and retry after the
/// error kind's backoff.
pub fn error_policy(model: Arc<InferenceModel>, error: &Error, ctx: Arc<Context>) -> Action {
    retry_after(KIND, &*model, error, &ctx)
}

/// Runs one reconcile of a `kind`, counted and timed in the metrics.
pub(crate) async fn measured(
    kind: &'static str,
    ctx: &Context,
    stages: impl Future<Output = Result<Action, Error>>,
) -> Result<Action, Error> {
    let started = Instant::now();
    ctx.metrics.reconcile_started(kind);
    let result = stages.await;
    ctx.metrics.reconcile_duration(kind, started.elapsed().as_secs_f64());
    result
}

/// Every controller's error policy: count the failure, log it, and retry
/// after the error kind's backoff.
pub(crate) fn retry_after<K: ResourceExt>(kind: &'static str, object: &K, error: &Error, ctx: &Context) -> Action {
    ctx.metrics.reconcile_failed(kind, error.kind());
    tracing::warn!(
        resource = kind,
        name = %object.name_any(),
        namespace = object.namespace().unwrap_or_default(),
        kind = error.kind(),
        error = %error,
        "reconcile failed"
    );
    Action::requeue(error.requeue())
}

async fn reconcile_stages(model: &InferenceModel, ctx: &Context) -> Result<Action, Error> {
    let namespace = model.namespace().ok_or(Error::MissingField("namespace"))?;
    let name = model.metadata.name.clone().ok_or(Error::MissingField("name"))?;

    // Being deleted: the garbage collector removes the owned objects; applying
    // them again would only hold up a foreground deletion.
    if model.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }

    // 1. Validate.
    if let Err(problems) = validate::validate(model) {
        let status = status::invalid_spec_status(model, &problems, now());
        write_status(ctx, model, model.status.as_ref(), &status, model_conditions).await?;
        return Err(Error::InvalidSpec(problems));
    }

    // 2. What the pods need: a pvc:// claim (metadata only). Not the
    // credentials Secret: the operator has no right to read Secrets, and the
    // pods report a missing one (`MissingSecret`, from the kubelet's own
    // message), their watch bringing the reconcile back when it appears.
    let missing = missing_source(&ctx.client, &namespace, model).await?;

    // 3 and 4. Build and apply; never a second HPA over pods another one scales.
    let mut desired = builders::desired(model, &ctx.config);
    let foreign = leave_to_a_foreign_autoscaler(&ctx.client, &namespace, model, &mut desired).await?;
    let applied = apply::apply_all(&ctx.client, &namespace, model, desired, &ctx.config.field_manager).await?;

    // 5. Observe.
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);
    let pods = pods
        .list(&ListParams::default().labels(&labels::selector_string(model)))
        .await?
        .items;
    let now = now();
    let gpus = match status::waits_for_gpus(model, &pods, &now) {
        true => gpu_capacity(&ctx.client, model).await,
        false => None,
    };
    let observed = status::Observed {
        deployment: Some(&applied.deployment),
        pods: &pods,
        missing: missing.as_ref(),
        gpus: gpus.as_ref(),
    };
    let mut status = status::derive_status(model, &observed, &ctx.config, now);
    if let Some(versions) = loaded_versions::query(&pods, &name, service::ports(model).http).await {
        status.loaded_versions = versions;
    }
    status.autoscaling = status::autoscaling::autoscaling_status(
        model,
        applied.hpa.as_ref(),
        foreign.as_deref(),
        ctx.board.get(&namespace, &name).as_ref(),
    );
    let progressing = is_true(&status, PROGRESSING);

    // 6. Report.
    write_status(ctx, model, model.status.as_ref(), &status, model_conditions).await?;
    if let Some(Missing::Claim(claim)) = missing {
        return Err(Error::MissingClaim(claim));
    }
    tracing::debug!(model = %name, %namespace, progressing, "reconciled");
    Ok(Action::requeue(if progressing {
        PROGRESSING_REQUEUE
    } else {
        SETTLED_REQUEUE
    }))
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

/// When another autoscaler already scales `model`'s pods, drops the one
/// `desired` would make (an existing one of ours is then removed) and
/// returns the other's name: never two autoscalers over the same pods.
pub(crate) async fn leave_to_a_foreign_autoscaler<S: Served>(
    client: &kube::Client,
    namespace: &str,
    model: &S,
    desired: &mut builders::Desired,
) -> Result<Option<String>, Error> {
    if !desired.autoscaler.is_some() {
        return Ok(None);
    }
    let keda = matches!(desired.autoscaler, AutoscalerObject::Keda(_));
    let foreign = foreign_autoscaler(client, namespace, model, keda).await?;
    if foreign.is_some() {
        desired.autoscaler = match desired.autoscaler {
            AutoscalerObject::Hpa(_) => AutoscalerObject::Hpa(None),
            AutoscalerObject::Keda(_) => AutoscalerObject::Keda(None),
        };
    }
    Ok(foreign)
}

/// The name of an HPA the model does not own that scales its pods (through
/// the InferenceModel or its Deployment), if there is one. With `keda`, the
/// HPA KEDA made for the model's own ScaledObject is not foreign.
async fn foreign_autoscaler<S: Served>(
    client: &kube::Client,
    namespace: &str,
    model: &S,
    keda: bool,
) -> Result<Option<String>, Error> {
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

/// Patches `object`'s status subresource when `status` differs from the
/// one it has (`current`), then publishes an Event per transition of its
/// `conditions`. Events are best effort: failing to publish one is logged,
/// not retried.
pub(crate) async fn write_status<K, S>(
    ctx: &Context,
    object: &K,
    current: Option<&S>,
    status: &S,
    conditions: fn(&S) -> &[Condition],
) -> Result<(), Error>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned,
    S: PartialEq + Serialize,
{
    if current == Some(status) {
        return Ok(());
    }
    let namespace = object.namespace().ok_or(Error::MissingField("namespace"))?;
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &namespace);
    apply::patch_status(&api, &object.name_any(), status, &ctx.config.field_manager).await?;
    let previous = current.map(conditions).unwrap_or_default();
    events::publish(&ctx.recorder, &object.object_ref(&()), previous, conditions(status)).await;
    Ok(())
}

/// The conditions of a model's status, for [`write_status`].
fn model_conditions(status: &InferenceModelStatus) -> &[Condition] {
    &status.conditions
}

fn is_true(status: &InferenceModelStatus, type_: &str) -> bool {
    status.conditions.iter().any(|c| c.type_ == type_ && c.status == "True")
}

pub(crate) fn now() -> Time {
    Time(Timestamp::now())
}

/// Runs the controller until `shutdown` resolves; reconciles in flight finish first.
///
/// `namespaces` limits the watches to those namespaces (one controller each,
/// so the operator needs rights there only); `None` watches the whole cluster.
pub async fn run(
    ctx: Arc<Context>,
    namespaces: Option<Vec<String>>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    // `graceful_shutdown_on` wants a `Sync` future; a token gives one.
    let stop = CancellationToken::new();
    let stopper = tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown.await;
            stop.cancel();
        }
    });
    match namespaces {
        None => run_in(ctx, None, stop).await,
        Some(namespaces) => {
            let controllers = namespaces
                .into_iter()
                .map(|namespace| run_in(ctx.clone(), Some(namespace), stop.clone()));
            futures::future::join_all(controllers).await;
        }
    }
    stopper.abort();
}

/// The controllers over `namespace` (or all namespaces): InferenceModels,
/// and ModelEnsembles ([`crate::ensemble::controller`]).
///
/// Owned objects are watched through their metadata only and filtered to the
/// operator's label; pods are watched (by label) because their state changes
/// are what the status reports. Secrets are never read, listed or watched:
/// a missing credentials Secret shows on the pods, whose watch brings the
/// controller back once the kubelet can start them.
async fn run_in(ctx: Arc<Context>, namespace: Option<String>, stop: CancellationToken) {
    let client = ctx.client.clone();
    let scope = namespace.as_deref();
    let managed = watcher::Config::default().labels(&labels::managed_selector());
    let controller = Controller::new(scoped::<InferenceModel>(&client, scope), watcher::Config::default())
        .with_config(Config::default().debounce(Duration::from_secs(1)))
        .owns(scoped::<ConfigMap>(&client, scope), managed.clone())
        .owns(scoped::<Deployment>(&client, scope), managed.clone())
        .owns(scoped::<Service>(&client, scope), managed.clone())
        .owns(scoped::<PodDisruptionBudget>(&client, scope), managed.clone())
        .owns(scoped::<NetworkPolicy>(&client, scope), managed.clone())
        .owns(scoped::<HorizontalPodAutoscaler>(&client, scope), managed.clone())
        .watches(scoped::<Pod>(&client, scope), managed, |pod| {
            watches::model_of_pod(&pod)
        })
        .graceful_shutdown_on(stop.clone().cancelled_owned())
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| async move { log_outcome(result) });
    let ensembles = crate::ensemble::controller::run_in(ctx, namespace, stop.cancelled_owned());
    futures::join!(controller, ensembles);
}

/// Logs what a controller's stream yields that nobody else reported.
pub(crate) fn log_outcome<K>(result: Result<(ObjectRef<K>, Action), ControllerError<Error, watcher::Error>>)
where
    K: Resource,
    K::DynamicType: std::fmt::Debug + Eq + std::hash::Hash + Clone,
{
    match result {
        Ok((object, _)) => tracing::trace!(%object, "reconciled"),
        // Already counted and logged by the error policy.
        Err(ControllerError::ReconcilerFailed(..)) => {}
        // A deleted object's owned objects and pods go after it, and their
        // watch events still name it: expected, not a problem.
        Err(ControllerError::ObjectNotFound(object)) => {
            tracing::debug!(%object, "not reconciled: already deleted");
        }
        Err(error) => tracing::warn!(%error, "controller error"),
    }
}

/// An API over one namespace, or over all of them.
pub(crate) fn scoped<K>(client: &kube::Client, namespace: Option<&str>) -> Api<K>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    match namespace {
        Some(namespace) => Api::namespaced(client.clone(), namespace),
        None => Api::all(client.clone()),
    }
}
