//! An InferenceModel's status, derived from what the cluster shows.
//!
//! Pure functions: the owned Deployment, the model's pods, whether the
//! credentials Secret exists, and the time go in; an `InferenceModelStatus`
//! comes out. Nothing here hopes: `Ready` is True only when every wanted
//! replica is ready (its readiness probe is the model's own ready endpoint)
//! and no pod shows a problem, so a crash-looping rollout or a failed load
//! never looks ready. Unchanged inputs give an equal status (transition
//! times and failure times are kept), so the controller writes only changes.
//!
//! - [`pods`]: reasons read from the pods (waiting reasons, scheduler messages).
//! - [`conditions`]: setting conditions with Kubernetes' transition-time rules.
//! - [`autoscaling`]: what the model's HPA and the scrapes of its pods say.

pub mod autoscaling;
pub mod conditions;
pub mod pods;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use nereid_crds::conditions::{DEGRADED, MODEL_LOADED, PROGRESSING, READY, reason};
use nereid_crds::{Endpoints, Failure, InferenceModel, InferenceModelStatus};

use self::conditions::{Conditions, reason as local};
use self::pods::Finding;
use crate::builders::{deployment, labels, service};

/// Where the Deployment's rollout stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rollout {
    /// Every wanted replica runs the latest spec and is available.
    Complete,
    /// Pods are being created or replaced.
    InProgress(String),
    /// The Deployment controller gave up (`ProgressDeadlineExceeded`).
    Stalled(String),
}

/// The status of `model`, given its Deployment (as last applied or read),
/// its pods, the name of its credentials Secret if that is missing, and `now`.
pub fn derive_status(
    model: &InferenceModel,
    deployment: Option<&Deployment>,
    pods: &[Pod],
    secret_missing: Option<&str>,
    cluster_domain: &str,
    now: Time,
) -> InferenceModelStatus {
    let previous = model.status.clone().unwrap_or_default();
    let name = model.name_any();
    let generation = model.metadata.generation;
    let wanted = deployment
        .and_then(|d| d.spec.replicas)
        .unwrap_or_else(|| deployment::replicas(model));
    let observed = deployment.and_then(|d| d.status.as_ref());
    let replicas = observed.and_then(|s| s.replicas).unwrap_or(0);
    let ready = observed.and_then(|s| s.ready_replicas).unwrap_or(0);

    let (_, gpu_resource) = deployment::gpus(model);
    let report = pods::diagnose(pods, &name, &gpu_resource, &now);
    let worst = match secret_missing {
        Some(secret) => Some(Finding {
            reason: reason::MISSING_SECRET.to_string(),
            message: format!(
                "Secret '{secret}' (spec.source.credentialsSecret) does not exist in namespace '{}'; \
                 the pods cannot start until it does",
                model.namespace().unwrap_or_default()
            ),
        }),
        None => report.worst(),
    };
    let rollout = rollout(deployment, wanted);

    let mut conditions = Conditions::new(&previous.conditions, generation, &now);
    let ready_message = format!("{ready}/{wanted} replicas ready");
    match (&worst, wanted) {
        (_, 0) => conditions.set(READY, false, local::SCALED_TO_ZERO, "spec.replicas is 0"),
        (Some(f), _) => conditions.set(READY, false, &f.reason, format!("{ready_message}; {}", f.message)),
        (None, _) if ready >= wanted => conditions.set(READY, true, reason::AVAILABLE, ready_message),
        (None, _) => conditions.set(READY, false, reason::ROLLING_OUT, ready_message),
    };
    match (report.load_failed(), ready) {
        (Some(f), _) => conditions.set(MODEL_LOADED, false, reason::LOAD_FAILED, f.message.clone()),
        (None, 0) => conditions.set(MODEL_LOADED, false, local::LOADING, "no pod has the model loaded yet"),
        (None, n) => conditions.set(MODEL_LOADED, true, local::LOADED, format!("loaded on {n} ready pods")),
    };
    match &rollout {
        Rollout::InProgress(message) => conditions.set(PROGRESSING, true, reason::ROLLING_OUT, message.clone()),
        Rollout::Stalled(message) => {
            conditions.set(PROGRESSING, false, local::PROGRESS_DEADLINE_EXCEEDED, message.clone())
        }
        Rollout::Complete => conditions.set(
            PROGRESSING,
            false,
            local::ROLLOUT_COMPLETE,
            "every replica runs the latest spec",
        ),
    };
    match (&worst, &rollout) {
        (Some(f), _) => conditions.set(DEGRADED, true, &f.reason, f.message.clone()),
        (None, Rollout::Stalled(message)) => {
            conditions.set(DEGRADED, true, local::PROGRESS_DEADLINE_EXCEEDED, message.clone())
        }
        (None, _) => conditions.set(DEGRADED, false, local::AS_EXPECTED, ""),
    };

    let last_failure = match worst {
        Some(f) => Some(failure(
            previous.last_failure.as_ref(),
            f.reason,
            f.message,
            now.clone(),
        )),
        None => previous.last_failure.clone(),
    };
    let ports = service::ports(model);
    let host = format!(
        "{name}.{}.svc.{cluster_domain}",
        model.namespace().unwrap_or_else(|| "default".into())
    );
    InferenceModelStatus {
        observed_generation: generation,
        replicas,
        ready_replicas: ready,
        selector: labels::selector_string(model),
        conditions: conditions.into_vec(),
        endpoints: Some(Endpoints {
            grpc: format!("{host}:{}", ports.grpc),
            http: format!("http://{host}:{}", ports.http),
        }),
        // Versions need asking the server (its repository index); until the
        // operator does, this keeps whatever was there.
        loaded_versions: previous.loaded_versions,
        last_failure,
        // Filled in by the controller, which has the HPA and the figures.
        autoscaling: None,
    }
}

