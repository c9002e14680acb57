//! The pods bound to this runner's nodes, one supervisor each.
//!
//! A pod is admitted when it first shows up bound to one of the nodes: it
//! gets an IP and a root folder, its volumes are made, its init containers
//! run one after the other, then its containers (see `container.rs`). When
//! the pod is deleted (a deletion timestamp appears), every container gets
//! its preStop hook, SIGTERM and, past the grace period, SIGKILL; only when
//! every process is gone is the pod object removed, as a kubelet does.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event as K8sEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::container::{self, ContainerJob, Ending};
use crate::network::PodNetwork;
use crate::plan::{self, PodContext, Refusal};
use crate::status::{ContainerView, PodView, State, now};
use crate::volumes;

/// What the runner needs to know, from its flags.
pub struct RunnerConfig {
    pub client: Client,
    pub bin_dir: PathBuf,
    pub image_pattern: String,
    pub state_dir: PathBuf,
    pub bind_shim: PathBuf,
    pub api_server: String,
    pub api_ca: PathBuf,
    pub network: PodNetwork,
    /// The first CrashLoopBackOff delay (the kubelet's is 10 s), doubled up to 5 minutes.
    pub backoff: Duration,
}

pub struct Runner {
    pub config: RunnerConfig,
    pub http: reqwest::Client,
    pods: Mutex<HashMap<String, Handle>>,
}

struct Handle {
    /// The deadline by which every process must be gone, once deleted.
    delete: watch::Sender<Option<Instant>>,
    task: tokio::task::JoinHandle<()>,
}

impl Runner {
    pub fn new(config: RunnerConfig) -> Self {
        let http = reqwest::Client::builder()
            .danger_accept_invalid_certs(true)
            .no_proxy()
            .build()
            .expect("an HTTP client without a proxy always builds");
        Runner {
            config,
            http,
            pods: Mutex::new(HashMap::new()),
        }
    }

