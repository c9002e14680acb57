//! The ModelEnsemble controller. A reconcile reads ([`super::observe`]),
//! decides ([`super::plan`], pure) and writes (`crate::controller::apply`),
//! in two rounds as an InferenceModel's does:
//!
//! 1. read the member InferenceModels and, from one ready pod of each,
//!    the config it serves ([`super::members`]), and whether an
//!    InferenceModel holds the ensemble's name;
//! 2. once every member is there and Ready, check the DAG against those
//!    configs ([`super::tensors`]), then build the ensemble's objects
//!    ([`super::objects`], the InferenceModel's builders) and apply them
//!    with server-side apply, as the InferenceModel controller does (never
//!    a second autoscaler over pods another one scales); while a member is
//!    missing or not Ready, what was applied before stays as it is;
//! 3. read what the ensemble's own objects became and its pods, derive the
//!    status ([`super::status`], pure), write it when it changed and tell
//!    its transitions with Events.
//!
//! A member changing (created, deleted, becoming Ready) brings back every
//! ensemble of its namespace that runs it: the InferenceModel watch maps a
//! model to those ensembles through the controller's own store of them.
//! The ensemble's owned objects and pods are watched like a model's.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use nereid_crds::{InferenceModel, ModelEnsemble};

use super::{observe, plan, status};
use crate::builders::labels;
use crate::context::Context;
use crate::controller::{apply, log_outcome, measured, now, retry_after, scoped};
use crate::error::Error;

/// The `kind` label of this controller's metrics.
pub const KIND: &str = "ModelEnsemble";

/// Brings one ModelEnsemble's objects and status in line with its spec and members.
pub async fn reconcile(ensemble: Arc<ModelEnsemble>, ctx: Arc<Context>) -> Result<Action, Error> {
    measured(KIND, &ctx, reconcile_stages(&ensemble, &ctx)).await
}

/// What to do after a failed reconcile: count it, and retry after the
/// error kind's backoff.
pub fn error_policy(ensemble: Arc<ModelEnsemble>, error: &Error, ctx: Arc<Context>) -> Action {
    retry_after(KIND, &*ensemble, error, &ctx)
}

async fn reconcile_stages(ensemble: &ModelEnsemble, ctx: &Context) -> Result<Action, Error> {
    let namespace = ensemble.namespace().ok_or(Error::MissingField("namespace"))?;
    if ensemble.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }

    // 1 and 2. The members and what they serve; the objects, applied once
    // they can be.
    let before = observe::before_apply(ctx, &namespace, ensemble).await?;
    let applied = match plan::objects(ensemble, &before, &ctx.config) {
        Some(desired) => {
            Some(apply::apply_all(&ctx.client, &namespace, ensemble, desired, &ctx.config.field_manager).await?)
        }
        None => None,
    };

    // 3. What the ensemble's objects became; the status, written when it changed.
    let after = observe::after_apply(ctx, &namespace, ensemble, applied).await?;
    let report = plan::report(ensemble, &before, &after, &ctx.config, now());
    apply::report(ctx, ensemble, report).await
}

/// Runs the controller over `namespace` (or all) until `stop` resolves.
pub async fn run_in(
    ctx: Arc<Context>,
    namespace: Option<String>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let scope = namespace.as_deref();
    let managed = watcher::Config::default().labels(&labels::managed_selector());
    let controller = Controller::new(scoped::<ModelEnsemble>(&client, scope), watcher::Config::default());
    let ensembles = controller.store();
    controller
        .with_config(Config::default().debounce(Duration::from_secs(1)))
        .owns(scoped::<ConfigMap>(&client, scope), managed.clone())
        .owns(scoped::<Deployment>(&client, scope), managed.clone())
        .owns(scoped::<Service>(&client, scope), managed.clone())
        .owns(scoped::<PodDisruptionBudget>(&client, scope), managed.clone())
        .owns(scoped::<HorizontalPodAutoscaler>(&client, scope), managed.clone())
        .watches(scoped::<Pod>(&client, scope), managed, |pod| {
            let name = pod.labels().get(labels::MODEL)?.clone();
            Some(ObjectRef::<ModelEnsemble>::new(&name).within(&pod.namespace()?))
        })
        .watches(
            scoped::<InferenceModel>(&client, scope),
            watcher::Config::default(),
            move |model| {
                let namespace = model.namespace();
                let name = model.name_any();
                ensembles
                    .state()
                    .into_iter()
                    .filter(|e| e.namespace() == namespace && (status::uses(e, &name) || e.name_any() == name))
                    .map(|e| ObjectRef::from_obj(&*e))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move { log_outcome(result) })
        .await;
}
