//! The status, derived from hand-built Deployments and Pods: every reason
//! the issue names comes from what the pods show, and an unchanged world
//! gives an unchanged status.

mod support;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ContainerState, ContainerStateTerminated, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use nereid_crds::{InferenceModel, InferenceModelStatus, ModelResources};
use nereid_operator::context::{Gateway, OperatorConfig};
use nereid_operator::status::gpus::{GpuCapacity, NodeGpus};
use nereid_operator::status::{
    Missing, Observed, Rollout, derive_status, invalid_spec_status, rollout, waits_for_gpus,
};
use support::*;

fn derive(model: &InferenceModel, deployment: Option<(i32, i32, i32)>, pods: &[Pod]) -> InferenceModelStatus {
    let d = deployment.map(|(r, u, ready)| support::deployment(model, r, u, ready));
    let observed = Observed {
        deployment: d.as_ref(),
        pods,
        ..Observed::default()
    };
    derive_status(model, &observed, &config(), at(100))
}

/// The status given a Deployment, pods and what is missing, at `now`.
fn observe(
    model: &InferenceModel,
    d: &Deployment,
    pods: &[Pod],
    missing: Option<&Missing>,
    now: Time,
) -> InferenceModelStatus {
    let observed = Observed {
        deployment: Some(d),
        pods,
        missing,
        gpus: None,
    };
    derive_status(model, &observed, &config(), now)
}

fn condition<'a>(status: &'a InferenceModelStatus, type_: &str) -> &'a Condition {
    status
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .unwrap_or_else(|| panic!("no {type_} condition in {status:?}"))
}

/// (status, reason) of a condition.
fn state(status: &InferenceModelStatus, type_: &str) -> (String, String) {
    let c = condition(status, type_);
    (c.status.clone(), c.reason.clone())
}

fn is(status: &str, reason: &str) -> (String, String) {
    (status.to_string(), reason.to_string())
}

#[test]
fn a_new_model_is_progressing_with_its_selector_and_endpoints() {
    let m = model();
    let s = derive(&m, None, &[]);
    assert_eq!(s.observed_generation, Some(3));
    assert_eq!((s.replicas, s.ready_replicas), (0, 0));
    assert_eq!(
        s.selector,
        "app.kubernetes.io/name=nereid-server,serving.nereid.dev/model=resnet"
    );
    let endpoints = s.endpoints.clone().unwrap();
    assert_eq!(endpoints.grpc, "resnet.ml.svc.cluster.local:8001");
    assert_eq!(endpoints.http, "http://resnet.ml.svc.cluster.local:8000");
    assert_eq!(state(&s, "Ready"), is("False", "RollingOut"));
    assert_eq!(state(&s, "ModelLoaded"), is("False", "Loading"));
    assert_eq!(state(&s, "Progressing"), is("True", "RollingOut"));
    assert_eq!(state(&s, "Degraded"), is("False", "AsExpected"));
    assert_eq!(s.last_failure, None);
    assert!(s.conditions.iter().all(|c| c.observed_generation == Some(3)));
    assert!(s.conditions.iter().all(|c| c.last_transition_time == at(100)));
}

#[test]
fn all_replicas_ready_is_ready_and_loaded() {
    let mut m = model();
    m.spec.replicas = Some(2);
    let s = derive(&m, Some((2, 2, 2)), &[ready_pod("a"), ready_pod("b")]);
    assert_eq!((s.replicas, s.ready_replicas), (2, 2));
    assert_eq!(state(&s, "Ready"), is("True", "Available"));
    assert_eq!(condition(&s, "Ready").message, "2/2 replicas ready");
    assert_eq!(state(&s, "ModelLoaded"), is("True", "Loaded"));
    assert_eq!(state(&s, "Progressing"), is("False", "RolloutComplete"));
    assert_eq!(state(&s, "Degraded"), is("False", "AsExpected"));
}

