//! A ModelEnsemble's status, derived from its spec and its member
//! InferenceModels as the API server holds them. Pure, like the
//! InferenceModel's ([`crate::status`]), with the same transition-time rules.
//!
//! The operator does not serve ensembles yet: it validates the DAG and
//! follows the members, and `Ready` says plainly that no ensemble pod runs
//! (reason `NotServed`, with Degraded True so that the Event and alerting
//! see it), so an applied ModelEnsemble never looks accepted for serving.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt;
use nereid_crds::conditions::{DEGRADED, MEMBERS_READY, READY, VALID, reason};
use nereid_crds::{InferenceModel, ModelEnsemble, ModelEnsembleStatus};

use crate::status::conditions::Conditions;
use crate::status::not_ready_reason;

/// Reasons of the ensemble's conditions.
pub mod reasons {
    /// Valid True.
    pub const VALID_DAG: &str = "ValidDAG";
    /// MembersReady True.
    pub const ALL_MEMBERS_READY: &str = "AllMembersReady";
    /// MembersReady False: a step names an InferenceModel that does not exist.
    pub const MEMBER_MISSING: &str = "MemberMissing";
    /// MembersReady False: a member exists but is not Ready.
    pub const MEMBER_NOT_READY: &str = "MemberNotReady";
    /// Ready False, Degraded True: this operator runs no ensemble pods yet.
    pub const NOT_SERVED: &str = "NotServed";
}

/// One member InferenceModel: its name, the steps that run it, and the
/// object when it exists.
#[derive(Clone, Debug)]
pub struct Member<'a> {
    pub name: String,
    pub steps: Vec<String>,
    pub model: Option<&'a InferenceModel>,
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

