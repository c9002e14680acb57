//! ModelEnsembles with real pods, in both placements, over two member
//! InferenceModels served from the cluster's S3 endpoint (builtin backends:
//! `adder`, add_sub over FP32 [4], and `echo`, identity over FP32 [4]):
//!
//! - applied before their members, they deploy nothing and say which
//!   members are missing; once the members are Ready, they become Ready;
//! - their pods answer the DAG's arithmetic (the `remote` pod by calling
//!   the members' pods through nereid-gateway, the `colocated` pod with the
//!   members fetched into it), directly and through the gateway;
//! - `kubectl scale` scales an ensemble's pods as a model's;
//! - deleting a member makes both report it, by name and step.

use std::net::IpAddr;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Api;
use nereid_crds::ModelEnsemble;
use serde_json::{Value, json};

use crate::env::{Env, OPERATOR_NAMESPACE, RELEASE};
use crate::models::{self, ON_PROCESS_NODES, SMALL_CPU};
use crate::s3;
use crate::wait::{self, LONG};

const NAMESPACE: &str = "ensembles";
const BUCKET: &str = "e2e-ensembles";
const CREDENTIALS: &str = "s3-credentials";
const ENSEMBLES: [(&str, &str); 2] = [("via-remote", "remote"), ("in-one-pod", "colocated")];

const ADDER: &str = r#"name: "adder"
backend: "add_sub"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] } ]
"#;
const ECHO: &str = r#"name: "echo"
backend: "identity"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
"#;

pub async fn run(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    s3::bucket(env, BUCKET).await?;
    models::apply(env, NAMESPACE, &s3::credentials_secret(env, CREDENTIALS)).await?;
    for (name, config) in [("adder", ADDER), ("echo", ECHO)] {
        upload_member(env, name, config).await?;
    }

    // First the ensembles: nothing to deploy without members.
    for (name, placement) in ENSEMBLES {
        models::apply(env, NAMESPACE, &ensemble_manifest(name, placement)).await?;
    }
    for (name, _) in ENSEMBLES {
        let ensemble = condition_is(env, name, "MembersReady", "False", "MemberMissing").await?;
        let message = &condition(&ensemble, "MembersReady")?.message;
        ensure!(
            message.contains("InferenceModel 'adder' (step 'sum') does not exist")
                && message.contains("InferenceModel 'echo' (step 'copy') does not exist"),
            "{name}: {message}"
        );
        let deployment = Api::<Deployment>::namespaced(env.client.clone(), NAMESPACE)
            .get_opt(name)
            .await?;
        ensure!(deployment.is_none(), "{name} deployed before its members existed");
    }

    // Then the members; the ensembles follow them to Ready.
    for member in ["adder", "echo"] {
        let source = format!("    uri: s3://{BUCKET}/{member}\n    credentialsSecret: {CREDENTIALS}\n");
        let manifest = models::manifest_of(member, 1, &source, SMALL_CPU, ON_PROCESS_NODES);
        models::apply(env, NAMESPACE, &manifest).await?;
    }
    let mut members_ready = Vec::new();
    for member in ["adder", "echo"] {
        let model = models::ready(env, NAMESPACE, member, 1).await?;
        let ready = models::condition(&model, "Ready").context("Ready")?;
        members_ready.push(ready.last_transition_time.clone());
    }
    for (name, placement) in ENSEMBLES {
        let ensemble = condition_is(env, name, "Ready", "True", "Available").await?;
        let ready = condition(&ensemble, "Ready")?;
        ensure!(
            members_ready.iter().all(|m| ready.last_transition_time >= *m),
            "{name} was Ready before its members"
        );
        let status = ensemble.status.as_ref().context("status")?;
        ensure!(
            status.members.as_deref() == Some("2/2") && status.ready.as_deref() == Some("1/1"),
            "{name}: {status:?}"
        );
        // Its pod answers the DAG.
        let ip = ensemble_pod_ip(env, name).await?;
        for seed in 0..3 {
            check_arithmetic(&format!("http://{ip}:8000"), name, seed)
                .await
                .with_context(|| format!("{name} ({placement})"))?;
        }
    }
    // The colocated pod fetched both members; the remote one holds only configs.
    ensure!(
        init_containers(env, "via-remote").await? == ["model-configs"],
        "via-remote fetches nothing"
    );
    ensure!(
        init_containers(env, "in-one-pod").await? == ["model-configs", "model-fetch-0", "model-fetch-1"],
        "in-one-pod fetches both members"
    );
    // The gateway routes an ensemble like a model.
    let gateway = gateway_ip(env).await?;
    check_arithmetic(&format!("http://{gateway}:8000"), "via-remote", 7)
        .await
        .context("the remote ensemble through the gateway")?;

    // The scale subresource, as for a model: two ensemble pods.
    env.kubectl(["scale", "modelensemble", "via-remote", "-n", NAMESPACE, "--replicas=2"])
        .await?;
    models::running_pods(env, NAMESPACE, "via-remote", 2).await?;
    wait::until("via-remote 2/2 ready", LONG, || async {
        let ensemble = get(env, "via-remote").await?;
        let ready = ensemble.status.and_then(|s| s.ready);
        ensure!(ready.as_deref() == Some("2/2"), "ready {ready:?}");
        Ok(())
    })
    .await?;

    // A member goes away: both ensembles say which, with its step.
    env.kubectl(["delete", "inferencemodel", "echo", "-n", NAMESPACE, "--wait=false"])
        .await?;
    for (name, _) in ENSEMBLES {
        let ensemble = condition_is(env, name, "MembersReady", "False", "MemberMissing").await?;
        let message = &condition(&ensemble, "MembersReady")?.message;
        ensure!(
            message.contains("InferenceModel 'echo' (step 'copy') does not exist in namespace 'ensembles'"),
            "{name}: {message}"
        );
        ensure!(condition(&ensemble, "Ready")?.status == "False", "{name} still Ready");
    }

    for (name, _) in ENSEMBLES {
        env.kubectl(["delete", "modelensemble", name, "-n", NAMESPACE, "--wait=false"])
            .await?;
    }
    env.kubectl(["delete", "inferencemodel", "adder", "-n", NAMESPACE, "--wait=false"])
        .await?;
    Ok(())
}

