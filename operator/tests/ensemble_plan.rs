//! The ModelEnsemble controller's plan (`ensemble::plan`), without an API
//! server: from the members as read and the ensemble's own Deployment and
//! pods to whether it is deployed, its objects by placement, its status,
//! the Events it tells and when it comes back.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use nereid_crds::conditions::{DEGRADED, MEMBERS_READY, PROGRESSING, READY, VALID, reason};
use nereid_crds::{
    Autoscaling, AutoscalingMetric, EnsembleStep, EnsembleTensor, InferenceModel, InferenceModelStatus, ModelEnsemble,
    ModelEnsembleSpec, ModelEnsembleStatus, Placement,
};
use nereid_operator::builders::AutoscalerObject;
use nereid_operator::controller::plan::{PROGRESSING_REQUEUE, Report};
use nereid_operator::ensemble::members::{MemberConfig, TensorConfig};
use nereid_operator::ensemble::observe::{AfterApply, BeforeApply, MemberRead};
use nereid_operator::ensemble::plan::{self, Deploy};
use support::{at, config, ready_pod};

fn tensor(name: &str) -> EnsembleTensor {
    EnsembleTensor {
        name: name.into(),
        datatype: "FP32".into(),
        dims: vec![4],
    }
}

/// IN -> scale -> mid -> classify -> OUT.
fn ensemble(placement: Placement) -> ModelEnsemble {
    let step = |name: &str, model: &str, read: &str, write: &str| EnsembleStep {
        name: name.into(),
        model: model.into(),
        model_version: None,
        input_map: BTreeMap::from([("X".to_string(), read.to_string())]),
        output_map: BTreeMap::from([("Y".to_string(), write.to_string())]),
    };
    let mut e = ModelEnsemble::new(
        "pipe",
        ModelEnsembleSpec {
            steps: vec![
                step("pre", "scale", "IN", "mid"),
                step("main", "classify", "mid", "OUT"),
            ],
            inputs: vec![tensor("IN")],
            outputs: vec![tensor("OUT")],
            placement: Some(placement),
            ..ModelEnsembleSpec::default()
        },
    );
    e.metadata.namespace = Some("ml".into());
    e.metadata.uid = Some("uid-pipe".into());
    e.metadata.generation = Some(1);
    e
}

/// An InferenceModel of the ensemble's namespace, Ready or not.
fn model(name: &str, ready: bool) -> InferenceModel {
    let mut m = support::model();
    m.metadata.name = Some(name.into());
    m.spec.source.uri = format!("s3://models/{name}");
    m.status = Some(InferenceModelStatus {
        conditions: vec![Condition {
            type_: READY.into(),
            status: if ready { "True" } else { "False" }.into(),
            reason: if ready { reason::AVAILABLE } else { reason::ROLLING_OUT }.into(),
            message: String::new(),
            observed_generation: Some(3),
            last_transition_time: at(0),
        }],
        ..InferenceModelStatus::default()
    });
    m
}

/// FP32 [4] in, FP32 [4] out, batching 8.
fn member_config() -> MemberConfig {
    let tensor = |name: &str| TensorConfig {
        name: name.into(),
        data_type: "TYPE_FP32".into(),
        dims: vec![4],
        optional: false,
    };
    MemberConfig {
        max_batch_size: 8,
        inputs: vec![tensor("X")],
        outputs: vec![tensor("Y")],
    }
}

/// A member as read: Ready members' pods told their config.
fn member(name: &str, step: &str, model: Option<InferenceModel>) -> MemberRead {
    let ready = model
        .as_ref()
        .and_then(|m| m.status.as_ref())
        .is_some_and(|s| s.conditions[0].status == "True");
    MemberRead {
        name: name.into(),
        steps: vec![step.into()],
        model,
        config: ready.then(member_config),
    }
}

fn both_ready() -> BeforeApply {
    BeforeApply {
        members: vec![
            member("scale", "pre", Some(model("scale", true))),
            member("classify", "main", Some(model("classify", true))),
        ],
        name_taken: false,
        foreign_autoscaler: None,
    }
}

