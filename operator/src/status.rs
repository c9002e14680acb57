//! An InferenceModel's status, derived from what the cluster shows.
//!
//! Pure functions: the owned Deployment, the model's pods, whether what
//! its pods need exists (a pvc:// claim; a missing Secret shows on the pods
//! themselves, [`pods`]), the nodes'
//! free GPUs when pods wait for them, and the time go in; an
//! `InferenceModelStatus` comes out. Nothing here hopes: `Ready` is True only when every wanted
//! replica is ready (its readiness probe is the model's own ready endpoint)
//! and no pod shows a problem, so a crash-looping rollout or a failed load
//! never looks ready. Unchanged inputs give an equal status (transition
//! times and failure times are kept), so the controller writes only changes.
//!
//! - [`pods`]: reasons read from the pods (waiting reasons, scheduler messages).
//! - [`conditions`]: setting conditions with Kubernetes' transition-time rules.
//! - [`autoscaling`]: what the model's HPA and the scrapes of its pods say.
//! - [`gpus`]: the free GPUs of the nodes, for an InsufficientGPU message.
//! - [`address`]: where a model is called (its Service, or nereid-gateway).
//! - [`revisions`]: a canary's and the spec's revisions side by side.

pub mod address;
pub mod autoscaling;
pub mod conditions;
pub mod fetch;
pub mod gpus;
pub mod pods;
pub mod revisions;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use nereid_crds::conditions::{DEGRADED, MODEL_LOADED, PROGRESSING, READY, SCALED_TO_ZERO, reason};
use nereid_crds::validate::format_duration;
use nereid_crds::{Address, Failure, InferenceModel, InferenceModelStatus};

use self::conditions::Conditions;
use self::gpus::GpuCapacity;
use self::pods::Finding;
use crate::builders::{deployment, labels, service};
use crate::context::OperatorConfig;

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

/// What the controller saw of a model's world, for [`derive_status`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Observed<'a> {
    /// The model's Deployment, as last applied or read.
    pub deployment: Option<&'a Deployment>,
    /// The model's pods.
    pub pods: &'a [Pod],
    /// Something the pods need that does not exist.
    pub missing: Option<&'a Missing>,
    /// Free GPUs on the cluster's nodes, read while pods wait for GPUs
    /// (absent when not read, or when the operator may not read nodes).
    pub gpus: Option<&'a GpuCapacity>,
}

/// What a model's pods need that the cluster does not have, as the
/// controller finds out before the pods do.
///
/// Secrets are not here: the operator never reads them (not even their
/// metadata), and the kubelet reports a missing one on the pods, which
/// [`pods::diagnose`] turns into `MissingSecret`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Missing {
    /// The PersistentVolumeClaim of a `pvc://` source.
    Claim(String),
}

impl Missing {
    /// The condition reason and message it deserves.
    fn finding(&self, namespace: &str) -> Finding {
        let (reason, message) = match self {
            Missing::Claim(claim) => (
                reason::MISSING_PVC,
                format!(
                    "PersistentVolumeClaim '{claim}' (spec.source.uri pvc://{claim}/...) does not exist in \
                     namespace '{namespace}'"
                ),
            ),
        };
        Finding {
            reason: reason.to_string(),
            message: format!("{message}; the pods cannot start until it does"),
        }
    }
}

/// Whether `pods` of `model` wait for GPUs no node has free, the case in
/// which the controller reads the nodes for [`Observed::gpus`].
pub fn waits_for_gpus(model: &InferenceModel, pods: &[Pod], now: &Time) -> bool {
    let (_, gpu_resource) = deployment::gpus(model);
    pods::diagnose(pods, &model.name_any(), &gpu_resource, now)
        .findings
        .iter()
        .any(|f| f.reason == reason::INSUFFICIENT_GPU)
}

