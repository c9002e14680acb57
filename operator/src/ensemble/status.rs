//! A ModelEnsemble's status, derived from its spec, its member
//! InferenceModels, and its own Deployment and pods. Pure, like the
//! InferenceModel's ([`crate::status`]), whose pod diagnosis, rollout
//! reading and transition-time rules it shares.
//!
//! `Ready` is True only when the DAG is valid against what the members
//! serve, every member is Ready, and every wanted ensemble pod is ready (its
//! readiness probe is the ensemble model's own ready endpoint, which also
//! needs every member loaded). A member that is deleted or stops being
//! Ready makes `MembersReady` False with the member and its steps named.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use nereid_crds::conditions::{DEGRADED, MEMBERS_READY, PROGRESSING, READY, VALID, reason};
// The ensemble's own reasons (Valid, MembersReady), among everyone's.
use nereid_crds::conditions::reason as reasons;
use nereid_crds::{Address, InferenceModel, ModelEnsemble, ModelEnsembleStatus};

use crate::builders::{deployment, labels, service};
use crate::context::OperatorConfig;
use crate::status::conditions::Conditions;
use crate::status::{Rollout, address, not_ready_reason, pods, rollout, set_progressing};

/// One member InferenceModel: its name, the steps that run it, the object
/// when it exists, and whether its pods told its config.
#[derive(Clone, Debug)]
pub struct Member<'a> {
    pub name: String,
    pub steps: Vec<String>,
    pub model: Option<&'a InferenceModel>,
    pub config_known: bool,
}

/// What the controller saw, for [`derive_status`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Observed<'a> {
    pub members: &'a [Member<'a>],
    /// Problems of the DAG against the members' configs (checked once all
    /// configs are known).
    pub tensor_problems: &'a [String],
    /// An InferenceModel of the ensemble's own name exists.
    pub name_taken: bool,
    pub deployment: Option<&'a Deployment>,
    pub pods: &'a [Pod],
}

/// The distinct member model names of `ensemble`, in step order, with the
/// steps that use each.
pub fn member_names(ensemble: &ModelEnsemble) -> Vec<(String, Vec<String>)> {
    let mut order: Vec<String> = Vec::new();
    let mut steps: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for step in &ensemble.spec.steps {
        if !steps.contains_key(&step.model) {
            order.push(step.model.clone());
        }
        steps.entry(step.model.clone()).or_default().push(step.name.clone());
    }
    order
        .into_iter()
        .map(|name| {
            let used_by = steps.remove(&name).unwrap_or_default();
            (name, used_by)
        })
        .collect()
}

/// Whether `ensemble` has a step that runs the model `name`.
pub fn uses(ensemble: &ModelEnsemble, name: &str) -> bool {
    ensemble.spec.steps.iter().any(|s| s.model == name)
}

/// Whether an InferenceModel is Ready.
pub fn is_ready(model: &InferenceModel) -> bool {
    model
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == READY && c.status == "True"))
}

