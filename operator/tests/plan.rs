//! The InferenceModel controller's plan (`controller::plan`), without an API
//! server: from what a reconcile read before and after the apply to the
//! objects it applies, the status it writes, the Events it tells and when it
//! comes back. The requests that carry these out are `tests/reconcile.rs`'s.

mod support;

use std::time::Duration;

use k8s_openapi::api::autoscaling::v2::{HorizontalPodAutoscaler, HorizontalPodAutoscalerStatus};
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use nereid_crds::conditions::{DEGRADED, MODEL_LOADED, PROGRESSING, READY, reason};
use nereid_crds::{Autoscaling, AutoscalingMetric, InferenceModel, InferenceModelStatus};
use nereid_operator::builders::{self, AutoscalerObject};
use nereid_operator::context::{Autoscaler, OperatorConfig};
use nereid_operator::controller::observe::{AfterApply, BeforeApply};
use nereid_operator::controller::plan::{self, PROGRESSING_REQUEUE, Report, SETTLED_REQUEUE};
use nereid_operator::error::Error;
use nereid_operator::status::Missing;
use nereid_operator::status::fetch::FetchProgress;
use nereid_operator::status::gpus::{GpuCapacity, NodeGpus};
use nereid_proto::contract::exit;
use support::*;

/// What the cluster shows after applying `model`'s objects: the Deployment
/// `deployment(model, replicas, updated, ready)` and `pods`, nothing else.
fn after(model: &InferenceModel, (replicas, updated, ready): (i32, i32, i32), pods: Vec<Pod>) -> AfterApply {
    AfterApply {
        deployment: deployment(model, replicas, updated, ready),
        hpa: None,
        pods,
        gpus: None,
        loaded_versions: None,
        fetch: None,
        figures: None,
        canary: None,
    }
}

/// What a report tells: (type, reason) of each Event.
fn told<S>(report: &Report<S>) -> Vec<(EventType, String)> {
    report.events.iter().map(|e| (e.type_, e.reason.clone())).collect()
}

fn condition<'a>(status: &'a InferenceModelStatus, type_: &str) -> &'a Condition {
    status.conditions.iter().find(|c| c.type_ == type_).unwrap()
}

/// (status, reason) of a condition.
fn state(status: &InferenceModelStatus, type_: &str) -> (String, String) {
    let c = condition(status, type_);
    (c.status.clone(), c.reason.clone())
}

fn is(status: bool, reason: &str) -> (String, String) {
    (if status { "True" } else { "False" }.to_string(), reason.to_string())
}

fn autoscaled() -> InferenceModel {
    let mut m = model();
    m.spec.autoscaling = Some(Autoscaling {
        max_replicas: 3,
        metric: AutoscalingMetric::QueueTimeMicros,
        target: "500".into(),
        ..Autoscaling::default()
    });
    m
}

fn keda() -> OperatorConfig {
    OperatorConfig {
        autoscaler: Autoscaler::Keda {
            scaler_address: "nereid-operator.nereid.svc:9443".into(),
            trigger_authentication: None,
        },
        ..config()
    }
}

/// A pod whose server stopped itself because the model did not load.
fn load_failed_pod(name: &str) -> Pod {
    let mut server = container(
        "nereid-server",
        waiting("CrashLoopBackOff", "back-off 10s restarting failed container"),
        false,
        false,
    );
    server.restart_count = 2;
    server.last_state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: i32::from(exit::LOAD_FAILED),
            reason: Some("Error".into()),
            message: Some("loading resnet\nError: failed to load 'resnet': no such file".into()),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    });
    pod(name, server)
}

#[test]
fn a_new_model_gets_every_object_and_a_rolling_out_status() {
    let m = model();
    let desired = plan::objects(&m, &BeforeApply::default(), &config());
    assert_eq!(desired.deployment.spec.replicas, Some(1));
    assert_eq!(desired.service.metadata.name.as_deref(), Some(NAME));
    assert!(desired.network_policy.is_none());
    assert!(
        matches!(desired.autoscaler, AutoscalerObject::Hpa(None)),
        "no spec.autoscaling"
    );

    // Just created: the Deployment controller has not acted yet.
    let mut after = after(&m, (0, 0, 0), vec![]);
    after.deployment.metadata.generation = Some(1);
    after.deployment.status = None;
    let report = plan::report(&m, &BeforeApply::default(), &after, &config(), at(0));
    let status = report.status.as_ref().expect("a first status is written");
    assert_eq!(state(status, READY), is(false, reason::ROLLING_OUT));
    assert_eq!(state(status, MODEL_LOADED), is(false, reason::LOADING));
    assert_eq!(state(status, PROGRESSING), is(true, reason::ROLLING_OUT));
    assert_eq!(state(status, DEGRADED), is(false, reason::AS_EXPECTED));
    assert_eq!(status.ready.as_deref(), Some("0/1"));
    assert_eq!(status.observed_generation, Some(3));
    assert!(told(&report).is_empty(), "rolling out is no news");
    assert_eq!(report.next.unwrap(), Action::requeue(PROGRESSING_REQUEUE));
}

