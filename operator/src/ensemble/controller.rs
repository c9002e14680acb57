//! The ModelEnsemble controller: reads the ensemble's member
//! InferenceModels, derives the status ([`super::status`], pure), writes it
//! when it changed and tells its transitions with Events, like the
//! InferenceModel controller.
//!
//! A member changing (created, deleted, becoming Ready) brings back every
//! ensemble of its namespace that runs it: the InferenceModel watch maps a
//! model to those ensembles through the controller's own store of them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, Resource, ResourceExt};
use nereid_crds::{InferenceModel, ModelEnsemble, ModelEnsembleStatus};

use super::status::{self, Member};
use crate::context::Context;
use crate::controller::{SETTLED_REQUEUE, apply, events, log_outcome, measured, now, retry_after, scoped};
use crate::error::Error;

/// The `kind` label of this controller's metrics.
pub const KIND: &str = "ModelEnsemble";

/// Brings one ModelEnsemble's status in line with its members.
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
    let models: Api<InferenceModel> = Api::namespaced(ctx.client.clone(), &namespace);
    let mut found = Vec::new();
    for (name, steps) in status::member_names(ensemble) {
        found.push((name.clone(), steps, models.get_opt(&name).await?));
    }
    let members: Vec<Member<'_>> = found
        .iter()
        .map(|(name, steps, model)| Member {
            name: name.clone(),
            steps: steps.clone(),
            model: model.as_ref(),
        })
        .collect();
    let status = status::derive_status(ensemble, &members, now());
    write_status(ensemble, status, ctx).await?;
    Ok(Action::requeue(SETTLED_REQUEUE))
}

/// Patches the status when it changed, then publishes its transitions.
async fn write_status(ensemble: &ModelEnsemble, status: ModelEnsembleStatus, ctx: &Context) -> Result<(), Error> {
    if ensemble.status.as_ref() == Some(&status) {
        return Ok(());
    }
    let namespace = ensemble.namespace().ok_or(Error::MissingField("namespace"))?;
    let api: Api<ModelEnsemble> = Api::namespaced(ctx.client.clone(), &namespace);
    apply::patch_status(&api, &ensemble.name_any(), &status, &ctx.config.field_manager).await?;
    let previous = ensemble
        .status
        .as_ref()
        .map(|s| s.conditions.as_slice())
        .unwrap_or_default();
    events::publish(&ctx.recorder, &ensemble.object_ref(&()), previous, &status.conditions).await;
    Ok(())
}

/// Runs the controller over `namespace` (or all) until `stop` resolves.
pub async fn run_in(
    ctx: Arc<Context>,
    namespace: Option<String>,
    stop: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let scope = namespace.as_deref();
    let controller = Controller::new(scoped::<ModelEnsemble>(&client, scope), watcher::Config::default());
    let ensembles = controller.store();
    controller
        .with_config(Config::default().debounce(Duration::from_secs(1)))
        .watches(
            scoped::<InferenceModel>(&client, scope),
            watcher::Config::default(),
            move |model| {
                let namespace = model.namespace();
                let name = model.name_any();
                ensembles
                    .state()
                    .into_iter()
                    .filter(|e| e.namespace() == namespace && status::uses(e, &name))
                    .map(|e| ObjectRef::from_obj(&*e))
                    .collect::<Vec<_>>()
            },
        )
        .graceful_shutdown_on(stop)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move { log_outcome(result) })
        .await;
}