/// The status of `ensemble` given what was `observed` at `now`.
pub fn derive_status(
    ensemble: &ModelEnsemble,
    observed: &Observed<'_>,
    config: &OperatorConfig,
    now: Time,
) -> ModelEnsembleStatus {
    let previous = ensemble.status.clone().unwrap_or_default();
    let name = ensemble.name_any();
    let namespace = ensemble.namespace().unwrap_or_else(|| "default".into());
    let mut conditions = Conditions::new(&previous.conditions, ensemble.metadata.generation, &now);

    // Valid: the spec, the name, the tensors.
    let invalid = match nereid_crds::validate_ensemble(&ensemble.spec) {
        Err(problems) => Some((reason::INVALID_SPEC, format!("invalid spec: {}", problems.join("; ")))),
        Ok(()) if observed.name_taken => Some((
            reasons::NAME_TAKEN,
            format!(
                "InferenceModel '{name}' exists in namespace '{namespace}': the ensemble's Service and pods \
                 need that name; rename one of them"
            ),
        )),
        Ok(()) if !observed.tensor_problems.is_empty() => {
            Some((reasons::MEMBER_TENSOR_MISMATCH, observed.tensor_problems.join("; ")))
        }
        Ok(()) => None,
    };
    match &invalid {
        None => conditions.set(
            VALID,
            true,
            reasons::VALID_DAG,
            format!("the DAG of {} steps is valid", ensemble.spec.steps.len()),
        ),
        Some((why, message)) => conditions.set(VALID, false, why, message.clone()),
    };

    // MembersReady.
    let members = observed.members;
    let ready_members = members.iter().filter(|m| m.model.is_some_and(is_ready)).count();
    let mut missing = Vec::new();
    let mut not_ready = Vec::new();
    let mut unreachable = Vec::new();
    for m in members {
        let steps = steps_phrase(&m.steps);
        match m.model {
            None => missing.push(format!(
                "InferenceModel '{}' ({steps}) does not exist in namespace '{namespace}'",
                m.name
            )),
            Some(model) if !is_ready(model) => not_ready.push(format!(
                "InferenceModel '{}' ({steps}) is not Ready: {}",
                m.name,
                ready_summary(model)
            )),
            Some(_) if !m.config_known => unreachable.push(format!(
                "InferenceModel '{}' ({steps}) is Ready but no pod of it answered for its config",
                m.name
            )),
            Some(_) => {}
        }
    }
    let members_message = format!("{ready_members}/{} member InferenceModels are Ready", members.len());
    let members_problem = if !missing.is_empty() {
        Some(reasons::MEMBER_MISSING)
    } else if !not_ready.is_empty() {
        Some(reasons::MEMBER_NOT_READY)
    } else if !unreachable.is_empty() {
        Some(reasons::MEMBER_UNREACHABLE)
    } else {
        None
    };
    let members_detail = [missing.as_slice(), &not_ready, &unreachable].concat().join("; ");
    match members_problem {
        None => conditions.set(MEMBERS_READY, true, reasons::ALL_MEMBERS_READY, members_message.clone()),
        Some(why) => conditions.set(
            MEMBERS_READY,
            false,
            why,
            format!("{members_message}; {members_detail}"),
        ),
    };

    // The ensemble's own pods.
    let deployment_status = observed.deployment.and_then(|d| d.status.as_ref());
    let wanted = observed
        .deployment
        .and_then(|d| d.spec.replicas)
        .unwrap_or_else(|| deployment::replicas(ensemble));
    let replicas = deployment_status.and_then(|s| s.replicas).unwrap_or(0);
    let ready = deployment_status.and_then(|s| s.ready_replicas).unwrap_or(0);
    let (_, gpu_resource) = deployment::gpus(ensemble);
    let report = pods::diagnose(observed.pods, &name, &gpu_resource, &now);
    let pod_problem = report.worst();
    let rollout = match observed.deployment {
        Some(d) => rollout(Some(d), wanted),
        None => Rollout::InProgress("waiting for the members before deploying the ensemble pods".into()),
    };

    let ready_message = format!("{ready}/{wanted} replicas ready");
    let (ready_ok, ready_reason, ready_text) = if let Some((why, message)) = &invalid {
        (false, why.to_string(), message.clone())
    } else if let Some(why) = members_problem {
        (false, why.to_string(), format!("{members_message}; {members_detail}"))
    } else if let Some(f) = &pod_problem {
        (false, f.reason.clone(), format!("{ready_message}; {}", f.message))
    } else if wanted == 0 {
        (
            false,
            reason::SCALED_TO_ZERO.to_string(),
            "spec.replicas is 0".to_string(),
        )
    } else if observed.deployment.is_some() && ready >= wanted {
        (true, reason::AVAILABLE.to_string(), ready_message)
    } else {
        (false, reason::ROLLING_OUT.to_string(), ready_message)
    };
    conditions.set(READY, ready_ok, &ready_reason, ready_text);
    match &rollout {
        Rollout::InProgress(message) if observed.deployment.is_none() => {
            conditions.set(PROGRESSING, true, reasons::WAITING_FOR_MEMBERS, message.clone());
        }
        _ => set_progressing(&mut conditions, &rollout),
    }
    let degraded = match (&invalid, members_problem, &pod_problem, &rollout) {
        (Some((why, message)), ..) => Some((why.to_string(), message.clone())),
        (None, Some(reasons::MEMBER_MISSING), ..) => Some((reasons::MEMBER_MISSING.to_string(), missing.join("; "))),
        (None, _, Some(f), _) => Some((f.reason.clone(), f.message.clone())),
        (None, _, None, Rollout::Stalled(message)) => {
            Some((reason::PROGRESS_DEADLINE_EXCEEDED.to_string(), message.clone()))
        }
        _ => None,
    };
    match degraded {
        Some((why, message)) => conditions.set(DEGRADED, true, &why, message),
        None => conditions.set(DEGRADED, false, reason::AS_EXPECTED, "no problem seen"),
    };

    let conditions = conditions.into_vec();
    let addresses = address::of_model(&name, &namespace, &service::ports(ensemble), config);
    ModelEnsembleStatus {
        observed_generation: ensemble.metadata.generation,
        replicas,
        ready_replicas: ready,
        ready: Some(format!("{ready}/{wanted}")),
        members: Some(format!("{ready_members}/{}", members.len())),
        reason: not_ready_reason(&conditions),
        url: Some(addresses.url.clone()),
        address: Some(Address { url: addresses.url }),
        selector: labels::selector_string(ensemble),
        conditions,
        endpoints: Some(addresses.service),
        // Filled in by the controller, which has the HPA and the figures.
        autoscaling: None,
    }
}