#[test]
fn an_image_that_cannot_be_pulled_is_image_pull_back_off() {
    let m = model();
    for kubelet_reason in ["ImagePullBackOff", "ErrImagePull"] {
        let p = pod(
            "a",
            container(
                "nereid-server",
                waiting(kubelet_reason, "pull access denied"),
                false,
                false,
            ),
        );
        let s = derive(&m, Some((1, 1, 0)), &[p]);
        assert_eq!(state(&s, "Ready"), is("False", "ImagePullBackOff"), "{kubelet_reason}");
        assert_eq!(state(&s, "Degraded"), is("True", "ImagePullBackOff"));
        assert!(condition(&s, "Degraded").message.contains("pull access denied"));
        let failure = s.last_failure.unwrap();
        assert_eq!(failure.reason, "ImagePullBackOff");
        assert_eq!(failure.time, at(100));
    }
}

#[test]
fn a_crash_loop_is_reported_with_the_servers_last_words() {
    let m = model();
    let s = derive(
        &m,
        Some((1, 1, 0)),
        &[crash_looping_pod("a", "Error: failed to read the model repository")],
    );
    assert_eq!(state(&s, "Ready"), is("False", "CrashLoopBackOff"));
    assert_eq!(state(&s, "Degraded"), is("True", "CrashLoopBackOff"));
    let message = &condition(&s, "Degraded").message;
    assert!(message.contains("pod a"), "{message}");
    assert!(message.contains("exited with code 1"), "{message}");
    assert!(message.contains("failed to read the model repository"), "{message}");
}

#[test]
fn a_crash_loop_during_a_rollout_is_not_ready_even_with_old_pods_serving() {
    let m = model();
    // The old pod serves; the new one (maxSurge) crash-loops.
    let s = derive(
        &m,
        Some((2, 1, 1)),
        &[ready_pod("old"), crash_looping_pod("new", "panic")],
    );
    assert_eq!(s.ready_replicas, 1);
    assert_eq!(state(&s, "Ready"), is("False", "CrashLoopBackOff"));
    assert_eq!(state(&s, "Progressing"), is("True", "RollingOut"));
    assert_eq!(
        state(&s, "ModelLoaded"),
        is("True", "Loaded"),
        "the old pod still has it loaded"
    );
}

#[test]
fn an_unschedulable_pod_carries_the_schedulers_message() {
    let m = model();
    let message = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector.";
    let s = derive(&m, Some((1, 1, 0)), &[unschedulable_pod("a", message)]);
    assert_eq!(state(&s, "Ready"), is("False", "Unschedulable"));
    assert_eq!(state(&s, "Degraded"), is("True", "Unschedulable"));
    assert!(condition(&s, "Degraded").message.contains(message));
}

#[test]
fn no_gpu_on_any_node_is_insufficient_gpu() {
    let m = model();
    let message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu. preemption: 0/2 nodes are available";
    let s = derive(&m, Some((1, 1, 0)), &[unschedulable_pod("a", message)]);
    assert_eq!(state(&s, "Ready"), is("False", "InsufficientGPU"));
    assert_eq!(state(&s, "Degraded"), is("True", "InsufficientGPU"));
    assert!(
        condition(&s, "Degraded")
            .message
            .contains("Insufficient nvidia.com/gpu")
    );
    assert_eq!(s.last_failure.unwrap().reason, "InsufficientGPU");
}

#[test]
fn insufficient_gpu_says_how_many_the_best_node_has_free() {
    let mut m = model();
    m.spec.resources = Some(ModelResources {
        gpu: Some(4),
        ..ModelResources::default()
    });
    let d = support::deployment(&m, 1, 1, 0);
    let message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.";
    let pods = [unschedulable_pod("a", message)];
    let now = at(100);
    assert!(waits_for_gpus(&m, &pods, &now));
    let gpus = GpuCapacity {
        resource: "nvidia.com/gpu".into(),
        wanted: 4,
        best: Some(NodeGpus {
            node: "gpu-a".into(),
            free: 2,
            allocatable: 8,
        }),
    };
    let observed = Observed {
        deployment: Some(&d),
        pods: &pods,
        missing: None,
        gpus: Some(&gpus),
    };
    let s = derive_status(&m, &observed, &config(), now.clone());
    assert_eq!(state(&s, "Ready"), is("False", "InsufficientGPU"));
    let said = &condition(&s, "Degraded").message;
    assert!(said.contains(message), "{said}");
    assert!(
        said.ends_with("each pod asks for 4 nvidia.com/gpu; the most any node has free is 2 (node gpu-a: 2 of 8 free)"),
        "{said}"
    );
    assert!(!waits_for_gpus(&m, &[ready_pod("b")], &now));
}