/// A member model folder (a config and an empty version 1) in the bucket.
async fn upload_member(env: &Env, name: &str, config: &str) -> Result<()> {
    let folder = env.scratch(&format!("ensemble-{name}"));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(folder.join("1"))?;
    std::fs::write(folder.join("config.pbtxt"), config)?;
    // Object storage has no empty folders: version 1 needs a file.
    std::fs::write(folder.join("1/README"), "builtin backend: no model file\n")?;
    s3::upload_folder(env, &folder, BUCKET, name).await
}

/// A, B -> adder -> (sum, diff); sum -> echo -> SUM; outputs SUM and DIFF.
fn ensemble_manifest(name: &str, placement: &str) -> String {
    let tensor = |name: &str| format!("  - {{name: {name}, datatype: FP32, dims: [4]}}\n");
    format!(
        "apiVersion: serving.nereid.dev/v1alpha1\nkind: ModelEnsemble\nmetadata:\n  name: {name}\nspec:\n  \
         placement: {placement}\n  inputs:\n{}{}  outputs:\n{}{}  steps:\n  \
         - {{name: sum, model: adder, inputMap: {{INPUT0: A, INPUT1: B}}, outputMap: {{OUTPUT0: total, OUTPUT1: DIFF}}}}\n  \
         - {{name: copy, model: echo, inputMap: {{INPUT0: total}}, outputMap: {{OUTPUT0: SUM}}}}\n  \
         resources:\n{SMALL_CPU}{ON_PROCESS_NODES}",
        tensor("A"),
        tensor("B"),
        tensor("SUM"),
        tensor("DIFF"),
    )
}

