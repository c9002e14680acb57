//! The ModelEnsemble controller. A reconcile:
//!
//! 1. reads the member InferenceModels and, from one ready pod of each,
//!    the config it serves ([`super::members`]);
//! 2. once every member is there and Ready, checks the DAG against those
//!    configs ([`super::tensors`]), then builds the ensemble's objects
//!    ([`super::objects`], the InferenceModel's builders) and applies them
//!    with server-side apply, as the InferenceModel controller does (never
//!    a second autoscaler over pods another one scales); while a member is
//!    missing or not Ready, what was applied before stays as it is;
//! 3. lists the ensemble's pods and derives the status ([`super::status`],
//!    pure), writes it when it changed and tells its transitions with
//!    Events.
//!
//! A member changing (created, deleted, becoming Ready) brings back every
//! ensemble of its namespace that runs it: the InferenceModel watch maps a
//! model to those ensembles through the controller's own store of them.
//! The ensemble's owned objects and pods are watched like a model's.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::ListParams;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{Controller, watcher};
use kube::{Api, ResourceExt};
use nereid_crds::conditions::PROGRESSING;
use nereid_crds::{InferenceModel, ModelEnsemble, ModelEnsembleStatus};

use super::members::{self, MemberConfig};
use super::repository::Member as Deployed;
use super::status::{self, Member, Observed};
use super::{objects, tensors};
use crate::builders::{labels, service};
use crate::context::Context;
use crate::controller::{
    PROGRESSING_REQUEUE, SETTLED_REQUEUE, apply, leave_to_a_foreign_autoscaler, log_outcome, measured, now,
    retry_after, scoped, write_status,
};
use crate::error::Error;
use crate::status::autoscaling::autoscaling_status;

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

/// A member as read: its object, and the config one of its pods told.
struct Read {
    name: String,
    steps: Vec<String>,
    model: Option<InferenceModel>,
    config: Option<MemberConfig>,
}

async fn reconcile_stages(ensemble: &ModelEnsemble, ctx: &Context) -> Result<Action, Error> {
    let namespace = ensemble.namespace().ok_or(Error::MissingField("namespace"))?;
    let name = ensemble.name_any();
    if ensemble.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    let models: Api<InferenceModel> = Api::namespaced(ctx.client.clone(), &namespace);
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &namespace);

    // 1. The members, and what they serve.
    let mut read = Vec::new();
    for (member, steps) in status::member_names(ensemble) {
        let model = models.get_opt(&member).await?;
        let config = match model.as_ref().filter(|m| status::is_ready(m)) {
            Some(model) => {
                let member_pods = pods
                    .list(&ListParams::default().labels(&labels::selector_string(model)))
                    .await?
                    .items;
                members::query(&member_pods, &member, service::ports(model).http).await
            }
            None => None,
        };
        read.push(Read {
            name: member,
            steps,
            model,
            config,
        });
    }
    let name_taken = models.get_metadata_opt(&name).await?.is_some();
    let spec_valid = nereid_crds::validate_ensemble(&ensemble.spec).is_ok();

    // 2. Check the tensors and apply, once every member told its config.
    let configs: Option<BTreeMap<String, MemberConfig>> =
        read.iter().map(|r| Some((r.name.clone(), r.config.clone()?))).collect();
    let mut tensor_problems = Vec::new();
    let mut applied = None;
    let mut foreign = None;
    if let (Some(configs), true, false) = (&configs, spec_valid, name_taken) {
        tensor_problems = tensors::check(&ensemble.spec, configs).err().unwrap_or_default();
        if tensor_problems.is_empty() {
            let deployed: Vec<Deployed<'_>> = read
                .iter()
                .filter_map(|r| {
                    Some(Deployed {
                        model: r.model.as_ref()?,
                        config: r.config.as_ref()?,
                    })
                })
                .collect();
            let mut desired = objects::desired(ensemble, &deployed, &ctx.config);
            foreign = leave_to_a_foreign_autoscaler(&ctx.client, &namespace, ensemble, &mut desired).await?;
            applied =
                Some(apply::apply_all(&ctx.client, &namespace, ensemble, desired, &ctx.config.field_manager).await?);
        }
    }

    // 3. Observe and report.
    let (deployment, hpa) = match applied {
        Some(applied) => (Some(applied.deployment), applied.hpa),
        None => owned_deployment_and_hpa(ctx, &namespace, ensemble).await?,
    };
    let ensemble_pods = pods
        .list(&ListParams::default().labels(&labels::selector_string(ensemble)))
        .await?
        .items;
    let members: Vec<Member<'_>> = read
        .iter()
        .map(|r| Member {
            name: r.name.clone(),
            steps: r.steps.clone(),
            model: r.model.as_ref(),
            config_known: r.config.is_some(),
        })
        .collect();
    let observed = Observed {
        members: &members,
        tensor_problems: &tensor_problems,
        name_taken,
        deployment: deployment.as_ref(),
        pods: &ensemble_pods,
    };
    let mut status = status::derive_status(ensemble, &observed, &ctx.config, now());
    status.autoscaling = autoscaling_status(
        ensemble,
        hpa.as_ref(),
        foreign.as_deref(),
        ctx.board.get(&namespace, &name).as_ref(),
    );
    let settled = status
        .conditions
        .iter()
        .all(|c| c.type_ != PROGRESSING && (c.type_ != nereid_crds::conditions::MEMBERS_READY || c.status == "True"));
    write_status(ctx, ensemble, ensemble.status.as_ref(), &status, ensemble_conditions).await?;
    Ok(Action::requeue(if settled {
        SETTLED_REQUEUE
    } else {
        PROGRESSING_REQUEUE
    }))
}

/// What was applied before, when nothing is applied now (a member is not
/// ready): the ensemble's Deployment and HPA, if it owns them.
async fn owned_deployment_and_hpa(
    ctx: &Context,
    namespace: &str,
    ensemble: &ModelEnsemble,
) -> Result<(Option<Deployment>, Option<HorizontalPodAutoscaler>), Error> {
    let name = ensemble.name_any();
    let owned = |meta: &kube::api::ObjectMeta| apply::owned_by(meta, ensemble);
    let deployment = Api::<Deployment>::namespaced(ctx.client.clone(), namespace)
        .get_opt(&name)
        .await?
        .filter(|d| owned(&d.metadata));
    let hpa = Api::<HorizontalPodAutoscaler>::namespaced(ctx.client.clone(), namespace)
        .get_opt(&name)
        .await?
        .filter(|h| owned(&h.metadata));
    Ok((deployment, hpa))
}

/// The conditions of an ensemble's status, for [`write_status`].
fn ensemble_conditions(status: &ModelEnsembleStatus) -> &[Condition] {
    &status.conditions
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