#[test]
fn a_missing_claim_is_missing_pvc() {
    let mut m = model();
    m.spec.source.uri = "pvc://models/resnet".into();
    let d = support::deployment(&m, 1, 1, 0);
    let s = observe(&m, &d, &[], Some(&Missing::Claim("models".into())), at(100));
    assert_eq!(state(&s, "Ready"), is("False", "MissingPVC"));
    assert_eq!(state(&s, "Degraded"), is("True", "MissingPVC"));
    assert!(
        condition(&s, "Degraded").message.starts_with(
            "PersistentVolumeClaim 'models' (spec.source.uri pvc://models/...) does not exist in namespace 'ml'"
        ),
        "{}",
        condition(&s, "Degraded").message
    );
    assert_eq!(s.reason.as_deref(), Some("MissingPVC"));
}

#[test]
fn ready_reason_and_url_fill_the_columns() {
    let mut two = model();
    two.spec.replicas = Some(2);
    let rolling = derive(&two, Some((2, 2, 1)), &[ready_pod("a")]);
    assert_eq!(rolling.ready.as_deref(), Some("1/2"));
    assert_eq!(rolling.reason.as_deref(), Some("RollingOut"));
    let m = model();
    let d = support::deployment(&m, 1, 1, 1);
    let ready = observe(&m, &d, &[ready_pod("a")], None, at(100));
    assert_eq!(ready.ready.as_deref(), Some("1/1"));
    assert_eq!(ready.reason, None, "no reason while Ready");
    assert_eq!(
        ready.url.as_deref(),
        Some("http://resnet.ml.svc.cluster.local:8000/v2/models/resnet/infer")
    );
    // With a gateway that routes the namespace, the URL is the gateway's.
    let config = OperatorConfig {
        gateway: Some(Gateway {
            http: "http://gw.nereid.svc.cluster.local:8000".into(),
            grpc: "gw.nereid.svc.cluster.local:8001".into(),
            namespaces: None,
        }),
        ..config()
    };
    let observed = Observed {
        deployment: Some(&d),
        pods: &[],
        ..Observed::default()
    };
    let via_gateway = derive_status(&m, &observed, &config, at(100));
    assert_eq!(
        via_gateway.url.as_deref(),
        Some("http://gw.nereid.svc.cluster.local:8000/v2/models/ml%2Fresnet/infer")
    );
    assert_eq!(
        via_gateway.endpoints.unwrap().http,
        "http://resnet.ml.svc.cluster.local:8000",
        "the Service stays in endpoints"
    );
}

#[test]
fn no_mig_slice_is_insufficient_gpu_too() {
    let mut m = model();
    m.spec.resources = Some(ModelResources {
        gpu: Some(1),
        gpu_resource: Some("nvidia.com/mig-1g.10gb".into()),
        ..ModelResources::default()
    });
    let message = "0/1 nodes are available: 1 Insufficient nvidia.com/mig-1g.10gb.";
    let s = derive(&m, Some((1, 1, 0)), &[unschedulable_pod("a", message)]);
    assert_eq!(state(&s, "Degraded"), is("True", "InsufficientGPU"));
}

#[test]
fn a_server_that_started_but_never_got_the_model_ready_failed_to_load() {
    let m = model();
    // Running since t=0, started (startup probe passed), not ready at t=100.
    let p = pod("a", container("nereid-server", running_since(at(0)), false, true));
    let s = derive(&m, Some((1, 1, 0)), &[p]);
    assert_eq!(state(&s, "ModelLoaded"), is("False", "LoadFailed"));
    assert_eq!(state(&s, "Ready"), is("False", "LoadFailed"));
    assert_eq!(state(&s, "Degraded"), is("True", "LoadFailed"));
    assert!(condition(&s, "ModelLoaded").message.contains("/v2/models/resnet/ready"));
}