/// The init containers of the ensemble's pods.
async fn init_containers(env: &Env, name: &str) -> Result<Vec<String>> {
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), NAMESPACE)
        .get(name)
        .await?;
    let spec = deployment.spec.template.spec.context("pod spec")?;
    Ok(spec
        .init_containers
        .unwrap_or_default()
        .into_iter()
        .map(|c| c.name)
        .collect())
}

async fn get(env: &Env, name: &str) -> Result<ModelEnsemble> {
    Ok(Api::<ModelEnsemble>::namespaced(env.client.clone(), NAMESPACE)
        .get(name)
        .await?)
}

fn condition<'a>(ensemble: &'a ModelEnsemble, type_: &str) -> Result<&'a Condition> {
    ensemble
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == type_))
        .with_context(|| format!("no {type_} condition"))
}

/// Waits until the ensemble's `type_` condition has `status` and `reason`.
async fn condition_is(env: &Env, name: &str, type_: &str, status: &str, reason: &str) -> Result<ModelEnsemble> {
    wait::until(
        &format!("ModelEnsemble {name}: {type_} {status} ({reason})"),
        LONG,
        || async {
            let ensemble = get(env, name).await?;
            let c = condition(&ensemble, type_)?;
            ensure!(
                c.status == status && c.reason == reason,
                "{type_} is {} ({}: {})",
                c.status,
                c.reason,
                c.message
            );
            Ok(ensemble)
        },
    )
    .await
}

/// The IP of the ensemble's running, ready pod.
async fn ensemble_pod_ip(env: &Env, name: &str) -> Result<IpAddr> {
    let pods = models::running_pods(env, NAMESPACE, name, 1).await?;
    models::pod_ip(&pods[0])
}

/// The chart's gateway pod's IP.
async fn gateway_ip(env: &Env) -> Result<IpAddr> {
    let pods = Api::<k8s_openapi::api::core::v1::Pod>::namespaced(env.client.clone(), OPERATOR_NAMESPACE)
        .list(&kube::api::ListParams::default().labels("app.kubernetes.io/component=gateway"))
        .await?;
    let pod = pods
        .items
        .iter()
        .find(|p| p.metadata.deletion_timestamp.is_none() && models::running_and_ready(p))
        .with_context(|| format!("no ready gateway pod of release {RELEASE}"))?;
    models::pod_ip(pod)
}

/// Infers with the ensemble at `base`: SUM = A + B, DIFF = A - B.
async fn check_arithmetic(base: &str, ensemble: &str, seed: i32) -> Result<()> {
    let a: Vec<f32> = (0..4).map(|i| (seed * 10 + i) as f32).collect();
    let b: Vec<f32> = (0..4).map(|i| (i * 3) as f32 - 2.5).collect();
    let request = json!({"inputs": [
        {"name": "A", "shape": [1, 4], "datatype": "FP32", "data": a},
        {"name": "B", "shape": [1, 4], "datatype": "FP32", "data": b},
    ]});
    let url = format!("{base}/v2/models/{ensemble}/infer");
    let answer = crate::inference::client().post(&url).json(&request).send().await?;
    let status = answer.status();
    let body: Value = answer.json().await?;
    if !status.is_success() {
        bail!("POST {url}: {status}: {body}");
    }
    let output = |name: &str| -> Result<Vec<f64>> {
        body["outputs"]
            .as_array()
            .and_then(|o| o.iter().find(|t| t["name"] == name))
            .and_then(|t| t["data"].as_array())
            .with_context(|| format!("no {name} in {body}"))?
            .iter()
            .map(|v| v.as_f64().context("a number"))
            .collect()
    };
    let sum: Vec<f64> = a.iter().zip(&b).map(|(x, y)| f64::from(x + y)).collect();
    let difference: Vec<f64> = a.iter().zip(&b).map(|(x, y)| f64::from(x - y)).collect();
    ensure!(output("SUM")? == sum, "SUM of {url}: {body}");
    ensure!(output("DIFF")? == difference, "DIFF of {url}: {body}");
    Ok(())
}
