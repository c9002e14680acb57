//! What the process nodes do with pods they cannot run well, as a kubelet
//! would: an image that is not Nereid's waits with ErrImagePull and runs
//! nothing; a container that exits at once crash-loops with back-off; a
//! probe on a port nothing listens on keeps the pod unready, with the
//! probe's failure in an Event. And a gRPC probe (grpc.health.v1, as the
//! kubelet sends it) against the server's gRPC port makes its pod ready,
//! and a pod that asks for a GPU is placed on the process node that has them.

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{ContainerStatus, Event, Pod};
use kube::Api;
use kube::api::ListParams;

use crate::env::{Env, SERVER_IMAGE};
use crate::wait::{self, LONG};

const NAMESPACE: &str = "process-node";

/// The process node `proc-0`, as pod spec lines.
const ON_PROC_0: &str = "  nodeSelector: {kubernetes.io/hostname: proc-0}\n  \
                         tolerations: [{key: nereid.dev/process-node, operator: Exists, effect: NoSchedule}]\n";
/// Any process node with a GPU free (only proc-gpu-0 has them).
const ON_A_GPU_PROCESS_NODE: &str = "  nodeSelector: {nereid.dev/process-node: \"true\"}\n  tolerations:\n  \
                                     - {key: nereid.dev/process-node, operator: Exists, effect: NoSchedule}\n  \
                                     - {key: nvidia.com/gpu, operator: Exists, effect: NoSchedule}\n";

/// A pod placed by `scheduling` (pod spec lines) that the restricted Pod
/// Security Standard admits; `container` is the container's YAML past its
/// name, indented by six spaces.
fn pod(name: &str, image: &str, scheduling: &str, container: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\nspec:\n{scheduling}  automountServiceAccountToken: false\n  \
         terminationGracePeriodSeconds: 5\n  securityContext:\n    runAsNonRoot: true\n    runAsUser: 65532\n    \
         seccompProfile: {{type: RuntimeDefault}}\n  containers:\n    - name: main\n      image: {image}\n      \
         securityContext:\n        allowPrivilegeEscalation: false\n        capabilities: {{drop: [ALL]}}\n{container}"
    )
}

async fn container(env: &Env, name: &str) -> Result<(Pod, ContainerStatus)> {
    let pod = Api::<Pod>::namespaced(env.client.clone(), NAMESPACE).get(name).await?;
    let status = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .cloned()
        .context("no container status yet")?;
    Ok((pod, status))
}

