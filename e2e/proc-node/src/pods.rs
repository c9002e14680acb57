//! The pods bound to this runner's nodes, one supervisor each.
//!
//! A pod is admitted when it first shows up bound to one of the nodes: it
//! gets a network namespace with its IP (see `network.rs`) and a root folder, its volumes are made, its init containers
//! run one after the other, then its containers (see `container.rs`). When
//! the pod is deleted (a deletion timestamp appears), every container gets
//! its preStop hook, SIGTERM and, past the grace period, SIGKILL; only when
//! every process is gone is the pod object removed, as a kubelet does.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{Event as K8sEvent, EventType, Recorder, Reporter};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::json;
use tokio::sync::watch;

use crate::container::{self, ContainerJob, Ending};
use crate::network::{PodNames, PodNetwork};
use crate::plan::{self, Addresses, PodContext, Refusal};
use crate::status::{ContainerView, PodView, State, now};
use crate::volumes;

/// What the runner needs to know, from its flags.
pub struct RunnerConfig {
    pub client: Client,
    pub bin_dir: PathBuf,
    pub image_pattern: String,
    pub state_dir: PathBuf,
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
    /// The node is shutting down: no pod is admitted any more, and stopped
    /// pods keep their objects (a kubelet that stops deletes no pod).
    stopping: AtomicBool,
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
            stopping: AtomicBool::new(false),
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
        if self.stopping.load(Ordering::Acquire) {
            return;
        }
        let mut pods = self.pods.lock().expect("the pod table is never poisoned");
        if pod.metadata.deletion_timestamp.is_some() {
            let grace = pod.metadata.deletion_grace_period_seconds.unwrap_or(30).max(0) as u64;
            match pods.get(&uid) {
                Some(handle) => {
                    // A second, shorter delete brings the deadline forward.
                    let deadline = Instant::now() + Duration::from_secs(grace);
                    handle.delete.send_if_modified(|current| match current {
                        Some(at) if *at <= deadline => false,
                        _ => {
                            *current = Some(deadline);
                            true
                        }
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

    /// Stops every pod (at shutdown): SIGTERM, then SIGKILL after 5 s, all
    /// within 8 s, inside e2e/cluster.sh's 10 s before it kills this node.
    /// Pod objects stay: the cluster goes down with the node.
    pub async fn stop_all(&self) {
        self.stopping.store(true, Ordering::Release);
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
        let tasks = handles.into_iter().map(|h| h.task);
        let _ = tokio::time::timeout(Duration::from_secs(8), futures::future::join_all(tasks)).await;
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    async fn supervise(
        self: Arc<Self>,
        pod: Pod,
        node: String,
        index: usize,
        deleted: watch::Receiver<Option<Instant>>,
    ) {
        let uid = pod.uid().unwrap_or_default();
        match Worker::admit(Arc::clone(&self), pod.clone(), &node, index, deleted.clone()).await {
            Ok(worker) => worker.run().await,
            Err(e) => {
                // Nothing started: the pod waits, unrun, for its deletion.
                tracing::error!(%uid, error = %format!("{e:#}"), "could not admit a pod");
                let mut deleted = deleted;
                while deleted.borrow_and_update().is_none() {
                    if deleted.changed().await.is_err() {
                        break;
                    }
                }
                if !self.stopping() {
                    remove_object(self.config.client.clone(), pod).await;
                }
            }
        }
        self.config.network.detach(index, &uid).await;
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
    pub addresses: Addresses,
    /// The pod's network namespace, which its containers run in.
    pub netns: String,
    pub view: Mutex<PodView>,
    pub deleted: watch::Receiver<Option<Instant>>,
    recorder: Recorder,
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
        let name = pod.name_any();
        let namespace = pod.namespace().unwrap_or_default();
        let names = PodNames {
            name: &name,
            namespace: &namespace,
        };
        let net = runner.config.network.attach(index, &uid, names).await?;
        let root = runner.config.state_dir.join(format!(
            "{}_{}_{uid}",
            pod.namespace().unwrap_or_default(),
            pod.name_any()
        ));
        tokio::fs::create_dir_all(&root).await?;
        let spec = pod.spec.clone().unwrap_or_default();
        let image = |c: &k8s_openapi::api::core::v1::Container| c.image.clone().unwrap_or_default();
        let addresses = Addresses {
            pod: net.ip,
            host: runner.config.network.node_ip(index),
        };
        let view = PodView {
            addresses,
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
            transitions: Default::default(),
        };
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
            addresses,
            netns: net.netns,
            view: Mutex::new(view),
            deleted,
            recorder,
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
        let volumes =
            match volumes::materialise(&self.runner.config.client, &self.pod, &self.root, self.addresses).await {
                Ok(volumes) => volumes,
                Err(e) => {
                    let message = format!("{e:#}");
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
        let ctx = PodContext {
            client: &self.runner.config.client,
            config: &self.runner.config,
            pod: &self.pod,
            addresses: self.addresses,
            netns: &self.netns,
            root: &self.root,
            volumes: &volumes,
        };
        let spec = self.pod.spec.clone().unwrap_or_default();

        for (i, init) in spec.init_containers.iter().flatten().enumerate() {
            let job = match self.job(&ctx, true, i, init).await {
                Ok(job) => job,
                Err(refusal) => return self.refuse(true, i, refusal).await,
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
                    self.ended_by_deletion().await;
                    return;
                }
            }
        }
        if !spec.init_containers.as_ref().is_none_or(Vec::is_empty) {
            self.update(|v| v.initialized = true).await;
        }

        let mut jobs = Vec::new();
        for (i, c) in spec.containers.iter().enumerate() {
            match self.job(&ctx, false, i, c).await {
                Ok(job) => jobs.push(job),
                Err(refusal) => return self.refuse(false, i, refusal).await,
            }
        }
        let endings = futures::future::join_all(jobs.into_iter().map(container::run)).await;
        if endings.contains(&Ending::Deleted) {
            self.ended_by_deletion().await;
            return;
        }
        let phase = if endings.iter().all(|e| *e == Ending::Completed) {
            "Succeeded"
        } else {
            "Failed"
        };
        self.update(|v| v.finished = Some(phase)).await;
        self.deleting().await;
        self.finish().await;
    }

    /// The container `spec` (init or not, the `index`-th) planned to run.
    async fn job(
        self: &Arc<Self>,
        ctx: &PodContext<'_>,
        init: bool,
        index: usize,
        spec: &Container,
    ) -> Result<ContainerJob, Refusal> {
        Ok(ContainerJob {
            worker: Arc::clone(self),
            index,
            init,
            spec: spec.clone(),
            plan: plan::plan(ctx, spec).await?,
        })
    }

    /// Every container stopped for the pod's deletion: as the kubelet does,
    /// the pod ends in a terminal phase before its object goes.
    async fn ended_by_deletion(&self) {
        if !self.runner.stopping() {
            self.update(|v| v.finished = Some(v.terminal_phase())).await;
        }
        self.finish().await;
    }

    /// A container that cannot start waits, with the reason, until the pod goes.
    async fn refuse(&self, init: bool, index: usize, refusal: Refusal) {
        let (reason, message) = match refusal {
            Refusal::Image(m) => ("ErrImagePull", m),
            Refusal::Config(m) => ("CreateContainerConfigError", m),
        };
        self.update(|v| v.container_mut(init, index).state = State::waiting(reason, Some(message.clone())))
            .await;
        let note = match reason {
            "ErrImagePull" => format!("Failed to pull image: {message}"),
            _ => format!("Error: {message}"),
        };
        self.event(EventType::Warning, "Failed", note).await;
        self.deleting().await;
        self.finish().await;
    }

    /// Every process is gone: the pod object goes too, if it is being
    /// deleted (not when the node itself is stopping).
    async fn finish(&self) {
        if self.deadline().is_some() && !self.runner.stopping() {
            remove_object(self.runner.config.client.clone(), self.pod.clone()).await;
        }
    }
}