#[test]
fn a_download_in_progress_is_the_model_loaded_reason() {
    let m = model();
    let mut after = after(&m, (1, 1, 0), vec![]);
    after.fetch = Some(FetchProgress {
        pod: "resnet-0".into(),
        done: 3 << 30,
        total: 4 << 30,
    });
    let report = plan::report(&m, &BeforeApply::default(), &after, &config(), at(0));
    let status = report.status.as_ref().unwrap();
    let loaded = condition(status, MODEL_LOADED);
    assert_eq!(state(status, MODEL_LOADED), is(false, reason::FETCHING));
    assert_eq!(loaded.message, "fetching 3.0 GiB of 4.0 GiB, 75 % (pod resnet-0)");
    assert!(told(&report).is_empty(), "a download is no news");
}

#[test]
fn ready_pods_make_it_available_once() {
    let mut m = model();
    let rolling = after(&m, (1, 1, 0), vec![]);
    m.status = plan::report(&m, &BeforeApply::default(), &rolling, &config(), at(0)).status;

    let mut serving = after(&m, (1, 1, 1), vec![ready_pod("resnet-a")]);
    serving.loaded_versions = Some(vec!["1".into()]);
    let report = plan::report(&m, &BeforeApply::default(), &serving, &config(), at(10));
    let status = report.status.clone().expect("the change is written");
    assert_eq!(state(&status, READY), is(true, reason::AVAILABLE));
    assert_eq!(state(&status, MODEL_LOADED), is(true, reason::LOADED));
    assert_eq!(state(&status, PROGRESSING), is(false, reason::ROLLOUT_COMPLETE));
    assert_eq!(status.loaded_versions, ["1"]);
    assert_eq!(status.reason, None);
    assert_eq!(told(&report), [(EventType::Normal, reason::AVAILABLE.to_string())]);
    assert_eq!(report.next.unwrap(), Action::requeue(SETTLED_REQUEUE));

    // Seen again, unchanged: nothing to write, nothing to tell; the
    // versions stay when no pod answers.
    m.status = Some(status);
    serving.loaded_versions = None;
    let again = plan::report(&m, &BeforeApply::default(), &serving, &config(), at(70));
    assert!(again.status.is_none() && again.events.is_empty());
    assert_eq!(again.next.unwrap(), Action::requeue(SETTLED_REQUEUE));
}

#[test]
fn a_failed_load_is_model_loaded_false_and_told_once() {
    let mut m = model();
    m.status = Some(status_of(&m, &deployment(&m, 1, 1, 0), &[], at(0)));
    let failing = after(&m, (1, 1, 0), vec![load_failed_pod("resnet-a")]);
    let report = plan::report(&m, &BeforeApply::default(), &failing, &config(), at(60));
    let status = report.status.as_ref().unwrap();
    assert_eq!(state(status, MODEL_LOADED), is(false, reason::LOAD_FAILED));
    assert_eq!(state(status, DEGRADED), is(true, reason::LOAD_FAILED));
    assert_eq!(state(status, READY), is(false, reason::LOAD_FAILED));
    assert!(
        condition(status, MODEL_LOADED).message.contains("no such file"),
        "the server's own reason: {:?}",
        condition(status, MODEL_LOADED).message
    );
    assert_eq!(status.last_failure.as_ref().unwrap().reason, reason::LOAD_FAILED);
    assert_eq!(told(&report), [(EventType::Warning, reason::LOAD_FAILED.to_string())]);
}

#[test]
fn a_missing_claim_is_reported_and_ends_as_its_error() {
    let mut m = model();
    m.spec.source.uri = "pvc://models/resnet".into();
    let before = BeforeApply {
        missing: Some(Missing::Claim("models".into())),
        foreign_autoscaler: None,
    };
    let report = plan::report(&m, &before, &after(&m, (1, 1, 0), vec![]), &config(), at(0));
    let status = report.status.as_ref().unwrap();
    assert_eq!(state(status, DEGRADED), is(true, reason::MISSING_PVC));
    assert_eq!(told(&report), [(EventType::Warning, reason::MISSING_PVC.to_string())]);
    assert!(matches!(report.next, Err(Error::MissingClaim(ref c)) if c == "models"));
}

