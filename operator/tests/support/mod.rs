//! Fixtures shared by the operator's integration tests: InferenceModels,
//! Deployments and Pods built by hand, the way the API server would return them.
#![allow(dead_code)] // each test crate uses a different part

use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use nereid_crds::{InferenceModel, InferenceModelSpec, InferenceModelStatus, ModelSource};
use nereid_operator::context::OperatorConfig;
use nereid_operator::{builders, status};

pub const NAMESPACE: &str = "ml";
pub const NAME: &str = "resnet";

/// A stored InferenceModel (namespace, uid, generation) with `spec`.
pub fn model_with(spec: InferenceModelSpec) -> InferenceModel {
    let mut model = InferenceModel::new(NAME, spec);
    model.metadata.namespace = Some(NAMESPACE.into());
    model.metadata.uid = Some("11111111-2222-3333-4444-555555555555".into());
    model.metadata.generation = Some(3);
    model.metadata.resource_version = Some("100".into());
    model
}

/// The smallest valid model: an S3 source and nothing else.
pub fn model() -> InferenceModel {
    model_with(spec())
}

pub fn spec() -> InferenceModelSpec {
    InferenceModelSpec {
        source: ModelSource {
            uri: "s3://models/resnet".into(),
            ..ModelSource::default()
        },
        ..InferenceModelSpec::default()
    }
}

pub fn config() -> OperatorConfig {
    OperatorConfig {
        server_image: "ghcr.io/nereid/nereid:test".into(),
        field_manager: "nereid-operator".into(),
        cluster_domain: "cluster.local".into(),
        autoscaler: Default::default(),
        gateway: None,
    }
}

/// The status the operator derives from `deployment` and `pods` at `now`,
/// with nothing missing and the [`config`] addresses.
pub fn status_of(model: &InferenceModel, deployment: &Deployment, pods: &[Pod], now: Time) -> InferenceModelStatus {
    let observed = status::Observed {
        deployment: Some(deployment),
        pods,
        ..status::Observed::default()
    };
    status::derive_status(model, &observed, &config(), now)
}

pub fn at(seconds: i64) -> Time {
    Time(Timestamp::from_second(1_800_000_000 + seconds).unwrap())
}

/// The Deployment as built, with a status saying `ready` of `replicas` are
/// ready and the rollout is done (or not, with `updated` < `replicas`).
pub fn deployment(model: &InferenceModel, replicas: i32, updated: i32, ready: i32) -> Deployment {
    let mut d = builders::desired(model, &config()).deployment;
    d.metadata.generation = Some(2);
    d.status = Some(DeploymentStatus {
        observed_generation: Some(2),
        replicas: Some(replicas),
        updated_replicas: Some(updated),
        ready_replicas: Some(ready),
        available_replicas: Some(ready),
        ..DeploymentStatus::default()
    });
    d
}

/// Marks a Deployment's rollout as given up by the Deployment controller.
pub fn stalled(mut d: Deployment) -> Deployment {
    let status = d.status.get_or_insert_with(Default::default);
    status.conditions = Some(vec![DeploymentCondition {
        type_: Some("Progressing".into()),
        status: Some("False".into()),
        reason: Some("ProgressDeadlineExceeded".into()),
        message: Some("ReplicaSet \"resnet-abc\" has timed out progressing.".into()),
        ..DeploymentCondition::default()
    }]);
    d
}

/// A pod of the model named `name`, with the server container in `state`.
pub fn pod(name: &str, server: ContainerStatus) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(name.into());
    pod.metadata.namespace = Some(NAMESPACE.into());
    pod.status = Some(PodStatus {
        phase: Some("Running".into()),
        container_statuses: Some(vec![server]),
        ..PodStatus::default()
    });
    pod
}

pub fn container(name: &str, state: ContainerState, ready: bool, started: bool) -> ContainerStatus {
    ContainerStatus {
        name: name.into(),
        image: "ghcr.io/nereid/nereid:test".into(),
        image_id: String::new(),
        ready,
        started: Some(started),
        restart_count: 0,
        state: Some(state),
        ..ContainerStatus::default()
    }
}

pub fn running_since(started_at: Time) -> ContainerState {
    ContainerState {
        running: Some(ContainerStateRunning {
            started_at: Some(started_at),
        }),
        ..ContainerState::default()
    }
}

pub fn waiting(reason: &str, message: &str) -> ContainerState {
    ContainerState {
        waiting: Some(ContainerStateWaiting {
            reason: Some(reason.into()),
            message: Some(message.into()),
        }),
        ..ContainerState::default()
    }
}

/// A ready, serving pod.
pub fn ready_pod(name: &str) -> Pod {
    pod(name, container("nereid-server", running_since(at(0)), true, true))
}

/// A pod whose server crash-loops, last exiting with `message`.
pub fn crash_looping_pod(name: &str, message: &str) -> Pod {
    let mut status = container(
        "nereid-server",
        waiting("CrashLoopBackOff", "back-off 40s restarting failed container"),
        false,
        false,
    );
    status.restart_count = 4;
    status.last_state = Some(ContainerState {
        terminated: Some(ContainerStateTerminated {
            exit_code: 1,
            reason: Some("Error".into()),
            message: Some(message.into()),
            ..ContainerStateTerminated::default()
        }),
        ..ContainerState::default()
    });
    pod(name, status)
}

/// A pod whose `model-fetch` init container the kubelet cannot create
/// because its environment names a Secret that does not exist; `message` is
/// the kubelet's (`secret "name" not found`).
pub fn missing_secret_pod(name: &str, message: &str) -> Pod {
    let mut pod = pod(
        name,
        container("nereid-server", waiting("PodInitializing", ""), false, false),
    );
    let status = pod.status.as_mut().unwrap();
    status.phase = Some("Pending".into());
    status.init_container_statuses = Some(vec![container(
        "model-fetch",
        waiting("CreateContainerConfigError", message),
        false,
        false,
    )]);
    pod
}

/// A pod the scheduler could not place, with its message.
pub fn unschedulable_pod(name: &str, message: &str) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(name.into());
    pod.metadata.namespace = Some(NAMESPACE.into());
    pod.status = Some(PodStatus {
        phase: Some("Pending".into()),
        conditions: Some(vec![PodCondition {
            type_: "PodScheduled".into(),
            status: "False".into(),
            reason: Some("Unschedulable".into()),
            message: Some(message.into()),
            ..PodCondition::default()
        }]),
        ..PodStatus::default()
    });
    pod
}