pub async fn run(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    let manifests = [
        pod(
            "not-nereid",
            "busybox:1.36",
            ON_PROC_0,
            "      command: [sleep, \"3600\"]\n",
        ),
        pod(
            "exits-at-once",
            SERVER_IMAGE,
            ON_PROC_0,
            "      command: [nereid-server, --no-such-flag]\n      terminationMessagePolicy: FallbackToLogsOnError\n",
        ),
        pod(
            "probe-on-closed-port",
            SERVER_IMAGE,
            ON_PROC_0,
            "      command: [nereid-server, --model-repository, /repo]\n      volumeMounts: [{name: repo, mountPath: /repo}]\n      \
             readinessProbe: {tcpSocket: {port: 9}, periodSeconds: 1, failureThreshold: 1}\n  \
             volumes: [{name: repo, emptyDir: {}}]\n",
        ),
        pod(
            "grpc-probe",
            SERVER_IMAGE,
            ON_PROC_0,
            "      command: [nereid-server, --model-repository, /repo]\n      volumeMounts: [{name: repo, mountPath: /repo}]\n      \
             readinessProbe: {grpc: {port: 8001}, periodSeconds: 1}\n  \
             volumes: [{name: repo, emptyDir: {}}]\n",
        ),
        pod(
            "gpu-pod",
            SERVER_IMAGE,
            ON_A_GPU_PROCESS_NODE,
            "      command: [nereid-server, --model-repository, /repo]\n      volumeMounts: [{name: repo, mountPath: /repo}]\n      \
             resources: {limits: {nvidia.com/gpu: 1}}\n  volumes: [{name: repo, emptyDir: {}}]\n",
        ),
    ];
    env.kubectl_stdin(["apply", "-n", NAMESPACE, "-f", "-"], &manifests.join("---\n"))
        .await?;

    // Not a Nereid image: waiting with the reason and a message that says why, never started.
    wait::until("not-nereid to wait with ErrImagePull", LONG, || async {
        let (_, c) = container(env, "not-nereid").await?;
        let waiting = c
            .state
            .as_ref()
            .and_then(|s| s.waiting.as_ref())
            .context("not waiting")?;
        ensure!(
            waiting.reason.as_deref() == Some("ErrImagePull")
                && waiting.message.as_deref().unwrap_or_default().contains("busybox:1.36"),
            "waiting: {waiting:?}"
        );
        ensure!(c.restart_count == 0 && c.started != Some(true), "it ran: {c:?}");
        Ok(())
    })
    .await?;

    // Exits at once: restarted with back-off, the exit in the last state.
    wait::until("exits-at-once to crash-loop", LONG, || async {
        let (_, c) = container(env, "exits-at-once").await?;
        let waiting = c.state.as_ref().and_then(|s| s.waiting.as_ref());
        let last = c.last_state.as_ref().and_then(|s| s.terminated.as_ref());
        match (waiting, last) {
            (Some(w), Some(t)) if w.reason.as_deref() == Some("CrashLoopBackOff") && c.restart_count >= 2 => {
                let message = w.message.as_deref().unwrap_or_default();
                ensure!(message.starts_with("back-off "), "the back-off message: {message}");
                ensure!(t.exit_code == 2, "exit code {} (clap's usage error is 2)", t.exit_code);
                let said = t.message.as_deref().unwrap_or_default();
                ensure!(said.contains("--no-such-flag"), "the termination message: {said}");
                Ok(())
            }
            _ => bail!(
                "restarts {}, state {:?}, last {:?}",
                c.restart_count,
                c.state,
                c.last_state
            ),
        }
    })
    .await?;

    // A probe on a closed port: running, never ready, and an Event says why.
    wait::until(
        "probe-on-closed-port to be unready with an Unhealthy event",
        LONG,
        || async {
            let (pod, c) = container(env, "probe-on-closed-port").await?;
            let phase = pod.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
            ensure!(
                phase == "Running" && c.state.as_ref().is_some_and(|s| s.running.is_some()),
                "phase {phase}, {c:?}"
            );
            ensure!(!c.ready, "ready with nothing on the probe's port");
            ensure!(c.restart_count == 0, "the server restarted: {c:?}");
            let events = Api::<Event>::namespaced(env.client.clone(), NAMESPACE)
                .list(&ListParams::default().fields("involvedObject.name=probe-on-closed-port"))
                .await?;
            let unhealthy = events
                .items
                .iter()
                .find(|e| e.reason.as_deref() == Some("Unhealthy"))
                .context("no Unhealthy event yet")?;
            let message = unhealthy.message.as_deref().unwrap_or_default();
            ensure!(message.starts_with("Readiness probe failed:"), "the event: {message}");
            Ok(())
        },
    )
    .await?;

    wait::until("gpu-pod to run on proc-gpu-0", LONG, || async {
        let (pod, c) = container(env, "gpu-pod").await?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        ensure!(node == "proc-gpu-0", "on {node:?}");
        ensure!(
            c.state.as_ref().is_some_and(|s| s.running.is_some()),
            "not running: {c:?}"
        );
        Ok(())
    })
    .await?;

    wait::until("grpc-probe to be ready through its gRPC probe", LONG, || async {
        let (_, c) = container(env, "grpc-probe").await?;
        ensure!(c.ready, "not ready: {c:?}");
        Ok(())
    })
    .await?;

    env.kubectl([
        "delete",
        "pods",
        "--all",
        "-n",
        NAMESPACE,
        "--wait=true",
        "--timeout=60s",
    ])
    .await?;
    Ok(())
}
