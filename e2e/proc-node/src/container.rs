//! One container's life: run its process, probe it, restart it with the
//! kubelet's CrashLoopBackOff back-off, and stop it gracefully when the pod
//! is deleted (preStop, SIGTERM, SIGKILL past the grace period).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, LifecycleHandler, Probe};
use kube::runtime::events::EventType;
use tokio::sync::Notify;

use crate::plan::ContainerPlan;
use crate::pods::Worker;
use crate::process::{self, Running};
use crate::status::{State, now};
use crate::{probe, status};

/// The back-off never grows past this.
const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// A container that ran this long starts its back-off afresh.
const BACKOFF_RESET: Duration = Duration::from_secs(600);

#[derive(Clone)]
pub struct ContainerJob {
    pub worker: Arc<Worker>,
    pub index: usize,
    pub init: bool,
    pub spec: Container,
    pub plan: ContainerPlan,
}

/// How a container's life ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Exited 0 and is not restarted (init containers, restartPolicy Never/OnFailure).
    Completed,
    /// Failed and is not restarted (restartPolicy Never).
    Failed,
    /// The pod is being deleted; the process is gone.
    Deleted,
}

impl ContainerJob {
    async fn set(&self, change: impl FnOnce(&mut status::ContainerView)) {
        let (init, index) = (self.init, self.index);
        self.worker.update(|v| change(v.container_mut(init, index))).await;
    }

    fn restarts(&self, exit_code: i32) -> bool {
        let policy = self.worker.pod.spec.as_ref().and_then(|s| s.restart_policy.as_deref());
        match policy.unwrap_or("Always") {
            "Never" => false,
            "OnFailure" => exit_code != 0,
            // Init containers are never restarted after they succeed.
            _ => !(self.init && exit_code == 0),
        }
    }
}

