//! What the InferenceModel controller decides, as pure functions of what it
//! read ([`super::observe`]), the operator's settings and the time: the
//! objects to apply ([`objects`]), then the status to write, the Events of
//! its transitions and when to look again ([`report`], [`invalid_spec`]).
//! No API server is needed to test any of it (`tests/plan.rs`).
//!
//! [`Report`] is shared with the ModelEnsemble controller, whose plan has
//! the same shape.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::controller::Action;
use kube::runtime::events::Event;
use nereid_crds::conditions::PROGRESSING;
use nereid_crds::{InferenceModel, InferenceModelStatus};

use super::events;
use super::observe::{AfterApply, BeforeApply};
use crate::builders::{self, Desired};
use crate::context::OperatorConfig;
use crate::error::Error;
use crate::status::revisions::{self, RevisionObserved};
use crate::status::{self, Missing, autoscaling::autoscaling_status};

/// Requeue of a settled model: a safety net, since watches bring changes sooner.
pub const SETTLED_REQUEUE: Duration = Duration::from_secs(60);
/// Requeue while a rollout is in progress: soon enough to notice a failed
/// load (which no watch event announces) within seconds of the grace period.
pub const PROGRESSING_REQUEUE: Duration = Duration::from_secs(10);

/// What a reconcile ends with: the status to write, the Events its
/// condition transitions deserve, and what the controller does next.
pub struct Report<S> {
    /// The new status; `None` when it equals the stored one, which is then
    /// not rewritten (and tells nothing new).
    pub status: Option<S>,
    /// The Events of the transitions from the stored conditions to the new ones.
    pub events: Vec<Event>,
    /// When to look again, or the error the reconcile ends with once the
    /// status is written (its kind decides the retry).
    pub next: Result<Action, Error>,
}

impl<S: PartialEq> Report<S> {
    /// The report of `status` against the `stored` one, whose conditions
    /// `conditions` reads.
    pub fn new(stored: Option<&S>, status: S, conditions: fn(&S) -> &[Condition], next: Result<Action, Error>) -> Self {
        if stored == Some(&status) {
            return Report {
                status: None,
                events: Vec::new(),
                next,
            };
        }
        let previous = stored.map(conditions).unwrap_or_default();
        Report {
            events: events::transitions(previous, conditions(&status)),
            status: Some(status),
            next,
        }
    }
}

/// Every object of `model`, but no autoscaler when another one already
/// scales its pods (an existing one of ours is then removed).
pub fn objects(model: &InferenceModel, before: &BeforeApply, config: &OperatorConfig) -> Desired {
    let mut desired = builders::desired(model, config);
    if before.foreign_autoscaler.is_some() {
        desired.autoscaler = desired.autoscaler.without_object();
    }
    desired
}

/// The report of a model whose objects were applied, at `now`: its status
/// from what the cluster shows, with the versions a pod serves (the previous
/// ones when none answered) and where autoscaling stands; back soon while it
/// rolls out, or as a missing claim's error (retried soon: no watch tells
/// when the claim appears).
pub fn report(
    model: &InferenceModel,
    before: &BeforeApply,
    after: &AfterApply,
    config: &OperatorConfig,
    now: Time,
) -> Report<InferenceModelStatus> {
    let observed = status::Observed {
        deployment: Some(&after.deployment),
        pods: &after.pods,
        missing: before.missing.as_ref(),
        gpus: after.gpus.as_ref(),
    };
    let mut status = status::derive_status(model, &observed, config, now.clone());
    if let Some(versions) = &after.loaded_versions {
        status.loaded_versions = versions.clone();
    }
    if let Some(fetch) = &after.fetch {
        fetch.apply(&mut status.conditions);
    }
    let stable = RevisionObserved {
        deployment: Some(&after.deployment),
        pods: &after.pods,
        figures: after.figures.as_ref(),
    };
    let canary = after.canary.as_ref().map(|c| RevisionObserved {
        deployment: Some(&c.deployment),
        pods: &c.pods,
        figures: c.figures.as_ref(),
    });
    let (revisions, canary_ready) = revisions::revisions(model, &stable, &canary.unwrap_or_default(), &now);
    status.revisions = revisions;
    status.conditions.extend(canary_ready);
    status.autoscaling = autoscaling_status(
        model,
        after.hpa.as_ref(),
        before.foreign_autoscaler.as_deref(),
        after.figures.as_ref(),
    );
    let progressing = status
        .conditions
        .iter()
        .any(|c| c.type_ == PROGRESSING && c.status == "True");
    let next = match &before.missing {
        Some(Missing::Claim(claim)) => Err(Error::MissingClaim(claim.clone())),
        None if progressing => Ok(Action::requeue(PROGRESSING_REQUEUE)),
        None => Ok(Action::requeue(SETTLED_REQUEUE)),
    };
    Report::new(model.status.as_ref(), status, model_conditions, next)
}

/// The report of a model whose spec failed validation with `problems`:
/// nothing is applied, the status says why, and the reconcile fails as an
/// invalid spec (retried slowly: only an edit fixes it).
pub fn invalid_spec(model: &InferenceModel, problems: Vec<String>, now: Time) -> Report<InferenceModelStatus> {
    let status = status::invalid_spec_status(model, &problems, now);
    Report::new(
        model.status.as_ref(),
        status,
        model_conditions,
        Err(Error::InvalidSpec(problems)),
    )
}

/// The conditions of a model's status, for [`Report::new`].
fn model_conditions(status: &InferenceModelStatus) -> &[Condition] {
    &status.conditions
}
