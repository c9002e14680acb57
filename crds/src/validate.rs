//! Rust-side validation of the specs: the CEL rules of [`crate::rules`] and
//! the schema bounds again, for clusters that do not enforce CEL and for
//! friendly status messages, plus the DAG checks of ensembles that CEL
//! cannot express (in `validate/ensemble.rs`).
//!
//! Every function collects all problems rather than stopping at the first,
//! so a user fixes a spec in one round.

mod duration;
mod ensemble;
mod quantity;

pub use duration::{format_duration, parse_duration};
pub use ensemble::{ensemble_dag, validate_ensemble};
pub use quantity::parse_quantity;

use crate::rules::{self, Check};
use crate::{Autoscaling, Canary, InferenceModelSpec, InstanceKind, ModelConfigOverride, ServerPorts, VersionPolicy};

/// Checks an InferenceModel spec; returns every problem found.
pub fn validate(spec: &InferenceModelSpec) -> Result<(), Vec<String>> {
    let mut errors = Errors::default();
    errors.check(spec.replicas.is_none_or(|r| r >= 0), rules::REPLICAS);
    check_uri(&mut errors, &spec.source.uri);
    if let Some(version) = &spec.source.version {
        check_version(&mut errors, version);
    }
    if let Some(config) = &spec.config {
        check_config(&mut errors, config);
    }
    if let Some(ports) = spec.server.as_ref().and_then(|s| s.ports.as_ref()) {
        check_ports(&mut errors, ports);
    }
    if let Some(autoscaling) = &spec.autoscaling {
        check_autoscaling(&mut errors, autoscaling);
    }
    if let Some(canary) = &spec.canary {
        check_canary(&mut errors, canary);
    }
    let asleep = spec.autoscaling.as_ref().is_some_and(Autoscaling::scales_to_zero);
    errors.check(!(asleep && spec.canary.is_some()), rules::CANARY_NOT_ASLEEP);
    let wants_gpu = spec
        .config
        .as_ref()
        .and_then(|c| c.instance_group.as_ref())
        .is_some_and(|groups| groups.iter().any(|g| g.kind == Some(InstanceKind::Gpu)));
    let has_gpu = spec.resources.as_ref().and_then(|r| r.gpu).is_some_and(|n| n >= 1);
    errors.check(!wants_gpu || has_gpu, rules::GPU_KIND_NEEDS_GPU);
    errors.into_result()
}

/// The canary's own fields; its source and config by the spec's rules, the
/// messages naming the canary's fields.
fn check_canary(errors: &mut Errors, canary: &Canary) {
    let percent = canary.traffic_percent;
    if !(0..=100).contains(&percent) {
        errors.push(format!(
            "spec.canary.trafficPercent must be between 0 and 100 (got {percent})"
        ));
    }
    if let Some(replicas) = canary.replicas.filter(|r| !(0..=MAX_CANARY_REPLICAS).contains(r)) {
        errors.push(format!(
            "spec.canary.replicas must be between 0 and {MAX_CANARY_REPLICAS} (got {replicas})"
        ));
    }
    let mut own = Errors::default();
    if let Some(source) = &canary.source {
        check_uri(&mut own, &source.uri);
        if let Some(version) = &source.version {
            check_version(&mut own, version);
        }
    }
    if let Some(config) = &canary.config {
        check_config(&mut own, config);
    }
    for message in own.0 {
        errors.push(message.replace("spec.", "spec.canary."));
    }
}

/// The schema's bound on `spec.canary.replicas`.
const MAX_CANARY_REPLICAS: i32 = 1000;

/// The problems found so far.
#[derive(Default)]
struct Errors(Vec<String>);

impl Errors {
    /// Records the check's message unless `ok`.
    fn check(&mut self, ok: bool, check: Check) {
        if !ok {
            self.push(check.message);
        }
    }

    fn push(&mut self, message: impl Into<String>) {
        self.0.push(message.into());
    }