/// The ensemble's Deployment as applied, `ready` of 1 replica ready.
fn applied(e: &ModelEnsemble, before: &BeforeApply, ready: i32) -> AfterApply {
    let mut deployment: Deployment = plan::objects(e, before, &config()).unwrap().deployment;
    deployment.metadata.generation = Some(1);
    deployment.status = Some(k8s_openapi::api::apps::v1::DeploymentStatus {
        observed_generation: Some(1),
        replicas: Some(1),
        updated_replicas: Some(1),
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        ..Default::default()
    });
    AfterApply {
        deployment: Some(deployment),
        pods: if ready > 0 { vec![ready_pod("pipe-a")] } else { vec![] },
        ..AfterApply::default()
    }
}

fn state(status: &ModelEnsembleStatus, type_: &str) -> (String, String) {
    let c = status.conditions.iter().find(|c| c.type_ == type_).unwrap();
    (c.status.clone(), c.reason.clone())
}

fn is(status: bool, reason: &str) -> (String, String) {
    (if status { "True" } else { "False" }.to_string(), reason.to_string())
}

fn told<S>(report: &Report<S>) -> Vec<(EventType, String)> {
    report.events.iter().map(|e| (e.type_, e.reason.clone())).collect()
}

#[test]
fn a_missing_member_deploys_nothing_and_is_told() {
    let e = ensemble(Placement::Remote);
    let before = BeforeApply {
        members: vec![
            member("scale", "pre", Some(model("scale", true))),
            member("classify", "main", None),
        ],
        ..BeforeApply::default()
    };
    assert!(matches!(plan::deploy(&e, &before.members, false), Deploy::Wait));
    assert!(plan::objects(&e, &before, &config()).is_none());

    let report = plan::report(&e, &before, &AfterApply::default(), &config(), at(0));
    let status = report.status.as_ref().unwrap();
    assert_eq!(state(status, MEMBERS_READY), is(false, reason::MEMBER_MISSING));
    assert_eq!(state(status, READY), is(false, reason::MEMBER_MISSING));
    assert_eq!(state(status, DEGRADED), is(true, reason::MEMBER_MISSING));
    assert_eq!(state(status, PROGRESSING), is(true, reason::WAITING_FOR_MEMBERS));
    assert_eq!(state(status, VALID), is(true, reason::VALID_DAG));
    assert_eq!(status.members.as_deref(), Some("1/2"));
    assert_eq!(
        told(&report),
        [(EventType::Warning, reason::MEMBER_MISSING.to_string())]
    );
    assert_eq!(report.next.unwrap(), Action::requeue(PROGRESSING_REQUEUE));
}

#[test]
fn a_member_not_ready_waits_without_a_problem() {
    let e = ensemble(Placement::Remote);
    let before = BeforeApply {
        members: vec![
            member("scale", "pre", Some(model("scale", true))),
            member("classify", "main", Some(model("classify", false))),
        ],
        ..BeforeApply::default()
    };
    assert!(plan::objects(&e, &before, &config()).is_none());
    let report = plan::report(&e, &before, &AfterApply::default(), &config(), at(0));
    let status = report.status.as_ref().unwrap();
    assert_eq!(state(status, MEMBERS_READY), is(false, reason::MEMBER_NOT_READY));
    assert_eq!(state(status, DEGRADED), is(false, reason::AS_EXPECTED));
    assert!(told(&report).is_empty(), "waiting is no news");
}

#[test]
fn remote_placement_calls_each_member_from_a_small_pod() {
    let e = ensemble(Placement::Remote);
    let before = both_ready();
    assert!(matches!(plan::deploy(&e, &before.members, false), Deploy::Now(ref m) if m.len() == 2));
    let desired = plan::objects(&e, &before, &config()).unwrap();
    let data = desired.config_map.data.unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["classify.pbtxt", "pipe.pbtxt", "scale.pbtxt"]
    );
    assert!(data["scale.pbtxt"].contains("backend: \"remote\""));
    let pod = desired.deployment.spec.template.spec.unwrap();
    assert!(
        !pod.init_containers
            .iter()
            .flatten()
            .any(|c| c.name.starts_with("model-fetch")),
        "remote members are not fetched"
    );
}