pub async fn run(job: ContainerJob) -> Ending {
    let mut backoff = job.worker.runner.config.backoff;
    loop {
        if job.worker.deadline().is_some() {
            return Ending::Deleted;
        }
        let started = Instant::now();
        let started_at = now();
        let mut running = match process::spawn(&job.plan) {
            Ok(running) => running,
            Err(e) => {
                let message = format!("{e:#}");
                job.set(|c| c.state = State::waiting("RunContainerError", Some(message.clone())))
                    .await;
                job.worker
                    .event(EventType::Warning, "Failed", format!("Error: {message}"))
                    .await;
                job.worker.deleting().await;
                return Ending::Deleted;
            }
        };
        let has_readiness = job.spec.readiness_probe.is_some();
        let has_startup = job.spec.startup_probe.is_some();
        job.set(|c| {
            c.state = State::Running {
                started_at: started_at.clone(),
            };
            c.started = !has_startup;
            c.ready = !job.init && !has_readiness && !has_startup;
        })
        .await;
        job.worker
            .event(
                EventType::Normal,
                "Started",
                format!("Started container {}", job.spec.name),
            )
            .await;

        let kill = Arc::new(Notify::new());
        let stop = Arc::new(AtomicBool::new(false));
        let probes = (!job.init).then(|| tokio::spawn(probe_loop(job.clone(), Arc::clone(&kill), Arc::clone(&stop))));
        enum Why {
            Exited,
            Kill,
            Delete(Instant),
        }
        let why = tokio::select! {
            _ = running.wait() => Why::Exited,
            () = kill.notified() => Why::Kill,
            deadline = job.worker.deleting() => Why::Delete(deadline),
        };
        stop.store(true, Ordering::Release);
        if let Some(p) = probes {
            p.abort();
        }
        match why {
            Why::Exited => {}
            Why::Kill => stop_process(&mut running, Instant::now() + grace(&job.worker)).await,
            Why::Delete(deadline) => {
                pre_stop(&job, deadline).await;
                stop_process(&mut running, deadline).await;
                let (_, terminated) = exit(&job, &mut running, started_at).await;
                job.set(|c| {
                    c.state = terminated;
                    c.ready = false;
                })
                .await;
                return Ending::Deleted;
            }
        }
        let (exit_code, terminated) = exit(&job, &mut running, started_at).await;
        if !job.restarts(exit_code) {
            job.set(|c| {
                c.state = terminated;
                c.ready = false;
            })
            .await;
            return if exit_code == 0 {
                Ending::Completed
            } else {
                Ending::Failed
            };
        }
        if started.elapsed() >= BACKOFF_RESET {
            backoff = job.worker.runner.config.backoff;
        }
        let pod = job.worker.name();
        let message = format!(
            "back-off {}s restarting failed container={} pod={pod}",
            backoff.as_secs(),
            job.spec.name
        );
        // One write: the exit as the last state, waiting to restart.
        job.set(|c| {
            c.last = Some(terminated);
            c.state = State::waiting("CrashLoopBackOff", Some(message.clone()));
            c.restarts += 1;
            c.ready = false;
        })
        .await;
        job.worker
            .event(
                EventType::Warning,
                "BackOff",
                "Back-off restarting failed container".into(),
            )
            .await;
        tokio::select! {
            () = tokio::time::sleep(backoff) => {}
            _ = job.worker.deleting() => return Ending::Deleted,
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The process's exit as a Terminated state (code, reason, the termination
/// message of this run), once everything it started is gone too.
async fn exit(
    job: &ContainerJob,
    running: &mut Running,
    started_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time,
) -> (i32, State) {
    let status = running.wait().await;
    let exit_code = status.as_ref().map_or(137, process::exit_code);
    let reason = if exit_code == 0 { "Completed" } else { "Error" };
    let fallback = job.spec.termination_message_policy.as_deref() == Some("FallbackToLogsOnError");
    let message = running.termination_message(&job.plan, exit_code != 0, fallback).await;
    let terminated = State::Terminated {
        exit_code,
        reason: reason.to_string(),
        message,
        started_at: Some(started_at),
        finished_at: now(),
    };
    (exit_code, terminated)
}

/// The pod's grace period (from its spec), from now.
fn grace(worker: &Worker) -> Duration {
    let seconds = worker
        .pod
        .spec
        .as_ref()
        .and_then(|s| s.termination_grace_period_seconds)
        .unwrap_or(30);
    Duration::from_secs(seconds.max(0) as u64)
}

/// SIGTERM, then SIGKILL at `deadline` if the process is still there.
async fn stop_process(running: &mut Running, deadline: Instant) {
    running.signal(libc::SIGTERM);
    let kill_at = tokio::time::Instant::from_std(deadline);
    if tokio::time::timeout_at(kill_at, running.wait()).await.is_err() {
        running.signal(libc::SIGKILL);
    }
}

/// The preStop hook, within the grace period.
async fn pre_stop(job: &ContainerJob, deadline: Instant) {
    let Some(hook) = job.spec.lifecycle.as_ref().and_then(|l| l.pre_stop.clone()) else {
        return;
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let _ = tokio::time::timeout(left, run_hook(job, &hook)).await;
}

async fn run_hook(job: &ContainerJob, hook: &LifecycleHandler) {
    if let Some(sleep) = &hook.sleep {
        tokio::time::sleep(Duration::from_secs(sleep.seconds.max(0) as u64)).await;
    } else if hook.http_get.is_some() || hook.exec.is_some() || hook.tcp_socket.is_some() {
        let as_probe = Probe {
            http_get: hook.http_get.clone(),
            exec: hook.exec.clone(),
            tcp_socket: hook.tcp_socket.clone(),
            timeout_seconds: Some(30),
            ..Probe::default()
        };
        let ip = job.worker.addresses.pod;
        let ports = job.spec.ports.clone().unwrap_or_default();
        if let Err(e) = probe::run(&as_probe, ip, &ports, &job.plan, &job.worker.runner.http).await {
            job.worker
                .event(
                    EventType::Warning,
                    "FailedPreStopHook",
                    format!("PreStopHook failed: {e}"),
                )
                .await;
        }
    }
}

/// Startup, then liveness and readiness, each at its period; a failed
/// startup or liveness probe restarts the container (through `kill`).
async fn probe_loop(job: ContainerJob, kill: Arc<Notify>, stop: Arc<AtomicBool>) {
    if let Some(startup) = job.spec.startup_probe.clone() {
        if !watch_probe(&job, &startup, "Startup", &stop, Watch::UntilSuccess).await {
            kill_for(&job, "startup", &kill).await;
            return;
        }
        let readiness = job.spec.readiness_probe.is_some();
        job.set(|c| {
            c.started = true;
            c.ready = !readiness;
        })
        .await;
    }
    let liveness = job.spec.liveness_probe.clone().map(|p| {
        let job = job.clone();
        let stop = Arc::clone(&stop);
        let kill = Arc::clone(&kill);
        async move {
            if !watch_probe(&job, &p, "Liveness", &stop, Watch::UntilFailure).await {
                kill_for(&job, "liveness", &kill).await;
            }
        }
    });
    let readiness = job.spec.readiness_probe.clone().map(|p| {
        let job = job.clone();
        let stop = Arc::clone(&stop);
        async move {
            watch_probe(&job, &p, "Readiness", &stop, Watch::Readiness).await;
        }
    });
    tokio::join!(
        async {
            if let Some(l) = liveness {
                l.await
            }
        },
        async {
            if let Some(r) = readiness {
                r.await
            }
        }
    );
}

async fn kill_for(job: &ContainerJob, which: &str, kill: &Notify) {
    job.worker
        .event(
            EventType::Normal,
            "Killing",
            format!("Container {} failed {which} probe, will be restarted", job.spec.name),
        )
        .await;
    kill.notify_one();
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Watch {
    /// Until the success threshold: true. Failure threshold first: false.
    UntilSuccess,
    /// While it succeeds; false at the failure threshold.
    UntilFailure,
    /// For ever, setting the container's readiness.
    Readiness,
}

async fn watch_probe(job: &ContainerJob, probe: &Probe, kind: &str, stop: &AtomicBool, watch: Watch) -> bool {
    let period = Duration::from_secs(probe.period_seconds.unwrap_or(10).max(1) as u64);
    let success_threshold = probe.success_threshold.unwrap_or(1).max(1);
    let failure_threshold = probe.failure_threshold.unwrap_or(3).max(1);
    tokio::time::sleep(Duration::from_secs(
        probe.initial_delay_seconds.unwrap_or(0).max(0) as u64
    ))
    .await;
    let (mut successes, mut failures) = (0, 0);
    let ports = job.spec.ports.clone().unwrap_or_default();
    let mut ready = false;
    loop {
        if stop.load(Ordering::Acquire) {
            return true;
        }
        let ip = job.worker.addresses.pod;
        match probe::run(probe, ip, &ports, &job.plan, &job.worker.runner.http).await {
            Ok(()) => {
                successes += 1;
                failures = 0;
            }
            Err(why) => {
                failures += 1;
                successes = 0;
                job.worker
                    .event(EventType::Warning, "Unhealthy", format!("{kind} probe failed: {why}"))
                    .await;
            }
        }
        match watch {
            Watch::UntilSuccess if successes >= success_threshold => return true,
            Watch::UntilSuccess | Watch::UntilFailure if failures >= failure_threshold => return false,
            Watch::Readiness => {
                let now_ready = if successes >= success_threshold {
                    true
                } else if failures >= failure_threshold {
                    false
                } else {
                    ready
                };
                if now_ready != ready && !stop.load(Ordering::Acquire) {
                    ready = now_ready;
                    job.set(|c| c.ready = ready).await;
                }
            }
            _ => {}
        }
        tokio::time::sleep(period).await;
    }
}