/// "RollingOut (0/1 replicas ready)", from the member's Ready condition.
fn ready_summary(model: &InferenceModel) -> String {
    let ready = model
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == READY));
    match ready {
        Some(c) if c.message.is_empty() => c.reason.clone(),
        Some(c) => format!("{} ({})", c.reason, c.message),
        None => "it has no status yet".to_string(),
    }
}

fn steps_phrase(steps: &[String]) -> String {
    let quoted: Vec<String> = steps.iter().map(|s| format!("'{s}'")).collect();
    match quoted.len() {
        1 => format!("step {}", quoted[0]),
        _ => format!("steps {}", quoted.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::apps::v1::{DeploymentSpec, DeploymentStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::jiff::Timestamp;
    use nereid_crds::{EnsembleStep, EnsembleTensor, InferenceModelSpec, InferenceModelStatus, ModelEnsembleSpec};

    use super::*;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(1_800_000_000 + seconds).unwrap())
    }

    fn tensor(name: &str) -> EnsembleTensor {
        EnsembleTensor {
            name: name.into(),
            datatype: "FP32".into(),
            dims: vec![4],
        }
    }

    fn step(name: &str, model: &str, input: &str, output: &str) -> EnsembleStep {
        EnsembleStep {
            name: name.into(),
            model: model.into(),
            model_version: None,
            input_map: BTreeMap::from([("IN".to_string(), input.to_string())]),
            output_map: BTreeMap::from([("OUT".to_string(), output.to_string())]),
        }
    }

    fn ensemble(steps: Vec<EnsembleStep>) -> ModelEnsemble {
        let mut e = ModelEnsemble::new(
            "pipeline",
            ModelEnsembleSpec {
                steps,
                inputs: vec![tensor("X")],
                outputs: vec![tensor("Y")],
                ..ModelEnsembleSpec::default()
            },
        );
        e.metadata.namespace = Some("ml".into());
        e.metadata.generation = Some(2);
        e
    }

    fn pipeline() -> ModelEnsemble {
        ensemble(vec![
            step("pre", "scale", "X", "mid"),
            step("main", "mlp", "mid", "mid2"),
            step("post", "scale", "mid2", "Y"),
        ])
    }

    fn model(name: &str, ready: bool) -> InferenceModel {
        let mut m = InferenceModel::new(name, InferenceModelSpec::default());
        m.status = Some(InferenceModelStatus {
            conditions: vec![Condition {
                type_: READY.into(),
                status: if ready { "True" } else { "False" }.into(),
                reason: if ready { "Available" } else { "RollingOut" }.into(),
                message: if ready {
                    "1/1 replicas ready"
                } else {
                    "0/1 replicas ready"
                }
                .into(),
                observed_generation: Some(1),
                last_transition_time: at(0),
            }],
            ..InferenceModelStatus::default()
        });
        m
    }

    fn members<'a>(e: &ModelEnsemble, models: &'a [InferenceModel]) -> Vec<Member<'a>> {
        member_names(e)
            .into_iter()
            .map(|(name, steps)| {
                let model = models.iter().find(|m| m.name_any() == name);
                Member {
                    config_known: model.is_some_and(is_ready),
                    model,
                    name,
                    steps,
                }
            })
            .collect()
    }

    fn deployment(wanted: i32, ready: i32) -> Deployment {
        Deployment {
            spec: DeploymentSpec {
                replicas: Some(wanted),
                ..DeploymentSpec::default()
            },
            status: Some(DeploymentStatus {
                replicas: Some(wanted),
                ready_replicas: Some(ready),
                updated_replicas: Some(wanted),
                available_replicas: Some(ready),
                ..DeploymentStatus::default()
            }),
            ..Deployment::default()
        }
    }

    fn state(s: &ModelEnsembleStatus, type_: &str) -> (String, String, String) {
        let c = s.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    fn derive(e: &ModelEnsemble, observed: &Observed<'_>) -> ModelEnsembleStatus {
        derive_status(e, observed, &OperatorConfig::default(), at(10))
    }

    #[test]
    fn members_are_counted_once_with_the_steps_that_use_them() {
        let names = member_names(&pipeline());
        assert_eq!(
            names,
            [
                ("scale".to_string(), vec!["pre".to_string(), "post".to_string()]),
                ("mlp".to_string(), vec!["main".to_string()]),
            ]
        );
        assert!(uses(&pipeline(), "mlp") && !uses(&pipeline(), "other"));
    }

    #[test]
    fn ready_members_and_ready_pods_make_a_ready_ensemble() {
        let e = pipeline();
        let models = [model("scale", true), model("mlp", true)];
        let members = members(&e, &models);
        let d = deployment(1, 1);
        let s = derive(
            &e,
            &Observed {
                members: &members,
                deployment: Some(&d),
                ..Observed::default()
            },
        );
        assert_eq!(state(&s, VALID).0, "True");
        assert_eq!(
            state(&s, MEMBERS_READY),
            (
                "True".into(),
                reasons::ALL_MEMBERS_READY.into(),
                "2/2 member InferenceModels are Ready".into()
            )
        );
        assert_eq!(state(&s, READY).0, "True", "{:?}", state(&s, READY));
        assert_eq!(state(&s, DEGRADED).0, "False");
        assert_eq!(s.members.as_deref(), Some("2/2"));
        assert_eq!(s.ready.as_deref(), Some("1/1"));
        assert_eq!(s.reason, None);
        assert_eq!(
            s.url.as_deref(),
            Some("http://pipeline.ml.svc.cluster.local:8000/v2/models/pipeline/infer")
        );
        assert_eq!(
            s.selector,
            "app.kubernetes.io/name=nereid-server,serving.nereid.dev/model=pipeline"
        );
    }

    #[test]
    fn nothing_is_deployed_while_members_are_not_ready() {
        let e = pipeline();
        let models = [model("scale", true), model("mlp", false)];
        let members = members(&e, &models);
        let s = derive(
            &e,
            &Observed {
                members: &members,
                ..Observed::default()
            },
        );
        assert_eq!(state(&s, READY).1, reasons::MEMBER_NOT_READY);
        assert_eq!(state(&s, PROGRESSING).1, reasons::WAITING_FOR_MEMBERS);
        assert_eq!(state(&s, DEGRADED).0, "False", "a member rolling out is no problem");
        assert_eq!(s.ready.as_deref(), Some("0/1"));
    }

    #[test]
    fn a_missing_member_is_named_with_its_steps() {
        let e = pipeline();
        let models = [model("mlp", true)];
        let members = members(&e, &models);
        let d = deployment(1, 1);
        let s = derive(
            &e,
            &Observed {
                members: &members,
                deployment: Some(&d),
                ..Observed::default()
            },
        );
        let (status, reason, message) = state(&s, MEMBERS_READY);
        assert_eq!((status.as_str(), reason.as_str()), ("False", reasons::MEMBER_MISSING));
        assert_eq!(
            message,
            "1/2 member InferenceModels are Ready; InferenceModel 'scale' (steps 'pre', 'post') does not \
             exist in namespace 'ml'"
        );
        assert_eq!(
            state(&s, READY).1,
            reasons::MEMBER_MISSING,
            "the pods may run, the ensemble cannot answer"
        );
        assert_eq!(state(&s, DEGRADED).1, reasons::MEMBER_MISSING);
        assert_eq!(s.reason.as_deref(), Some(reasons::MEMBER_MISSING));
    }

    #[test]
    fn an_invalid_dag_a_taken_name_and_mismatched_tensors_are_the_reason() {
        let bad = ensemble(vec![step("a", "m", "X", "t"), step("b", "m", "missing", "Y")]);
        let models = [model("m", true)];
        let bad_members = members(&bad, &models);
        let s = derive(
            &bad,
            &Observed {
                members: &bad_members,
                ..Observed::default()
            },
        );
        let (status, reason, message) = state(&s, VALID);
        assert_eq!((status.as_str(), reason.as_str()), ("False", reason::INVALID_SPEC));
        assert!(message.contains("step \"b\" reads tensor \"missing\""), "{message}");
        assert_eq!(s.reason.as_deref(), Some(reason::INVALID_SPEC));

        let e = pipeline();
        let models = [model("scale", true), model("mlp", true)];
        let members = members(&e, &models);
        let taken = derive(
            &e,
            &Observed {
                members: &members,
                name_taken: true,
                ..Observed::default()
            },
        );
        assert_eq!(state(&taken, VALID).1, reasons::NAME_TAKEN);
        let problems =
            ["step 'main' (InferenceModel 'mlp') maps input 'IN', which the model does not have".to_string()];
        let mismatch = derive(
            &e,
            &Observed {
                members: &members,
                tensor_problems: &problems,
                ..Observed::default()
            },
        );
        assert_eq!(state(&mismatch, VALID).1, reasons::MEMBER_TENSOR_MISMATCH);
        assert_eq!(state(&mismatch, DEGRADED).2, problems[0]);
    }

    #[test]
    fn an_unchanged_world_gives_an_equal_status() {
        let mut e = pipeline();
        let models = [model("scale", true), model("mlp", true)];
        let members = members(&e, &models);
        let d = deployment(1, 1);
        let observed = Observed {
            members: &members,
            deployment: Some(&d),
            ..Observed::default()
        };
        let first = derive(&e, &observed);
        e.status = Some(first.clone());
        assert_eq!(derive_status(&e, &observed, &OperatorConfig::default(), at(20)), first);
    }
}