    fn into_result(self) -> Result<(), Vec<String>> {
        if self.0.is_empty() { Ok(()) } else { Err(self.0) }
    }
}

/// Longest `spec.source.uri` the schema accepts.
const MAX_URI_LEN: usize = 2048;

fn check_uri(errors: &mut Errors, uri: &str) {
    if uri.len() > MAX_URI_LEN {
        errors.push(format!("spec.source.uri must be at most {MAX_URI_LEN} characters"));
    }
    // Same as the CEL regex: a known scheme and a non-empty first segment.
    let ok = rules::URI_SCHEMES.iter().any(|scheme| {
        uri.strip_prefix(scheme)
            .is_some_and(|rest| !rest.is_empty() && !rest.starts_with('/'))
    });
    if !ok {
        errors.push(format!("{} (got {uri:?})", rules::URI_SCHEME.message));
    }
}

fn check_version(errors: &mut Errors, version: &VersionPolicy) {
    let set = [
        version.latest.is_some(),
        version.all.is_some(),
        version.specific.is_some(),
    ];
    errors.check(set.iter().filter(|&&s| s).count() <= 1, rules::VERSION_ONE_OF);
    if version.latest == Some(0) {
        errors.push("spec.source.version.latest must be >= 1");
    }
}

fn check_config(errors: &mut Errors, config: &ModelConfigOverride) {
    if config.max_batch_size.is_some_and(|b| b < 0) {
        errors.push("spec.config.maxBatchSize must be >= 0");
    }
    if let Some(groups) = config
        .instance_group
        .as_ref()
        .filter(|g| g.len() > rules::MAX_INSTANCE_GROUPS)
    {
        errors.push(format!(
            "spec.config.instanceGroup lists {} groups; at most {} are allowed",
            groups.len(),
            rules::MAX_INSTANCE_GROUPS
        ));
    }
}

fn check_ports(errors: &mut Errors, ports: &ServerPorts) {
    let named = [("http", ports.http), ("grpc", ports.grpc), ("metrics", ports.metrics)];
    for (name, port) in named {
        if let Some(port) = port.filter(|p| !(1..=65535).contains(p)) {
            errors.push(format!(
                "spec.server.ports.{name} must be between 1 and 65535 (got {port})"
            ));
        }
    }
}

/// The autoscaling rules, shared by InferenceModel and ModelEnsemble.
fn check_autoscaling(errors: &mut Errors, autoscaling: &Autoscaling) {
    let Autoscaling {
        min_replicas,
        max_replicas,
        target,
        scale_to_zero_after,
        activation_timeout,
        ..
    } = autoscaling;
    errors.check(min_replicas.is_none_or(|m| m >= 0), rules::MIN_REPLICAS);
    errors.check(*max_replicas >= 1, rules::MAX_REPLICAS);
    errors.check(min_replicas.is_none_or(|m| m <= *max_replicas), rules::MIN_LE_MAX);
    if !parse_quantity(target).is_some_and(|v| v > 0.0) {
        errors.push(format!("{} (got {target:?})", rules::TARGET_QUANTITY.message));
    }
    let second = std::time::Duration::from_secs(1);
    if let Some(after) = scale_to_zero_after
        && parse_duration(after).is_none_or(|d| d < second)
    {
        errors.push(format!("{} (got {after:?})", rules::SCALE_TO_ZERO_AFTER.message));
    }
    if let Some(timeout) = activation_timeout
        && !parse_duration(timeout).is_some_and(|d| (second..=crate::MAX_ACTIVATION_TIMEOUT).contains(&d))
    {
        errors.push(format!("{} (got {timeout:?})", rules::ACTIVATION_TIMEOUT.message));
    }
    errors.check(
        (scale_to_zero_after.is_none() && activation_timeout.is_none()) || autoscaling.scales_to_zero(),
        rules::ZERO_ONLY_FIELDS,
    );
}

#[cfg(test)]
mod tests;