/// The status of a model whose spec failed validation: nothing was applied,
/// so everything observed before stays, and Ready and Degraded say why.
pub fn invalid_spec_status(model: &InferenceModel, problems: &[String], now: Time) -> InferenceModelStatus {
    let previous = model.status.clone().unwrap_or_default();
    let message = format!("invalid spec: {}", problems.join("; "));
    let mut conditions = Conditions::keeping(&previous.conditions, model.metadata.generation, &now);
    conditions.set(READY, false, reason::INVALID_SPEC, message.clone()).set(
        DEGRADED,
        true,
        reason::INVALID_SPEC,
        message.clone(),
    );
    let conditions = conditions.into_vec();
    InferenceModelStatus {
        observed_generation: model.metadata.generation,
        selector: labels::selector_string(model),
        conditions,
        last_failure: Some(failure(
            previous.last_failure.as_ref(),
            reason::INVALID_SPEC.to_string(),
            message,
            now,
        )),
        ..previous
    }
}

/// Where the rollout of `deployment` (wanting `wanted` replicas) stands.
pub fn rollout(deployment: Option<&Deployment>, wanted: i32) -> Rollout {
    let Some(deployment) = deployment else {
        return Rollout::InProgress("the Deployment does not exist yet".into());
    };
    let status = deployment.status.clone().unwrap_or_default();
    let stalled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_.as_deref() == Some("Progressing") && c.status.as_deref() == Some("False"));
    if let Some(c) = stalled {
        let message = c.message.clone().unwrap_or_default();
        return Rollout::Stalled(message);
    }
    if status.observed_generation < deployment.metadata.generation {
        return Rollout::InProgress("the Deployment controller has not acted on the latest spec yet".into());
    }
    let replicas = status.replicas.unwrap_or(0);
    let updated = status.updated_replicas.unwrap_or(0);
    let available = status.available_replicas.unwrap_or(0);
    if updated < wanted || replicas > updated || available < wanted {
        return Rollout::InProgress(format!(
            "{updated}/{wanted} replicas updated, {available} available, {replicas} in total"
        ));
    }
    Rollout::Complete
}

/// The failure to record: the previous one (and its time) when it is the
/// same failure, else a new one at `now`.
fn failure(previous: Option<&Failure>, reason: String, message: String, now: Time) -> Failure {
    match previous {
        Some(p) if p.reason == reason && p.message == message => p.clone(),
        _ => Failure {
            reason,
            message,
            time: now,
        },
    }
}
