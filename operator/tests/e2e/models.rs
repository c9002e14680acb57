//! Helpers the scenarios share: applying InferenceModels and reading back
//! what the operator and the cluster made of them.

use std::net::IpAddr;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use kube::api::ListParams;
use nereid_crds::InferenceModel;
use nereid_operator::builders::labels;

use crate::env::Env;
use crate::wait::{self, LONG};

/// The resources of a small CPU model, as `manifest` takes them.
pub const SMALL_CPU: &str = "    cpu: 500m\n    memory: 256Mi\n";

/// An InferenceModel manifest: `name` from S3, with `replicas` pods each
/// asking for `resources` (YAML lines indented by four spaces).
pub fn manifest(name: &str, replicas: i32, resources: &str) -> String {
    manifest_of(
        name,
        replicas,
        &format!("    uri: s3://e2e-models/{name}\n"),
        resources,
        "",
    )
}

/// The scheduling that puts a model's pods on the process nodes (spec lines).
pub const ON_PROCESS_NODES: &str = "  scheduling:\n    nodeSelector:\n      nereid.dev/process-node: \"true\"\n    \
                                    tolerations:\n    - key: nereid.dev/process-node\n      operator: Exists\n      \
                                    effect: NoSchedule\n";

/// An InferenceModel manifest from its parts: `source` and `resources` are
/// YAML lines indented by four spaces, `extra` more spec lines by two.
pub fn manifest_of(name: &str, replicas: i32, source: &str, resources: &str, extra: &str) -> String {
    format!(
        "apiVersion: serving.nereid.dev/v1alpha1\nkind: InferenceModel\nmetadata:\n  name: {name}\nspec:\n  \
         source:\n{source}  replicas: {replicas}\n  resources:\n{resources}{extra}"
    )
}

/// `kubectl apply` of `yaml` in `namespace`, as a user would.
pub async fn apply(env: &Env, namespace: &str, yaml: &str) -> Result<()> {
    env.kubectl_stdin(["apply", "-n", namespace, "-f", "-"], yaml).await?;
    Ok(())
}

/// `kubectl patch --type=merge` of the InferenceModel `name` with `body`,
/// as a user edits a spec (a `null` removes a field).
pub async fn merge_patch(env: &Env, namespace: &str, name: &str, body: &str) -> Result<()> {
    let resource = format!("nmodel/{name}");
    env.kubectl(["patch", "-n", namespace, &resource, "--type=merge", "-p", body])
        .await?;
    Ok(())
}

pub async fn get(env: &Env, namespace: &str, name: &str) -> Result<InferenceModel> {
    Ok(Api::<InferenceModel>::namespaced(env.client.clone(), namespace)
        .get(name)
        .await?)
}

pub fn condition<'a>(model: &'a InferenceModel, type_: &str) -> Option<&'a Condition> {
    model.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

/// Waits until the model's status says Ready with `replicas` ready replicas,
/// for its latest generation.
pub async fn ready(env: &Env, namespace: &str, name: &str, replicas: i32) -> Result<InferenceModel> {
    wait::until(
        &format!("InferenceModel {namespace}/{name} Ready with {replicas} replicas"),
        LONG,
        || async {
            let model = get(env, namespace, name).await?;
            let status = model.status.as_ref().context("no status yet")?;
            let ready = condition(&model, "Ready").context("no Ready condition yet")?;
            ensure!(
                ready.status == "True"
                    && status.replicas == replicas
                    && status.ready_replicas == replicas
                    && status.observed_generation == model.metadata.generation,
                "Ready={} ({}: {}), replicas {}, ready {}, observed generation {:?} of {:?}",
                ready.status,
                ready.reason,
                ready.message,
                status.replicas,
                status.ready_replicas,
                status.observed_generation,
                model.metadata.generation
            );
            Ok(model)
        },
    )
    .await
}

/// The model's pods that are not being deleted.
pub async fn pods(env: &Env, namespace: &str, name: &str) -> Result<Vec<Pod>> {
    let selector = format!("{}={name}", labels::MODEL);
    let pods = Api::<Pod>::namespaced(env.client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// The ClusterIP of the model's Service (named like the model).
pub async fn cluster_ip(env: &Env, namespace: &str, name: &str) -> Result<IpAddr> {
    Ok(Api::<Service>::namespaced(env.client.clone(), namespace)
        .get(name)
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .with_context(|| format!("the Service {namespace}/{name} has no ClusterIP"))?
        .parse()?)
}

/// The pod's IP.
pub fn pod_ip(pod: &Pod) -> Result<IpAddr> {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .context("no pod IP")?
        .parse()
        .context("the pod IP")
}

/// Whether the pod is Running with its Ready condition True.
pub fn running_and_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return false };
    status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// Waits until the model has exactly `count` pods, all Running and Ready.
pub async fn running_pods(env: &Env, namespace: &str, name: &str, count: usize) -> Result<Vec<Pod>> {
    wait::until(&format!("{count} running pods of {namespace}/{name}"), LONG, || async {
        let pods = pods(env, namespace, name).await?;
        let running = pods.iter().filter(|p| running_and_ready(p)).count();
        if pods.len() != count || running != count {
            bail!("{} pods, {running} running and ready", pods.len());
        }
        Ok(pods)
    })
    .await
}