#[test]
fn a_server_just_started_is_still_loading() {
    let m = model();
    // Started 10 s before `now`: inside the readiness probe's grace.
    let p = pod("a", container("nereid-server", running_since(at(90)), false, true));
    let s = derive(&m, Some((1, 1, 0)), &[p]);
    assert_eq!(state(&s, "ModelLoaded"), is("False", "Loading"));
    assert_eq!(state(&s, "Degraded"), is("False", "AsExpected"));
    // Not started yet (startup probe still running): loading, however long.
    let p = pod("a", container("nereid-server", running_since(at(0)), false, false));
    let s = derive(&m, Some((1, 1, 0)), &[p]);
    assert_eq!(state(&s, "ModelLoaded"), is("False", "Loading"));
}

#[test]
fn a_server_that_exits_on_a_failed_load_reports_its_own_reason() {
    let m = model();
    let mut server = container(
        "nereid-server",
        waiting("CrashLoopBackOff", "back-off 20s"),
        false,
        false,
    );
    server.restart_count = 2;
    server.last_state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 3,
            message: Some("INFO loading 'resnet'\nError: failed to load 'resnet': Protobuf parsing failed\n".into()),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    });
    let s = derive(&m, Some((1, 1, 0)), &[pod("a", server.clone())]);
    assert_eq!(state(&s, "ModelLoaded"), is("False", "LoadFailed"));
    assert_eq!(state(&s, "Degraded"), is("True", "LoadFailed"));
    let message = &condition(&s, "ModelLoaded").message;
    assert!(
        message.ends_with("(restarted 2 times): failed to load 'resnet': Protobuf parsing failed"),
        "{message}"
    );

    // Any other exit status is a crash loop, with the message as it was.
    server
        .last_state
        .as_mut()
        .unwrap()
        .terminated
        .as_mut()
        .unwrap()
        .exit_code = 1;
    let s = derive(&m, Some((1, 1, 0)), &[pod("a", server)]);
    assert_eq!(state(&s, "Degraded"), is("True", "CrashLoopBackOff"));
}

#[test]
fn a_failed_fetch_is_a_failed_load() {
    let m = model();
    let mut p = pod(
        "a",
        container("nereid-server", waiting("PodInitializing", ""), false, false),
    );
    let mut fetch = container("model-fetch", waiting("CrashLoopBackOff", "back-off"), false, false);
    fetch.last_state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 1,
            message: Some("model-fetch: cannot fetch s3://models/resnet".into()),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    });
    p.status.as_mut().unwrap().init_container_statuses = Some(vec![fetch]);
    let s = derive(&m, Some((1, 1, 0)), &[p]);
    assert_eq!(state(&s, "ModelLoaded"), is("False", "LoadFailed"));
    let message = &condition(&s, "ModelLoaded").message;
    assert!(message.contains("fetching the model failed"), "{message}");
    assert!(message.contains("cannot fetch s3://models/resnet"), "{message}");
}

#[test]
fn a_missing_secret_is_read_from_the_pods() {
    let mut m = model();
    m.spec.source.credentials_secret = Some("s3-creds".into());
    // The kubelet's two wordings: its Secret manager's, and the API server's.
    for said in [r#"secret "s3-creds" not found"#, r#"secrets "s3-creds" not found"#] {
        let s = derive(&m, Some((1, 1, 0)), &[missing_secret_pod("a", said)]);
        assert_eq!(state(&s, "Degraded"), is("True", "MissingSecret"), "{said}");
        assert_eq!(state(&s, "Ready"), is("False", "MissingSecret"));
        // Nothing was fetched, so nothing failed to load.
        assert_eq!(state(&s, "ModelLoaded"), is("False", "Loading"));
        let message = &condition(&s, "Degraded").message;
        assert!(message.starts_with("pod a: container model-fetch:"), "{message}");
        assert!(message.contains("Secret 's3-creds' does not exist"), "{message}");
        assert_eq!(s.reason.as_deref(), Some("MissingSecret"));
        assert_eq!(s.last_failure.unwrap().reason, "MissingSecret");
    }
}