#[test]
fn pods_waiting_for_gpus_quote_the_free_gpus() {
    let m = model();
    let message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.";
    let mut waiting = after(&m, (1, 1, 0), vec![unschedulable_pod("resnet-a", message)]);
    waiting.gpus = Some(GpuCapacity {
        resource: "nvidia.com/gpu".into(),
        wanted: 1,
        best: Some(NodeGpus {
            node: "gpu-1".into(),
            free: 0,
            allocatable: 8,
        }),
    });
    let report = plan::report(&m, &BeforeApply::default(), &waiting, &config(), at(0));
    let status = report.status.as_ref().unwrap();
    assert_eq!(state(status, READY), is(false, reason::INSUFFICIENT_GPU));
    assert!(
        condition(status, DEGRADED).message.contains("node gpu-1: 0 of 8 free"),
        "{:?}",
        condition(status, DEGRADED).message
    );
}

#[test]
fn an_autoscaled_model_gets_its_hpa_and_reports_it() {
    let m = autoscaled();
    let desired = plan::objects(&m, &BeforeApply::default(), &config());
    let AutoscalerObject::Hpa(Some(hpa)) = &desired.autoscaler else {
        panic!("an HPA is made");
    };
    assert_eq!(hpa.spec.scale_target_ref.kind, "InferenceModel");

    let mut applied = after(&m, (2, 2, 2), vec![]);
    let mut hpa: HorizontalPodAutoscaler = (**hpa).clone();
    hpa.status = Some(HorizontalPodAutoscalerStatus {
        desired_replicas: 2,
        ..HorizontalPodAutoscalerStatus::default()
    });
    applied.hpa = Some(hpa);
    let report = plan::report(&m, &BeforeApply::default(), &applied, &config(), at(0));
    let autoscaling = report.status.unwrap().autoscaling.expect("status.autoscaling");
    assert_eq!(autoscaling.horizontal_pod_autoscaler.as_deref(), Some(NAME));
    assert_eq!(autoscaling.desired_replicas, Some(2));
    assert_eq!(autoscaling.reason, None);
}

#[test]
fn no_autoscaler_is_made_over_pods_another_one_scales() {
    let m = autoscaled();
    let before = BeforeApply {
        missing: None,
        foreign_autoscaler: Some("legacy".into()),
    };
    let desired = plan::objects(&m, &before, &config());
    assert!(
        matches!(desired.autoscaler, AutoscalerObject::Hpa(None)),
        "ours is removed"
    );
    let desired = plan::objects(&m, &before, &keda());
    assert!(
        matches!(desired.autoscaler, AutoscalerObject::Keda(None)),
        "ours is removed"
    );
    assert!(matches!(
        plan::objects(&m, &BeforeApply::default(), &keda()).autoscaler,
        AutoscalerObject::Keda(Some(_))
    ));

    let report = plan::report(&m, &before, &after(&m, (1, 1, 1), vec![]), &config(), at(0));
    let autoscaling = report.status.unwrap().autoscaling.unwrap();
    assert_eq!(autoscaling.reason.as_deref(), Some(reason::FOREIGN_AUTOSCALER));
    assert!(autoscaling.message.unwrap().contains("\"legacy\""));
    assert_eq!(autoscaling.horizontal_pod_autoscaler, None);
}

#[test]
fn the_objects_are_the_builders_own() {
    // The plan adds nothing of its own to what the builders make.
    let m = autoscaled();
    let planned = plan::objects(&m, &BeforeApply::default(), &config());
    let built = builders::desired(&m, &config());
    assert_eq!(planned.deployment, built.deployment);
    assert_eq!(planned.config_map, built.config_map);
    assert_eq!(planned.pdb, built.pdb);
}

#[test]
fn an_invalid_spec_is_reported_and_ends_as_its_error() {
    let mut m = model();
    m.spec.source.uri = "ftp://models/resnet".into();
    let problems = nereid_crds::validate(&m.spec).unwrap_err();
    let report = plan::invalid_spec(&m, problems, at(0));
    let status = report.status.as_ref().unwrap();
    assert_eq!(state(status, READY), is(false, reason::INVALID_SPEC));
    assert_eq!(state(status, DEGRADED), is(true, reason::INVALID_SPEC));
    assert_eq!(told(&report), [(EventType::Warning, reason::INVALID_SPEC.to_string())]);
    let Err(error) = report.next else {
        panic!("an invalid spec ends the reconcile as an error");
    };
    assert!(matches!(error, Error::InvalidSpec(_)));
    assert_eq!(error.requeue(), Duration::from_secs(300));
}