/// The status of `ensemble` given its `members` at `now`.
pub fn derive_status(ensemble: &ModelEnsemble, members: &[Member<'_>], now: Time) -> ModelEnsembleStatus {
    let previous = ensemble.status.clone().unwrap_or_default();
    let namespace = ensemble.namespace().unwrap_or_else(|| "default".into());
    let mut conditions = Conditions::new(&previous.conditions, ensemble.metadata.generation, &now);

    let problems = nereid_crds::validate_ensemble(&ensemble.spec).err();
    match &problems {
        None => conditions.set(
            VALID,
            true,
            reasons::VALID_DAG,
            format!("the DAG of {} steps is valid", ensemble.spec.steps.len()),
        ),
        Some(problems) => conditions.set(
            VALID,
            false,
            reason::INVALID_SPEC,
            format!("invalid spec: {}", problems.join("; ")),
        ),
    };

    let ready_members = members.iter().filter(|m| m.model.is_some_and(is_ready)).count();
    let missing: Vec<String> = members
        .iter()
        .filter(|m| m.model.is_none())
        .map(|m| {
            format!(
                "InferenceModel '{}' ({}) does not exist in namespace '{namespace}'",
                m.name,
                steps_phrase(&m.steps)
            )
        })
        .collect();
    let not_ready: Vec<String> = members
        .iter()
        .filter_map(|m| Some((m, m.model?)))
        .filter(|(_, model)| !is_ready(model))
        .map(|(m, model)| {
            format!(
                "InferenceModel '{}' ({}) is not Ready: {}",
                m.name,
                steps_phrase(&m.steps),
                ready_summary(model)
            )
        })
        .collect();
    let members_message = format!("{ready_members}/{} member InferenceModels are Ready", members.len());
    let members_reason = match (missing.is_empty(), not_ready.is_empty()) {
        (true, true) => {
            conditions.set(MEMBERS_READY, true, reasons::ALL_MEMBERS_READY, members_message.clone());
            None
        }
        (false, _) => Some(reasons::MEMBER_MISSING),
        (true, false) => Some(reasons::MEMBER_NOT_READY),
    };
    if let Some(members_reason) = members_reason {
        let detail = missing.iter().chain(&not_ready).cloned().collect::<Vec<_>>().join("; ");
        conditions.set(
            MEMBERS_READY,
            false,
            members_reason,
            format!("{members_message}; {detail}"),
        );
    }

    let (ready_reason, ready_message) = match &problems {
        Some(problems) => (reason::INVALID_SPEC, format!("invalid spec: {}", problems.join("; "))),
        None => (
            reasons::NOT_SERVED,
            "this version of the operator validates ModelEnsembles and follows their members but \
             does not serve them: no ensemble pod runs and nothing answers for the ensemble's name"
                .to_string(),
        ),
    };
    conditions.set(READY, false, ready_reason, ready_message.clone());
    let degraded = match (&problems, members_reason) {
        (None, Some(reasons::MEMBER_MISSING)) => (reasons::MEMBER_MISSING, missing.join("; ")),
        _ => (ready_reason, ready_message),
    };
    conditions.set(DEGRADED, true, degraded.0, degraded.1);

    let conditions = conditions.into_vec();
    let wanted = ensemble.spec.replicas.unwrap_or(1);
    ModelEnsembleStatus {
        observed_generation: ensemble.metadata.generation,
        replicas: 0,
        ready_replicas: 0,
        ready: Some(format!("0/{wanted}")),
        members: Some(format!("{ready_members}/{}", members.len())),
        reason: not_ready_reason(&conditions),
        url: None,
        address: None,
        selector: previous.selector,
        conditions,
    }
}

fn is_ready(model: &InferenceModel) -> bool {
    model
        .status
        .as_ref()
        .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == READY && c.status == "True"))
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
            .map(|(name, steps)| Member {
                model: models.iter().find(|m| m.name_any() == name),
                name,
                steps,
            })
            .collect()
    }

    fn state(s: &ModelEnsembleStatus, type_: &str) -> (String, String, String) {
        let c = s.conditions.iter().find(|c| c.type_ == type_).unwrap();
        (c.status.clone(), c.reason.clone(), c.message.clone())
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
    fn a_valid_ensemble_with_ready_members_still_says_it_is_not_served() {
        let e = pipeline();
        let models = [model("scale", true), model("mlp", true)];
        let s = derive_status(&e, &members(&e, &models), at(10));
        assert_eq!(state(&s, VALID).0, "True");
        assert_eq!(
            state(&s, MEMBERS_READY),
            (
                "True".into(),
                reasons::ALL_MEMBERS_READY.into(),
                "2/2 member InferenceModels are Ready".into()
            )
        );
        assert_eq!(state(&s, READY).1, reasons::NOT_SERVED);
        assert_eq!(state(&s, DEGRADED).1, reasons::NOT_SERVED);
        assert_eq!(s.members.as_deref(), Some("2/2"));
        assert_eq!(s.ready.as_deref(), Some("0/1"));
        assert_eq!(s.reason.as_deref(), Some(reasons::NOT_SERVED));
        assert_eq!(s.observed_generation, Some(2));
    }

    #[test]
    fn a_missing_member_is_named_with_its_steps() {
        let e = pipeline();
        let models = [model("mlp", false)];
        let s = derive_status(&e, &members(&e, &models), at(10));
        let (status, reason, message) = state(&s, MEMBERS_READY);
        assert_eq!((status.as_str(), reason.as_str()), ("False", reasons::MEMBER_MISSING));
        assert_eq!(
            message,
            "0/2 member InferenceModels are Ready; InferenceModel 'scale' (steps 'pre', 'post') does not \
             exist in namespace 'ml'; InferenceModel 'mlp' (step 'main') is not Ready: RollingOut (0/1 \
             replicas ready)"
        );
        assert_eq!(state(&s, DEGRADED).1, reasons::MEMBER_MISSING);
        assert_eq!(s.members.as_deref(), Some("0/2"));
    }

    #[test]
    fn an_invalid_dag_is_the_reason() {
        let e = ensemble(vec![step("a", "m", "X", "t"), step("b", "m", "missing", "Y")]);
        let models = [model("m", true)];
        let s = derive_status(&e, &members(&e, &models), at(10));
        let (status, reason, message) = state(&s, VALID);
        assert_eq!((status.as_str(), reason.as_str()), ("False", reason::INVALID_SPEC));
        assert!(message.contains("step \"b\" reads tensor \"missing\""), "{message}");
        assert_eq!(s.reason.as_deref(), Some(reason::INVALID_SPEC));
    }

    #[test]
    fn an_unchanged_world_gives_an_equal_status() {
        let mut e = pipeline();
        let models = [model("scale", true), model("mlp", true)];
        let first = derive_status(&e, &members(&e, &models), at(10));
        e.status = Some(first.clone());
        assert_eq!(derive_status(&e, &members(&e, &models), at(20)), first);
    }
}