    /// Follows the pods bound to `node` (the `index`-th node) for ever.
    pub async fn watch(self: Arc<Self>, node: String, index: usize) {
        let api: Api<Pod> = Api::all(self.config.client.clone());
        let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
        let mut events = watcher::watcher(api, config).boxed();
        while let Some(event) = events.next().await {
            match event {
                Ok(Event::Apply(pod) | Event::InitApply(pod)) => self.observe(pod, &node, index),
                Ok(Event::Delete(pod)) => self.gone(&pod),
                Ok(Event::Init | Event::InitDone) => {}
                Err(e) => {
                    tracing::warn!(%node, error = %e, "pod watch failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn observe(self: &Arc<Self>, pod: Pod, node: &str, index: usize) {
        let Some(uid) = pod.uid() else { return };
        let mut pods = self.pods.lock().expect("the pod table is never poisoned");
        if pod.metadata.deletion_timestamp.is_some() {
            let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30).max(0) as u64;
            match pods.get(&uid) {
                Some(handle) => {
                    handle.delete.send_if_modified(|deadline| {
                        deadline
                            .is_none()
                            .then(|| *deadline = Some(Instant::now() + Duration::from_secs(grace)))
                            .is_some()
                    });
                }
                // Never started here: nothing to stop.
                None => {
                    drop(pods);
                    tokio::spawn(remove_object(self.config.client.clone(), pod));
                }
            }
            return;
        }
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
        if pods.contains_key(&uid) || phase == "Succeeded" || phase == "Failed" {
            return;
        }
        let (delete, deleted) = watch::channel(None);
        let runner = Arc::clone(self);
        let node = node.to_string();
        let task = tokio::spawn(async move { runner.supervise(pod, node, index, deleted).await });
        pods.insert(uid, Handle { delete, task });
    }

    /// The pod object is gone (force-deleted): stop its processes now.
    fn gone(&self, pod: &Pod) {
        let Some(uid) = pod.uid() else { return };
        if let Some(handle) = self.pods.lock().expect("the pod table is never poisoned").get(&uid) {
            handle.delete.send_replace(Some(Instant::now()));
        }
    }

    /// Stops every pod (at shutdown): SIGTERM, then SIGKILL after 5 s.
    pub async fn stop_all(&self) {
        let handles: Vec<Handle> = self
            .pods
            .lock()
            .expect("the pod table is never poisoned")
            .drain()
            .map(|(_, h)| h)
            .collect();
        for handle in &handles {
            handle
                .delete
                .send_replace(Some(Instant::now() + Duration::from_secs(5)));
        }
        for handle in handles {
            let _ = tokio::time::timeout(Duration::from_secs(15), handle.task).await;
        }
    }

    async fn supervise(
        self: Arc<Self>,
        pod: Pod,
        node: String,
        index: usize,
        deleted: watch::Receiver<Option<Instant>>,
    ) {
        let uid = pod.uid().unwrap_or_default();
        let worker = match Worker::admit(Arc::clone(&self), pod, &node, index, deleted).await {
            Ok(worker) => worker,
            Err(e) => {
                tracing::error!(%uid, error = %format!("{e:#}"), "could not admit a pod");
                return;
            }
        };
        worker.run().await;
        self.config.network.release(index, &uid);
        self.pods.lock().expect("the pod table is never poisoned").remove(&uid);
    }
}

/// Removes the pod object once nothing of it runs (grace 0, this UID only).
async fn remove_object(client: Client, pod: Pod) {
    let api: Api<Pod> = Api::namespaced(client, &pod.namespace().unwrap_or_default());
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.uid(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    if let Err(e) = api.delete(&pod.name_any(), &params).await {
        tracing::debug!(pod = %pod.name_any(), error = %e, "removing the pod object");
    }
}

/// One admitted pod.
pub struct Worker {
    pub runner: Arc<Runner>,
    pub pod: Pod,
    pub root: PathBuf,
    pub view: Mutex<PodView>,
    pub deleted: watch::Receiver<Option<Instant>>,
    recorder: Recorder,
    volumes: Result<std::collections::BTreeMap<String, PathBuf>, String>,
    writes: tokio::sync::Mutex<()>,
}

impl Worker {
    async fn admit(
        runner: Arc<Runner>,
        pod: Pod,
        node: &str,
        index: usize,
        deleted: watch::Receiver<Option<Instant>>,
    ) -> anyhow::Result<Arc<Self>> {
        let uid = pod.uid().unwrap_or_default();
        let ip = runner.config.network.lease(index, &uid)?;
        let root = runner.config.state_dir.join(format!(
            "{}_{}_{uid}",
            pod.namespace().unwrap_or_default(),
            pod.name_any()
        ));
        tokio::fs::create_dir_all(&root).await?;
        let spec = pod.spec.clone().unwrap_or_default();
        let image = |c: &k8s_openapi::api::core::v1::Container| c.image.clone().unwrap_or_default();
        let view = PodView {
            ip,
            host_ip: runner.config.network.node_ip(index),
            start_time: now(),
            init: spec
                .init_containers
                .iter()
                .flatten()
                .map(|c| ContainerView::new(&c.name, &image(c), "PodInitializing"))
                .collect(),
            containers: spec
                .containers
                .iter()
                .map(|c| ContainerView::new(&c.name, &image(c), "ContainerCreating"))
                .collect(),
            initialized: spec.init_containers.as_ref().is_none_or(Vec::is_empty),
            finished: None,
        };
        let volumes = volumes::materialise(&runner.config.client, &pod, &root)
            .await
            .map_err(|e| format!("{e:#}"));
        let recorder = Recorder::new(
            runner.config.client.clone(),
            Reporter {
                controller: "kubelet".into(),
                instance: Some(node.to_string()),
            },
        );
        Ok(Arc::new(Worker {
            runner,
            pod,
            root,
            view: Mutex::new(view),
            deleted,
            recorder,
            volumes,
            writes: tokio::sync::Mutex::new(()),
        }))
    }

    pub fn name(&self) -> String {
        self.pod.name_any()
    }

    /// Changes the view and writes the status.
    pub async fn update(&self, change: impl FnOnce(&mut PodView)) {
        change(&mut self.view.lock().expect("the pod view is never poisoned"));
        self.write_status().await;
    }

    async fn write_status(&self) {
        let _serial = self.writes.lock().await;
        let status = self
            .view
            .lock()
            .expect("the pod view is never poisoned")
            .status(&self.pod);
        let api: Api<Pod> = Api::namespaced(
            self.runner.config.client.clone(),
            &self.pod.namespace().unwrap_or_default(),
        );
        let patch = json!({ "status": status });
        if let Err(e) = api
            .patch_status(&self.name(), &PatchParams::default(), &Patch::Merge(patch))
            .await
        {
            tracing::debug!(pod = %self.name(), error = %e, "writing the pod status");
        }
    }

    pub async fn event(&self, type_: EventType, reason: &str, note: String) {
        let event = K8sEvent {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: reason.to_string(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &self.pod.object_ref(&())).await {
            tracing::debug!(pod = %self.name(), error = %e, "publishing an event");
        }
    }

    /// When the pod must be gone by, once deleted.
    pub fn deadline(&self) -> Option<Instant> {
        *self.deleted.borrow()
    }

    /// Resolves once the pod is being deleted.
    pub async fn deleting(&self) -> Instant {
        let mut deleted = self.deleted.clone();
        loop {
            if let Some(at) = *deleted.borrow_and_update() {
                return at;
            }
            if deleted.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    async fn run(self: Arc<Self>) {
        self.write_status().await;
        let volumes = match &self.volumes {
            Ok(volumes) => volumes.clone(),
            Err(message) => {
                let message = message.clone();
                self.update(|v| {
                    for c in v.init.iter_mut().chain(v.containers.iter_mut()) {
                        c.state = State::waiting("CreateContainerConfigError", Some(message.clone()));
                    }
                })
                .await;
                self.event(EventType::Warning, "Failed", format!("Error: {message}"))
                    .await;
                self.deleting().await;
                self.finish().await;
                return;
            }
        };
        let view = self.view.lock().expect("the pod view is never poisoned").clone();
        let ctx = PodContext {
            client: &self.runner.config.client,
            config: &self.runner.config,
            pod: &self.pod,
            ip: view.ip,
            root: &self.root,
            volumes: &volumes,
        };
        let spec = self.pod.spec.clone().unwrap_or_default();
        let restart_policy = spec.restart_policy.clone().unwrap_or_else(|| "Always".into());

        for (i, init) in spec.init_containers.iter().flatten().enumerate() {
            let plan = match plan::plan(&ctx, init).await {
                Ok(plan) => plan,
                Err(refusal) => {
                    self.refuse(true, i, refusal).await;
                    return;
                }
            };
            let job = ContainerJob {
                worker: Arc::clone(&self),
                index: i,
                init: true,
                spec: init.clone(),
                plan,
                restart_policy: restart_policy.clone(),
            };
            match container::run(job).await {
                Ending::Completed => continue,
                Ending::Failed => {
                    self.update(|v| v.finished = Some("Failed")).await;
                    self.deleting().await;
                    self.finish().await;
                    return;
                }
                Ending::Deleted => {
                    self.finish().await;
                    return;
                }
            }
        }
        self.update(|v| v.initialized = true).await;

        let mut jobs = Vec::new();
        for (i, c) in spec.containers.iter().enumerate() {
            match plan::plan(&ctx, c).await {
                Ok(plan) => jobs.push(ContainerJob {
                    worker: Arc::clone(&self),
                    index: i,
                    init: false,
                    spec: c.clone(),
                    plan,
                    restart_policy: restart_policy.clone(),
                }),
                Err(refusal) => {
                    self.refuse(false, i, refusal).await;
                    return;
                }
            }
        }
        let endings = futures::future::join_all(jobs.into_iter().map(container::run)).await;
        if !endings.contains(&Ending::Deleted) {
            let phase = if endings.iter().all(|e| *e == Ending::Completed) {
                "Succeeded"
            } else {
                "Failed"
            };
            self.update(|v| v.finished = Some(phase)).await;
            self.deleting().await;
        }
        self.finish().await;
    }

    /// A container that cannot start waits, with the reason, until the pod goes.
    async fn refuse(&self, init: bool, index: usize, refusal: Refusal) {
        let (reason, message) = match refusal {
            Refusal::Image(m) => ("ErrImagePull", m),
            Refusal::Config(m) => ("CreateContainerConfigError", m),
        };
        self.update(|v| {
            let list = if init { &mut v.init } else { &mut v.containers };
            list[index].state = State::waiting(reason, Some(message.clone()));
        })
        .await;
        let note = match reason {
            "ErrImagePull" => format!("Failed to pull image: {message}"),
            _ => format!("Error: {message}"),
        };
        self.event(EventType::Warning, "Failed", note).await;
        self.deleting().await;
        self.finish().await;
    }

    /// Every process is gone: the pod object goes too, if it is being deleted.
    async fn finish(&self) {
        if self.deadline().is_some() {
            remove_object(self.runner.config.client.clone(), self.pod.clone()).await;
        }
    }
}