#[test]
fn colocated_placement_fetches_every_member_into_the_pod() {
    let e = ensemble(Placement::Colocated);
    let desired = plan::objects(&e, &both_ready(), &config()).unwrap();
    let data = desired.config_map.data.unwrap();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["classify.json", "pipe.pbtxt", "scale.json"]
    );
    let pod = desired.deployment.spec.template.spec.unwrap();
    let fetches: Vec<String> = pod
        .init_containers
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .filter(|n| n.starts_with("model-fetch"))
        .collect();
    assert_eq!(fetches, ["model-fetch-0", "model-fetch-1"]);
}

#[test]
fn a_served_ensemble_is_available_once() {
    let e = ensemble(Placement::Remote);
    let before = both_ready();
    let report = plan::report(&e, &before, &applied(&e, &before, 0), &config(), at(0));
    let mut e = e;
    e.status = report.status;
    assert_eq!(state(e.status.as_ref().unwrap(), READY), is(false, reason::ROLLING_OUT));

    let report = plan::report(&e, &before, &applied(&e, &before, 1), &config(), at(10));
    let status = report.status.as_ref().unwrap();
    assert_eq!(state(status, READY), is(true, reason::AVAILABLE));
    assert_eq!(state(status, MEMBERS_READY), is(true, reason::ALL_MEMBERS_READY));
    assert_eq!(state(status, PROGRESSING), is(false, reason::ROLLOUT_COMPLETE));
    assert_eq!(told(&report), [(EventType::Normal, reason::AVAILABLE.to_string())]);
}

#[test]
fn tensors_that_do_not_fit_the_members_deploy_nothing() {
    let e = ensemble(Placement::Remote);
    let mut before = both_ready();
    before.members[1].config.as_mut().unwrap().inputs[0].data_type = "TYPE_INT32".into();
    let Deploy::Mismatch(problems) = plan::deploy(&e, &before.members, false) else {
        panic!("the DAG does not fit");
    };
    assert!(problems[0].contains("of type INT32"), "{problems:?}");
    assert!(plan::objects(&e, &before, &config()).is_none());
    let report = plan::report(&e, &before, &AfterApply::default(), &config(), at(0));
    let status = report.status.unwrap();
    assert_eq!(state(&status, VALID), is(false, reason::MEMBER_TENSOR_MISMATCH));
    assert_eq!(state(&status, READY), is(false, reason::MEMBER_TENSOR_MISMATCH));
}

#[test]
fn a_name_taken_by_a_model_deploys_nothing() {
    let e = ensemble(Placement::Remote);
    let mut before = both_ready();
    before.name_taken = true;
    assert!(plan::objects(&e, &before, &config()).is_none());
    let status = plan::report(&e, &before, &AfterApply::default(), &config(), at(0))
        .status
        .unwrap();
    assert_eq!(state(&status, VALID), is(false, reason::NAME_TAKEN));
}

#[test]
fn an_invalid_dag_deploys_nothing() {
    let mut e = ensemble(Placement::Remote);
    e.spec.steps[0].input_map.insert("Z".into(), "nowhere".into());
    let before = both_ready();
    assert!(matches!(plan::deploy(&e, &before.members, false), Deploy::Wait));
    let status = plan::report(&e, &before, &AfterApply::default(), &config(), at(0))
        .status
        .unwrap();
    assert_eq!(state(&status, VALID), is(false, reason::INVALID_SPEC));
}

#[test]
fn an_autoscaled_ensemble_leaves_its_pods_to_a_foreign_autoscaler() {
    let mut e = ensemble(Placement::Remote);
    e.spec.autoscaling = Some(Autoscaling {
        max_replicas: 3,
        metric: AutoscalingMetric::PendingRequests,
        target: "4".into(),
        ..Autoscaling::default()
    });
    let mut before = both_ready();
    let desired = plan::objects(&e, &before, &config()).unwrap();
    assert!(matches!(desired.autoscaler, AutoscalerObject::Hpa(Some(_))));

    before.foreign_autoscaler = Some("legacy".into());
    let desired = plan::objects(&e, &before, &config()).unwrap();
    assert!(matches!(desired.autoscaler, AutoscalerObject::Hpa(None)));
    let status = plan::report(&e, &before, &applied(&e, &before, 1), &config(), at(0))
        .status
        .unwrap();
    assert_eq!(
        status.autoscaling.unwrap().reason.as_deref(),
        Some(reason::FOREIGN_AUTOSCALER)
    );
}
