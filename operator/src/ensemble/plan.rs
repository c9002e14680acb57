//! What the ModelEnsemble controller decides, as pure functions of what it
//! read ([`super::observe`]), the operator's settings and the time: whether
//! the ensemble can be deployed now ([`deploy`]), its objects ([`objects`]),
//! then its status, the Events of its transitions and when to look again
//! ([`report`]). Tested without an API server (`tests/ensemble_plan.rs`).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::controller::Action;
use nereid_crds::conditions::{MEMBERS_READY, PROGRESSING};
use nereid_crds::{ModelEnsemble, ModelEnsembleStatus};

use super::members::MemberConfig;
use super::observe::{AfterApply, BeforeApply, MemberRead};
use super::repository::Member as Deployed;
use super::status::{self, Member, Observed};
use super::{objects as builders, tensors};
use crate::builders::Desired;
use crate::context::OperatorConfig;
use crate::controller::plan::{PROGRESSING_REQUEUE, Report, SETTLED_REQUEUE};
use crate::status::autoscaling::autoscaling_status;

/// Whether an ensemble's objects are applied now.
pub enum Deploy<'a> {
    /// Not yet: a member is missing, not Ready or did not tell its config,
    /// the spec is invalid, or an InferenceModel holds the name. What was
    /// applied before stays as it is.
    Wait,
    /// Never as they are: the DAG does not fit what the members serve.
    Mismatch(Vec<String>),
    /// Now, from these members (in step order, each once).
    Now(Vec<Deployed<'a>>),
}

/// Whether `ensemble`, whose members were `read` and whose name is taken
/// or not, is deployed now: once every member told its config, the spec is
/// valid and the name free, the DAG is checked against those configs.
pub fn deploy<'a>(ensemble: &ModelEnsemble, read: &'a [MemberRead], name_taken: bool) -> Deploy<'a> {
    let configs: Option<BTreeMap<String, MemberConfig>> =
        read.iter().map(|r| Some((r.name.clone(), r.config.clone()?))).collect();
    let spec_valid = nereid_crds::validate_ensemble(&ensemble.spec).is_ok();
    let Some(configs) = configs.filter(|_| spec_valid && !name_taken) else {
        return Deploy::Wait;
    };
    if let Err(problems) = tensors::check(&ensemble.spec, &configs) {
        return Deploy::Mismatch(problems);
    }
    Deploy::Now(
        read.iter()
            .filter_map(|r| {
                Some(Deployed {
                    model: r.model.as_ref()?,
                    config: r.config.as_ref()?,
                })
            })
            .collect(),
    )
}

/// The objects to apply now, if any ([`deploy`]): every builder's, but no
/// autoscaler when another one already scales the pods (an existing one of
/// ours is then removed).
pub fn objects(ensemble: &ModelEnsemble, before: &BeforeApply, config: &OperatorConfig) -> Option<Desired> {
    let Deploy::Now(members) = deploy(ensemble, &before.members, before.name_taken) else {
        return None;
    };
    let mut desired = builders::desired(ensemble, &members, config);
    if before.foreign_autoscaler.is_some() {
        desired.autoscaler = desired.autoscaler.without_object();
    }
    Some(desired)
}

/// The report of `ensemble` at `now`: its status from its members and its
/// own Deployment and pods, with where autoscaling stands, and when to look
/// again.
pub fn report(
    ensemble: &ModelEnsemble,
    before: &BeforeApply,
    after: &AfterApply,
    config: &OperatorConfig,
    now: Time,
) -> Report<ModelEnsembleStatus> {
    let tensor_problems = match deploy(ensemble, &before.members, before.name_taken) {
        Deploy::Mismatch(problems) => problems,
        Deploy::Wait | Deploy::Now(_) => Vec::new(),
    };
    let members: Vec<Member<'_>> = before
        .members
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
        name_taken: before.name_taken,
        deployment: after.deployment.as_ref(),
        pods: &after.pods,
    };
    let mut status = status::derive_status(ensemble, &observed, config, now);
    status.autoscaling = autoscaling_status(
        ensemble,
        after.hpa.as_ref(),
        before.foreign_autoscaler.as_deref(),
        after.figures.as_ref(),
    );
    // As written, any Progressing condition (which the status always has)
    // counts as not settled, so an ensemble is looked at every
    // PROGRESSING_REQUEUE even once it serves.
    let settled = status
        .conditions
        .iter()
        .all(|c| c.type_ != PROGRESSING && (c.type_ != MEMBERS_READY || c.status == "True"));
    let next = Ok(Action::requeue(if settled {
        SETTLED_REQUEUE
    } else {
        PROGRESSING_REQUEUE
    }));
    Report::new(ensemble.status.as_ref(), status, ensemble_conditions, next)
}

/// The conditions of an ensemble's status, for [`Report::new`].
fn ensemble_conditions(status: &ModelEnsembleStatus) -> &[Condition] {
    &status.conditions
}
