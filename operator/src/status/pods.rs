//! What is wrong with a model's pods, read from the pods themselves.
//!
//! The kubelet and the scheduler already say why a pod does not serve: a
//! waiting reason on a container, a termination message, a `PodScheduled`
//! condition with the scheduler's message. This module turns those into
//! the reasons of `nereid_crds::conditions::reason`, worst first, so the
//! status can say *why* instead of only *not ready*.
//!
//! A missing Secret is read here too: the kubelet cannot create a container
//! whose environment names a Secret that does not exist, and says so in the
//! container's waiting message. The operator itself never reads Secrets.

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::SignedDuration;
use nereid_crds::conditions::reason;
use nereid_proto::contract::exit;

use crate::builders::deployment::{FETCH_CONTAINER, GPU_TAINT, SERVER_CONTAINER, WRITE_CONTAINER};

/// How long a started server may stay not-ready before that counts as a
/// failed load: the readiness probe's period × failure threshold, and slack.
pub const LOAD_GRACE: SignedDuration = SignedDuration::from_secs(30);
/// Longest message kept from a pod (termination messages can hold log lines).
const MAX_MESSAGE: usize = 1024;

/// One problem seen on one pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Finding {
    /// A condition reason (`ImagePullBackOff`, `LoadFailed`, ... or the
    /// kubelet's own CamelCase reason for rarer container errors).
    pub reason: String,
    /// What the pod, the kubelet or the scheduler said, prefixed with the pod's name.
    pub message: String,
}

/// What the pods of one model tell.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodReport {
    /// The worst problem of each failing pod, worst pod first.
    pub findings: Vec<Finding>,
}

impl PodReport {
    /// The worst problem, with a count of the other pods that share its reason.
    pub fn worst(&self) -> Option<Finding> {
        let first = self.findings.first()?;
        let same = self.findings.iter().filter(|f| f.reason == first.reason).count();
        let mut worst = first.clone();
        if same > 1 {
            worst.message = format!("{} (and {} more pods)", worst.message, same - 1);
        }
        Some(worst)
    }

    /// Whether any pod failed to load the model.
    pub fn load_failed(&self) -> Option<&Finding> {
        self.findings.iter().find(|f| f.reason == reason::LOAD_FAILED)
    }
}

/// Reads `pods` (of the model named `model`, whose GPUs are `gpu_resource`) at `now`.
pub fn diagnose(pods: &[Pod], model: &str, gpu_resource: &str, now: &Time) -> PodReport {
    let mut findings: Vec<Finding> = pods
        .iter()
        .filter(|pod| counts(pod))
        .filter_map(|pod| diagnose_pod(pod, model, gpu_resource, now))
        .collect();
    // Stable: pods with equally bad problems keep the API server's order.
    findings.sort_by_key(|f| severity(&f.reason));
    PodReport { findings }
}

/// Terminating and finished pods no longer say anything about the model.
fn counts(pod: &Pod) -> bool {
    let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
    pod.metadata.deletion_timestamp.is_none() && !matches!(phase, Some("Succeeded" | "Failed"))
}

/// Lower is worse: what blocks the most, or what needs a human first.
fn severity(reason: &str) -> u8 {
    match reason {
        reason::INSUFFICIENT_GPU => 0,
        reason::UNSCHEDULABLE => 1,
        reason::MISSING_SECRET => 2,
        reason::IMAGE_PULL_BACK_OFF => 3,
        reason::CRASH_LOOP_BACK_OFF => 4,
        reason::LOAD_FAILED => 5,
        _ => 6,
    }
}

fn diagnose_pod(pod: &Pod, model: &str, gpu_resource: &str, now: &Time) -> Option<Finding> {
    let name = pod.metadata.name.as_deref().unwrap_or("<unnamed pod>");
    let status = pod.status.as_ref()?;
    let found = |reason: &str, message: String| {
        Some(Finding {
            reason: reason.to_string(),
            message: truncate(format!("pod {name}: {message}")),
        })
    };

    let unschedulable = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False" && c.reason.as_deref() == Some("Unschedulable"));
    if let Some(condition) = unschedulable {
        let message = condition.message.clone().unwrap_or_default();
        let no_gpu = [gpu_resource, GPU_TAINT]
            .iter()
            .any(|resource| message.contains(&format!("Insufficient {resource}")));
        let reason = if no_gpu {
            reason::INSUFFICIENT_GPU
        } else {
            reason::UNSCHEDULABLE
        };
        return found(reason, message);
    }

    let mut worst: Option<Finding> = None;
    let mut keep = |finding: Option<Finding>| {
        if let Some(f) = finding
            && worst.as_ref().is_none_or(|w| severity(&f.reason) < severity(&w.reason))
        {
            worst = Some(f);
        }
    };
    for container in status.init_container_statuses.iter().flatten() {
        keep(init_container(container).and_then(|(r, m)| found(&r, m)));
    }
    for container in status.container_statuses.iter().flatten() {
        if container.name == SERVER_CONTAINER {
            if let Some(message) = exited_on_load_failure(container) {
                keep(found(reason::LOAD_FAILED, message));
                continue;
            }
            keep(not_loaded(container, model, now).and_then(|(r, m)| found(&r, m)));
        }
        keep(container_problem(container).and_then(|(r, m)| found(&r, m)));
    }
    worst
}