#[test]
fn a_missing_repository_key_secret_is_a_missing_secret_too() {
    let m = model();
    let p = pod(
        "a",
        container(
            "nereid-server",
            waiting("CreateContainerConfigError", r#"secret "admin" not found"#),
            false,
            false,
        ),
    );
    let s = derive(&m, Some((1, 1, 0)), &[p]);
    assert_eq!(state(&s, "Degraded"), is("True", "MissingSecret"));
    assert!(condition(&s, "Degraded").message.contains("Secret 'admin'"));
}

#[test]
fn a_missing_secret_outranks_a_crash_loop() {
    let mut m = model();
    m.spec.replicas = Some(2);
    let pods = [
        crash_looping_pod("a", "boom"),
        missing_secret_pod("b", r#"secret "s3-creds" not found"#),
    ];
    let s = derive(&m, Some((2, 2, 0)), &pods);
    assert_eq!(state(&s, "Degraded"), is("True", "MissingSecret"));
}

#[test]
fn other_container_errors_keep_the_kubelets_reason() {
    let m = model();
    let p = pod(
        "a",
        container(
            "nereid-server",
            waiting(
                "CreateContainerConfigError",
                "couldn't find key token in Secret ml/s3-creds",
            ),
            false,
            false,
        ),
    );
    let s = derive(&m, Some((1, 1, 0)), &[p]);
    assert_eq!(state(&s, "Degraded"), is("True", "CreateContainerConfigError"));
    assert!(condition(&s, "Degraded").message.contains("couldn't find key token"));
}

#[test]
fn the_worst_problem_wins_and_counts_its_pods() {
    let mut m = model();
    m.spec.replicas = Some(3);
    let gpu = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.";
    let pods = [
        crash_looping_pod("a", "boom"),
        unschedulable_pod("b", gpu),
        unschedulable_pod("c", gpu),
    ];
    let s = derive(&m, Some((3, 3, 0)), &pods);
    assert_eq!(state(&s, "Degraded"), is("True", "InsufficientGPU"));
    let message = &condition(&s, "Degraded").message;
    assert!(message.starts_with("pod b:"), "{message}");
    assert!(message.ends_with("(and 1 more pods)"), "{message}");
}

#[test]
fn terminating_and_finished_pods_are_ignored() {
    let m = model();
    let mut terminating = crash_looping_pod("old", "boom");
    terminating.metadata.deletion_timestamp = Some(at(50));
    let mut evicted = crash_looping_pod("evicted", "boom");
    evicted.status.as_mut().unwrap().phase = Some("Failed".into());
    let s = derive(&m, Some((1, 1, 1)), &[terminating, evicted, ready_pod("new")]);
    assert_eq!(state(&s, "Ready"), is("True", "Available"));
    assert_eq!(state(&s, "Degraded"), is("False", "AsExpected"));
}

#[test]
fn a_stalled_rollout_is_degraded() {
    let m = model();
    let d = stalled(support::deployment(&m, 2, 1, 1));
    let s = observe(&m, &d, &[], None, at(100));
    assert_eq!(state(&s, "Progressing"), is("False", "ProgressDeadlineExceeded"));
    assert_eq!(state(&s, "Degraded"), is("True", "ProgressDeadlineExceeded"));
    assert!(condition(&s, "Degraded").message.contains("timed out progressing"));
}

#[test]
fn rollout_waits_for_the_deployment_controller_to_see_the_spec() {
    let m = model();
    let mut d = support::deployment(&m, 1, 1, 1);
    assert_eq!(rollout(Some(&d), 1), Rollout::Complete);
    d.metadata.generation = Some(3);
    assert!(matches!(rollout(Some(&d), 1), Rollout::InProgress(_)));
    assert!(matches!(rollout(None, 1), Rollout::InProgress(_)));
    let d = support::deployment(&m, 2, 1, 2);
    assert!(
        matches!(rollout(Some(&d), 1), Rollout::InProgress(_)),
        "an old pod is still there"
    );
}

#[test]
fn scaled_to_zero_is_not_ready_and_not_a_failure() {
    let mut m = model();
    m.spec.replicas = Some(0);
    let s = derive(&m, Some((0, 0, 0)), &[]);
    assert_eq!(state(&s, "Ready"), is("False", "ScaledToZero"));
    assert_eq!(state(&s, "Degraded"), is("False", "AsExpected"));
    assert!(
        s.conditions.iter().all(|c| c.type_ != "ScaledToZero"),
        "a model that does not scale to zero has no such condition"
    );
}

#[test]
fn a_model_that_scales_to_zero_says_when_it_slept_and_what_wakes_it() {
    let mut m = model();
    m.spec.autoscaling = Some(nereid_crds::Autoscaling {
        min_replicas: Some(0),
        max_replicas: 2,
        target: "500".into(),
        scale_to_zero_after: Some("90s".into()),
        ..Default::default()
    });
    m.spec.replicas = Some(1);
    let awake = derive(&m, Some((1, 1, 1)), &[]);
    assert_eq!(state(&awake, "ScaledToZero"), is("False", "Awake"));
    m.status = Some(awake);
    m.spec.replicas = Some(0);
    let asleep = derive(&m, Some((0, 0, 0)), &[]);
    assert_eq!(state(&asleep, "ScaledToZero"), is("True", "ScaledToZero"));
    let ready = condition(&asleep, "Ready");
    assert_eq!(ready.reason, "ScaledToZero");
    assert!(
        ready.message.contains("after 1m30s without requests") && ready.message.contains("nereid-gateway wakes it"),
        "{}",
        ready.message
    );
}

#[test]
fn an_unchanged_world_gives_an_equal_status() {
    let mut m = model();
    let pods = [crash_looping_pod("a", "boom")];
    let d = support::deployment(&m, 1, 1, 0);
    let first = observe(&m, &d, &pods, None, at(100));
    m.status = Some(first.clone());
    let again = observe(&m, &d, &pods, None, at(500));
    assert_eq!(again, first, "times of unchanged conditions and failures are kept");
}

#[test]
fn transition_times_move_only_on_transitions() {
    let mut m = model();
    let d = support::deployment(&m, 1, 1, 0);
    let first = observe(&m, &d, &[crash_looping_pod("a", "boom")], None, at(100));
    m.status = Some(first);
    // Still crash looping, with other last words: a new message, the same transition time.
    let second = observe(&m, &d, &[crash_looping_pod("a", "bang")], None, at(200));
    assert!(condition(&second, "Ready").message.contains("bang"));
    assert_eq!(
        condition(&second, "Ready").last_transition_time,
        at(100),
        "False both times"
    );
    assert_eq!(
        second.last_failure.clone().unwrap().time,
        at(200),
        "a different failure is a new one"
    );
    m.status = Some(second);
    let d = support::deployment(&m, 1, 1, 1);
    let healed = observe(&m, &d, &[ready_pod("a")], None, at(300));
    assert_eq!(
        condition(&healed, "Ready").last_transition_time,
        at(300),
        "False -> True"
    );
    let failure = healed.last_failure.clone().unwrap();
    assert_eq!(
        failure.reason, "CrashLoopBackOff",
        "the last failure stays after recovery"
    );
    assert_eq!(failure.time, at(200));
}

#[test]
fn an_invalid_spec_keeps_what_was_observed_and_says_why() {
    let mut m = model();
    let d = support::deployment(&m, 1, 1, 1);
    let ok = observe(&m, &d, &[ready_pod("a")], None, at(100));
    m.status = Some(ok.clone());
    m.metadata.generation = Some(4);
    let problems = vec!["spec.source.uri: unknown scheme 'ftp'".to_string()];
    let s = invalid_spec_status(&m, &problems, at(200));
    assert_eq!(s.observed_generation, Some(4));
    assert_eq!((s.replicas, s.ready_replicas), (1, 1));
    assert_eq!(s.endpoints, ok.endpoints);
    assert_eq!(state(&s, "Ready"), is("False", "InvalidSpec"));
    assert_eq!(state(&s, "Degraded"), is("True", "InvalidSpec"));
    assert!(condition(&s, "Ready").message.contains("unknown scheme 'ftp'"));
    assert_eq!(state(&s, "ModelLoaded"), is("True", "Loaded"), "untouched");
    assert_eq!(s.last_failure.clone().unwrap().reason, "InvalidSpec");
    m.status = Some(s.clone());
    assert_eq!(
        invalid_spec_status(&m, &problems, at(300)),
        s,
        "stable when nothing changed"
    );
}