/// The status of `model` given what was `observed` at `now`, with the
/// addresses `config` gives it.
pub fn derive_status(
    model: &InferenceModel,
    observed: &Observed<'_>,
    config: &OperatorConfig,
    now: Time,
) -> InferenceModelStatus {
    let previous = model.status.clone().unwrap_or_default();
    let name = model.name_any();
    let namespace = model.namespace().unwrap_or_else(|| "default".into());
    let generation = model.metadata.generation;
    let deployment = observed.deployment;
    let wanted = deployment
        .and_then(|d| d.spec.replicas)
        .unwrap_or_else(|| deployment::replicas(model));
    let status = deployment.and_then(|d| d.status.as_ref());
    let replicas = status.and_then(|s| s.replicas).unwrap_or(0);
    let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);

    let (_, gpu_resource) = deployment::gpus(model);
    let report = pods::diagnose(observed.pods, &name, &gpu_resource, &now);
    let worst = match observed.missing {
        Some(missing) => Some(missing.finding(&namespace)),
        None => report.worst().map(|mut f| {
            if let (reason::INSUFFICIENT_GPU, Some(gpus)) = (f.reason.as_str(), observed.gpus) {
                f.message = format!("{}; {}", f.message, gpus.describe());
            }
            f
        }),
    };
    let rollout = rollout(deployment, wanted);

    let mut conditions = Conditions::new(&previous.conditions, generation, &now);
    let ready_message = format!("{ready}/{wanted} replicas ready");
    // A model that scales to zero says how long it waits and what wakes it.
    let sleeps_after = model
        .spec
        .autoscaling
        .as_ref()
        .filter(|a| a.scales_to_zero())
        .map(|a| format_duration(a.scale_to_zero_after()));
    let asleep = match &sleeps_after {
        Some(window) => format!(
            "spec.replicas is 0: scaled to zero after {window} without requests; the next request through \
             nereid-gateway wakes it (its Service refuses connections until then)"
        ),
        None => "spec.replicas is 0".to_string(),
    };
    if let Some(window) = &sleeps_after {
        match wanted {
            0 => conditions.set(SCALED_TO_ZERO, true, reason::SCALED_TO_ZERO, asleep.clone()),
            n => conditions.set(
                SCALED_TO_ZERO,
                false,
                reason::AWAKE,
                format!("{n} replicas wanted; scaled to zero after {window} without requests"),
            ),
        };
    }
    match (&worst, wanted) {
        (_, 0) => conditions.set(READY, false, reason::SCALED_TO_ZERO, asleep),
        (Some(f), _) => conditions.set(READY, false, &f.reason, format!("{ready_message}; {}", f.message)),
        (None, _) if ready >= wanted => conditions.set(READY, true, reason::AVAILABLE, ready_message),
        (None, _) => conditions.set(READY, false, reason::ROLLING_OUT, ready_message),
    };
    match (report.load_failed(), ready) {
        (Some(f), _) => conditions.set(MODEL_LOADED, false, reason::LOAD_FAILED, f.message.clone()),
        (None, 0) => conditions.set(MODEL_LOADED, false, reason::LOADING, "no pod has the model loaded yet"),
        (None, n) => conditions.set(MODEL_LOADED, true, reason::LOADED, format!("loaded on {n} ready pods")),
    };
    set_progressing(&mut conditions, &rollout);
    match (&worst, &rollout) {
        (Some(f), _) => conditions.set(DEGRADED, true, &f.reason, f.message.clone()),
        (None, Rollout::Stalled(message)) => {
            conditions.set(DEGRADED, true, reason::PROGRESS_DEADLINE_EXCEEDED, message.clone())
        }
        (None, _) => conditions.set(DEGRADED, false, reason::AS_EXPECTED, "no problem seen"),
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
    let conditions = conditions.into_vec();
    let addresses = address::of_model(&name, &namespace, &service::ports(model), config);
    InferenceModelStatus {
        observed_generation: generation,
        replicas,
        ready_replicas: ready,
        ready: Some(format!("{ready}/{wanted}")),
        reason: not_ready_reason(&conditions),
        url: Some(addresses.url.clone()),
        address: Some(Address { url: addresses.url }),
        selector: labels::selector_string(model),
        conditions,
        endpoints: Some(addresses.service),
        // Versions need asking the server (its repository index); until the
        // operator does, this keeps whatever was there.
        loaded_versions: previous.loaded_versions,
        last_failure,
        // Filled in by the controller, which has the HPA and the figures.
        autoscaling: None,
        revisions: Vec::new(),
    }
}

/// The Ready condition's reason when it is not True: the REASON column.
pub fn not_ready_reason(conditions: &[Condition]) -> Option<String> {
    conditions
        .iter()
        .find(|c| c.type_ == READY && c.status != "True")
        .map(|c| c.reason.clone())
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
        reason: not_ready_reason(&conditions),
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

/// Progressing, as the rollout stands.
pub fn set_progressing(conditions: &mut Conditions<'_>, rollout: &Rollout) {
    match rollout {
        Rollout::InProgress(message) => conditions.set(PROGRESSING, true, reason::ROLLING_OUT, message.clone()),
        Rollout::Stalled(message) => {
            conditions.set(PROGRESSING, false, reason::PROGRESS_DEADLINE_EXCEEDED, message.clone())
        }
        Rollout::Complete => conditions.set(
            PROGRESSING,
            false,
            reason::ROLLOUT_COMPLETE,
            "every replica runs the latest spec",
        ),
    };
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
