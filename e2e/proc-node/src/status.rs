//! Pod status as a kubelet writes it, from what the runner saw happen:
//! phase, IPs, start time, init and container statuses (state, last state,
//! restart count, readiness) and the Initialized, ContainersReady and Ready
//! conditions (the scheduler's PodScheduled is kept as it is).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus, Pod,
    PodCondition, PodIP, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::plan::Addresses;

pub fn now() -> Time {
    Time(Timestamp::now())
}

/// A container's state, as the runner tracks it.
#[derive(Debug, Clone)]
pub enum State {
    Waiting {
        reason: String,
        message: Option<String>,
    },
    Running {
        started_at: Time,
    },
    Terminated {
        exit_code: i32,
        reason: String,
        message: Option<String>,
        started_at: Option<Time>,
        finished_at: Time,
    },
}

impl State {
    pub fn waiting(reason: &str, message: Option<String>) -> Self {
        State::Waiting {
            reason: reason.to_string(),
            message,
        }
    }

    fn to_k8s(&self) -> ContainerState {
        match self {
            State::Waiting { reason, message } => ContainerState {
                waiting: Some(ContainerStateWaiting {
                    reason: Some(reason.clone()),
                    message: message.clone(),
                }),
                ..ContainerState::default()
            },
            State::Running { started_at } => ContainerState {
                running: Some(ContainerStateRunning {
                    started_at: Some(started_at.clone()),
                }),
                ..ContainerState::default()
            },
            State::Terminated {
                exit_code,
                reason,
                message,
                started_at,
                finished_at,
            } => ContainerState {
                terminated: Some(ContainerStateTerminated {
                    exit_code: *exit_code,
                    reason: Some(reason.clone()),
                    message: message.clone(),
                    started_at: started_at.clone(),
                    finished_at: Some(finished_at.clone()),
                    ..ContainerStateTerminated::default()
                }),
                ..ContainerState::default()
            },
        }
    }
}

/// One container as the runner tracks it.
#[derive(Debug, Clone)]
pub struct ContainerView {
    pub name: String,
    pub image: String,
    pub state: State,
    pub last: Option<State>,
    pub restarts: i32,
    pub ready: bool,
    pub started: bool,
}

impl ContainerView {
    pub fn new(name: &str, image: &str, reason: &str) -> Self {
        ContainerView {
            name: name.to_string(),
            image: image.to_string(),
            state: State::waiting(reason, None),
            last: None,
            restarts: 0,
            ready: false,
            started: false,
        }
    }

    fn to_k8s(&self, pod_uid: &str) -> ContainerStatus {
        ContainerStatus {
            name: self.name.clone(),
            image: self.image.clone(),
            image_id: format!("proc-node://{}", self.image),
            container_id: matches!(self.state, State::Running { .. } | State::Terminated { .. })
                .then(|| format!("proc-node://{pod_uid}/{}/{}", self.name, self.restarts)),
            state: Some(self.state.to_k8s()),
            last_state: self.last.as_ref().map(State::to_k8s),
            ready: self.ready,
            restart_count: self.restarts,
            started: Some(self.started),
            ..ContainerStatus::default()
        }
    }
}

/// Everything the status is made of.
#[derive(Debug, Clone)]
pub struct PodView {
    pub addresses: Addresses,
    pub start_time: Time,
    pub init: Vec<ContainerView>,
    pub containers: Vec<ContainerView>,
    pub initialized: bool,
    /// Set when every container has ended for good (restartPolicy
    /// Never/OnFailure, or the pod's deletion).
    pub finished: Option<&'static str>,
    /// The conditions this node writes: their last status and since when.
    pub transitions: BTreeMap<&'static str, (bool, Time)>,
}

impl PodView {
    pub fn container_mut(&mut self, init: bool, index: usize) -> &mut ContainerView {
        if init {
            &mut self.init[index]
        } else {
            &mut self.containers[index]
        }
    }

    /// The phase once every container has stopped: Succeeded when each
    /// last exited 0, else Failed.
    pub fn terminal_phase(&self) -> &'static str {
        let succeeded = self
            .containers
            .iter()
            .all(|c| matches!(c.state, State::Terminated { exit_code: 0, .. }));
        if succeeded { "Succeeded" } else { "Failed" }
    }

    /// The condition `type_`, its transition time kept while its status holds.
    fn condition(&mut self, type_: &'static str, ok: bool, reason: &str) -> PodCondition {
        let since = match self.transitions.get(type_) {
            Some((was, since)) if *was == ok => since.clone(),
            _ => {
                let since = now();
                self.transitions.insert(type_, (ok, since.clone()));
                since
            }
        };
        PodCondition {
            type_: type_.to_string(),
            status: if ok { "True" } else { "False" }.to_string(),
            reason: (!ok).then(|| reason.to_string()),
            last_transition_time: Some(since),
            ..PodCondition::default()
        }
    }

    pub fn status(&mut self, pod: &Pod) -> PodStatus {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        // As the kubelet's getPhase: once initialized, a pod whose containers
        // have started (running, exited, or waiting to restart) is Running.
        let started = self
            .containers
            .iter()
            .any(|c| !matches!(c.state, State::Waiting { .. }) || c.last.is_some());
        let phase = match self.finished {
            Some(phase) => phase,
            None if self.initialized && started => "Running",
            None => "Pending",
        };
        let all_ready = self.initialized && !self.containers.is_empty() && self.containers.iter().all(|c| c.ready);
        // The scheduler's condition, as it wrote it before binding the pod here.
        let mut conditions: Vec<PodCondition> = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| c.type_ == "PodScheduled")
            .collect();
        conditions.push(self.condition("Initialized", self.initialized, "ContainersNotInitialized"));
        conditions.push(self.condition("ContainersReady", all_ready, "ContainersNotReady"));
        conditions.push(self.condition("Ready", all_ready, "ContainersNotReady"));
        let ip = self.addresses.pod.to_string();
        PodStatus {
            phase: Some(phase.to_string()),
            pod_ip: Some(ip.clone()),
            pod_ips: Some(vec![PodIP { ip }]),
            host_ip: Some(self.addresses.host.to_string()),
            start_time: Some(self.start_time.clone()),
            conditions: Some(conditions),
            init_container_statuses: (!self.init.is_empty())
                .then(|| self.init.iter().map(|c| c.to_k8s(&uid)).collect()),
            container_statuses: Some(self.containers.iter().map(|c| c.to_k8s(&uid)).collect()),
            ..PodStatus::default()
        }
    }
}
