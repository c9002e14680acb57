//! GPU models: the real scheduler places them only on nodes with
//! `nvidia.com/gpu` capacity (and the GPU taint); one that asks for more GPUs
//! than any node has stays Pending, and its status says why, with the most
//! GPUs any node has free.

use anyhow::{Context, Result, bail, ensure};
use nereid_crds::conditions::reason;

use crate::env::Env;
use crate::models;
use crate::wait::{self, LONG};

const NAMESPACE: &str = "gpu";

pub async fn run(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    let example = env.path("deploy/examples/gpu-model.yaml");
    env.kubectl(["apply", "-n", NAMESPACE, "-f", example.to_str().unwrap_or_default()])
        .await?;
    models::ready(env, NAMESPACE, "resnet50", 1).await?;
    for pod in models::running_pods(env, NAMESPACE, "resnet50", 1).await? {
        let spec = pod.spec.context("pod spec")?;
        let node = spec.node_name.unwrap_or_default();
        ensure!(
            node.starts_with("gpu-"),
            "the GPU pod runs on node {node:?}, not on a GPU node"
        );
        let gpus = spec.containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.as_ref())
            .and_then(|l| l.get("nvidia.com/gpu"))
            .map(|q| q.0.clone());
        ensure!(gpus.as_deref() == Some("1"), "GPU limit {gpus:?}");
    }

    // A pod without GPUs never lands on a GPU node: their taint keeps it off.
    models::apply(env, NAMESPACE, &models::manifest("cpu-only", 2, models::SMALL_CPU)).await?;
    for pod in models::running_pods(env, NAMESPACE, "cpu-only", 2).await? {
        let node = pod.spec.and_then(|s| s.node_name).unwrap_or_default();
        ensure!(node.starts_with("cpu-"), "a CPU model's pod runs on {node:?}");
    }

    // Eight GPUs in one pod: each GPU node has four.
    models::apply(env, NAMESPACE, &models::manifest("too-big", 1, "    gpu: 8\n")).await?;
    let model = wait::until("too-big to report InsufficientGPU", LONG, || async {
        let model = models::get(env, NAMESPACE, "too-big").await?;
        let ready = models::condition(&model, "Ready").context("no Ready condition")?;
        if ready.reason != reason::INSUFFICIENT_GPU {
            bail!("Ready is {} ({}: {})", ready.status, ready.reason, ready.message);
        }
        Ok(model)
    })
    .await?;
    let ready = models::condition(&model, "Ready").context("Ready")?;
    ensure!(ready.status == "False", "Ready {ready:?}");
    // The scheduler's own words: "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, ..."
    ensure!(
        ready.message.contains("Insufficient nvidia.com/gpu") && ready.message.contains("nodes are available"),
        "Ready message {:?}",
        ready.message
    );
    // And how far it is from fitting: every GPU node has four, one of them
    // runs resnet50's pod.
    ensure!(
        ready
            .message
            .contains("each pod asks for 8 nvidia.com/gpu; the most any node has free is 4 (node "),
        "Ready message {:?} does not give the free GPUs",
        ready.message
    );
    let degraded = models::condition(&model, "Degraded").context("Degraded")?;
    ensure!(
        degraded.status == "True" && degraded.reason == reason::INSUFFICIENT_GPU,
        "{degraded:?}"
    );
    let pods = models::pods(env, NAMESPACE, "too-big").await?;
    ensure!(!pods.is_empty(), "no pod was created");
    for pod in pods {
        let status = pod.status.context("pod status")?;
        ensure!(status.phase.as_deref() == Some("Pending"), "phase {:?}", status.phase);
        let scheduled = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "PodScheduled")
            .context("no PodScheduled condition")?;
        ensure!(
            scheduled.status == "False" && scheduled.reason.as_deref() == Some("Unschedulable"),
            "{scheduled:?}"
        );
    }
    Ok(())
}
