//! The InferenceModel controller: one reconcile, its error policy, and the
//! watches that trigger it.
//!
//! A reconcile reads ([`observe`]), decides ([`plan`], pure) and writes
//! ([`apply`]), in two rounds, because the status is derived from what the
//! apply answers (the Deployment's generation says whether its controller
//! has seen the new spec):
//!
//! 1. validate the spec ([`validate`]); an invalid one gets a status that
//!    says why ([`plan::invalid_spec`]) and nothing is read or applied;
//! 2. read what decides the objects ([`observe::before_apply`]): whether a
//!    `pvc://` claim exists (a missing one is a status condition, not a
//!    reason to stop: the pods start once it appears; a missing credentials
//!    Secret is seen on the pods instead, since the operator never reads
//!    Secrets), and whether another autoscaler already scales the pods;
//! 3. build the objects ([`plan::objects`], the pure [`crate::builders`])
//!    and server-side apply each with one field manager
//!    ([`apply::apply_all`]), but no HPA over pods another one scales;
//! 4. read what they became ([`observe::after_apply`]): the apply's
//!    answers, the pods, one ready pod's loaded versions
//!    ([`loaded_versions`]), the nodes' free GPUs while pods wait for GPUs;
//! 5. derive the status, the Events of its condition transitions
//!    ([`events`]) and the requeue ([`plan::report`], pure), and write the
//!    status only when it changed ([`apply::report`]);
//! 6. scale a model with minReplicas 0 to zero once it has been quiet for
//!    its window, or look again when the window ends ([`idle`]).
//!
//! Every object the reconcile writes is owned by the InferenceModel, so the
//! watches of those objects ([`watches`]) bring the controller back whenever
//! someone else changes them or their pods move.

pub mod apply;
pub mod events;
pub mod fetch_progress;
pub mod idle;
pub mod loaded_versions;
pub mod observe;
pub mod plan;
pub mod validate;
pub mod watches;

pub use plan::{PROGRESSING_REQUEUE, SETTLED_REQUEUE};

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::controller::{Action, Config, Error as ControllerError};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use nereid_crds::InferenceModel;
use tokio_util::sync::CancellationToken;

use crate::builders::labels;
use crate::context::Context;
use crate::error::Error;

/// The `kind` label of this controller's metrics.
pub const KIND: &str = "InferenceModel";

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

    // 1. Validate: an invalid spec is reported, nothing is read or applied.
    if let Err(problems) = validate::validate(model) {
        return apply::report(ctx, model, plan::invalid_spec(model, problems, now())).await;
    }

    // 2 and 3. What decides the objects; the objects, applied.
    let before = observe::before_apply(&ctx.client, &namespace, model, &ctx.config.autoscaler).await?;
    let desired = plan::objects(model, &before, &ctx.config);
    let applied = apply::apply_all(&ctx.client, &namespace, model, desired, &ctx.config.field_manager).await?;

    // 4 and 5. What they became; the status, written when it changed.
    let now = now();
    let after = observe::after_apply(ctx, &namespace, model, applied, &now).await?;
    let report = plan::report(model, &before, &after, &ctx.config, now);
    let next = apply::report(ctx, model, report).await;
    // 6. A model quiet for its window goes to sleep ([`idle`]).
    let next = idle::settle(ctx, model, after.figures.as_ref(), next).await;
    tracing::debug!(model = %name, %namespace, next = ?next.as_ref().ok(), "reconciled");
    next
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