/// The init containers fetch the models (and write an ensemble's configs):
/// when one fails, the model cannot load.
fn init_container(container: &ContainerStatus) -> Option<(String, String)> {
    let (reason, message) = container_problem(container)?;
    let fills_models = container.name == WRITE_CONTAINER || container.name.starts_with(FETCH_CONTAINER);
    // A container that could not start has not tried to fetch anything.
    let started = reason != reason::IMAGE_PULL_BACK_OFF && reason != reason::MISSING_SECRET;
    if fills_models && started {
        return Some((
            reason::LOAD_FAILED.to_string(),
            format!("fetching the model failed: {message}"),
        ));
    }
    Some((reason, message))
}

/// A container's waiting reason, mapped to ours; crashes carry the last
/// termination's message (the server's last log lines) and exit code.
fn container_problem(container: &ContainerStatus) -> Option<(String, String)> {
    let state = container.state.as_ref()?;
    let waiting = state.waiting.as_ref()?;
    let kubelet_reason = waiting.reason.as_deref()?;
    let waiting_message = waiting.message.clone().unwrap_or_default();
    let name = &container.name;
    match kubelet_reason {
        "ImagePullBackOff" | "ErrImagePull" | "InvalidImageName" | "ErrImageNeverPull" => Some((
            reason::IMAGE_PULL_BACK_OFF.to_string(),
            format!("container {name}: {kubelet_reason}: {waiting_message}"),
        )),
        "CrashLoopBackOff" => {
            let last = container.last_state.as_ref().and_then(|s| s.terminated.as_ref());
            let detail = match last {
                Some(t) => {
                    let said = t.message.as_deref().map(str::trim).unwrap_or_default();
                    let why = t.reason.as_deref().unwrap_or("Error");
                    format!("exited with code {} ({why}): {said}", t.exit_code)
                }
                None => waiting_message,
            };
            Some((
                reason::CRASH_LOOP_BACK_OFF.to_string(),
                format!(
                    "container {name} keeps crashing: {}",
                    detail.trim_end_matches([' ', ':'])
                ),
            ))
        }
        // Starting normally.
        "ContainerCreating" | "PodInitializing" => None,
        "CreateContainerConfigError" if missing_secret(&waiting_message).is_some() => {
            let secret = missing_secret(&waiting_message).unwrap_or_default();
            Some((
                reason::MISSING_SECRET.to_string(),
                format!(
                    "container {name}: Secret '{secret}' does not exist in the model's namespace; \
                     the pods cannot start until it does"
                ),
            ))
        }
        // CreateContainerConfigError (e.g. a missing Secret key), RunContainerError, ...
        other => Some((other.to_string(), format!("container {name}: {waiting_message}"))),
    }
}

/// The Secret a kubelet's CreateContainerConfigError message says does not
/// exist: `secret "name" not found` (the kubelet's watching Secret manager)
/// or `secrets "name" not found` (the API server's own words).
fn missing_secret(message: &str) -> Option<&str> {
    let message = message.trim();
    let quoted = message
        .strip_prefix("secrets \"")
        .or_else(|| message.strip_prefix("secret \""))?;
    let (name, rest) = quoted.split_once('"')?;
    (!name.is_empty() && rest.trim() == "not found").then_some(name)
}

/// A server that stopped itself because the model did not load
/// (`--exit-on-error`, told by its exit status): its termination message,
/// the end of its log, is the server's own reason. It restarts and fails
/// again (a crash loop), but the loop is only the symptom.
fn exited_on_load_failure(container: &ContainerStatus) -> Option<String> {
    let state = container.state.as_ref()?;
    let terminated = state
        .terminated
        .as_ref()
        .or_else(|| container.last_state.as_ref()?.terminated.as_ref())
        .filter(|t| t.exit_code == i32::from(exit::LOAD_FAILED))?;
    // A server that came back and runs is not failing now.
    if state.running.is_some() {
        return None;
    }
    let said = terminated.message.as_deref().map(str::trim).unwrap_or_default();
    // The server's log ends with "Error: <reason>"; the lines before are its log.
    let reason = match said.rfind("Error: ") {
        Some(at) => &said[at + "Error: ".len()..],
        None => said.lines().last().unwrap_or_default(),
    };
    Some(format!(
        "the server could not load the model (restarted {} times): {}",
        container.restart_count,
        reason.trim()
    ))
}

/// A server that started (its startup probe passed) but whose readiness
/// probe on the model's own endpoint keeps failing did not load the model.
fn not_loaded(container: &ContainerStatus, model: &str, now: &Time) -> Option<(String, String)> {
    let running = container.state.as_ref()?.running.as_ref()?;
    if container.ready || container.started != Some(true) {
        return None;
    }
    let since = running.started_at.as_ref()?;
    if now.0.duration_since(since.0) < LOAD_GRACE {
        return None;
    }
    Some((
        reason::LOAD_FAILED.to_string(),
        format!(
            "the server is up but model '{model}' is not ready (GET /v2/models/{model}/ready fails); \
             the server's log or POST /v2/repository/index says why"
        ),
    ))
}

fn truncate(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message
}
