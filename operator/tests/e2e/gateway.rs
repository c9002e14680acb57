//! nereid-gateway as the chart deploys it: a real pod on a process node that
//! discovers the InferenceModels and their EndpointSlices with the chart's
//! read-only RBAC. Triton's own Python client calls it for two models in two
//! namespaces over both protocols; then one gRPC connection's requests
//! follow a model from one replica to three (counted by each pod's own
//! statistics API), deleting a pod under that load fails no request, and
//! neither does rolling every pod to a new model version, nor a canary's
//! promotion and another's rollback.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use nereid_operator::builders::service::{self, Ports};
use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::inference::model_infer_request::InferInputTensor;
use nereid_proto::inference::{InferTensorContents, ModelInferRequest};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

use crate::env::{Env, OPERATOR_NAMESPACE, RELEASE};
use crate::inference;
use crate::models::{self, ON_PROCESS_NODES, SMALL_CPU};
use crate::s3;
use crate::simple_model::{self, BUCKET};
use crate::traffic::Tally;
use crate::wait::{self, LONG};

/// The namespace of the model that scales; the other model is the shared
/// `serving/simple`.
const NAMESPACE: &str = "gateway";
/// The `simple` example under another name, so each model has a name of
/// its own and a plain name finds it.
const MODEL: &str = "adder";
const CREDENTIALS: &str = "s3-credentials";

pub async fn run(env: &Env) -> Result<()> {
    simple_model::deployed(env).await?;
    deploy_adder(env).await?;
    let adder = models::ready(env, NAMESPACE, MODEL, 1).await?;
    let ports = service::ports(&adder);
    let gateway = pod_ip(env).await?;

    tritonclient(env, gateway).await?;

    // One connection, many requests: a Service would pin them all to one pod.
    let channel = Channel::from_shared(format!("http://{gateway}:8001"))?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
        .context("connecting to the gateway's gRPC port")?;
    let load = Load::start(GrpcInferenceServiceClient::new(channel.clone()));
    let result = async {
        scale_and_delete(env, &ports, &load).await?;
        new_version(env, &load).await?;
        canary(env, &load, &channel).await
    }
    .await;
    let tally = load.stop().await;
    result?;
    tally.no_failures(
        "scaling, a pod deletion, a new model version and a canary's promotion and rollback, through the gateway",
    )
}

/// Issue 45's rollout: version 2 of `adder` is uploaded and the spec asks
/// for it while the gateway load runs. Every pod is replaced, one at a
/// time (maxUnavailable 0), by one that serves version 2, and the load,
/// counted by the caller, loses no request.
async fn new_version(env: &Env, load: &Load) -> Result<()> {
    let old: Vec<String> = models::running_pods(env, NAMESPACE, MODEL, 3)
        .await?
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let folder = env.scratch(MODEL);
    s3::put(
        env,
        BUCKET,
        &format!("{MODEL}/2/model.onnx"),
        std::fs::read(folder.join("1/model.onnx"))?,
    )
    .await?;
    models::merge_patch(
        env,
        NAMESPACE,
        MODEL,
        r#"{"spec":{"source":{"version":{"specific":[2]}}}}"#,
    )
    .await?;
    let answered = load.ok.load(Ordering::Relaxed);
    let api: Api<nereid_crds::InferenceModel> = Api::namespaced(env.client.clone(), NAMESPACE);
    wait::until("every pod replaced by one serving version 2", LONG, || async {
        let pods = models::pods(env, NAMESPACE, MODEL).await?;
        let ready: Vec<&str> = pods
            .iter()
            .filter(|p| models::running_and_ready(p))
            .filter_map(|p| p.metadata.name.as_deref())
            .collect();
        ensure!(
            pods.len() == 3 && ready.len() == 3 && ready.iter().all(|p| !old.iter().any(|o| o == p)),
            "pods ready {ready:?} of {}, old ones {old:?}",
            pods.len()
        );
        let versions = api
            .get(MODEL)
            .await?
            .status
            .map(|s| s.loaded_versions)
            .unwrap_or_default();
        ensure!(versions == ["2"], "loadedVersions {versions:?}");
        Ok(())
    })
    .await?;
    ensure!(
        load.ok.load(Ordering::Relaxed) > answered,
        "no request was answered during the rollout"
    );
    println!(
        "e2e: adder rolled to version 2 under the gateway load: pods {old:?} replaced, {} answered during it",
        load.ok.load(Ordering::Relaxed) - answered
    );
    Ok(())
}

/// Issue 45's canary, while the load runs: version 1 as a canary at 20 %
/// gets 20 % +- 5 % of 2,000 requests through the gateway and both
/// revisions show in the status; it is promoted (the spec asks for version
/// 1, the canary goes); then a canary of version 2 is rolled back. The load,
/// counted by the caller, loses no request through either.
async fn canary(env: &Env, load: &Load, channel: &Channel) -> Result<()> {
    let api: Api<nereid_crds::InferenceModel> = Api::namespaced(env.client.clone(), NAMESPACE);
    let mut client = GrpcInferenceServiceClient::new(channel.clone());
    let source = |version: i32| {
        serde_json::json!({"uri": format!("s3://{BUCKET}/{MODEL}"), "credentialsSecret": CREDENTIALS,
                           "version": {"specific": [version]}})
    };
    let patch =
        |body: serde_json::Value| async move { models::merge_patch(env, NAMESPACE, MODEL, &body.to_string()).await };
    patch(serde_json::json!({"spec": {"canary": {"source": source(1), "trafficPercent": 20}}})).await?;
    canary_ready(&api).await?;
    // The gateway follows the canary's EndpointSlice within seconds.
    wait::until("the gateway to route to the canary", Duration::from_secs(30), || {
        let mut client = client.clone();
        async move {
            for seed in 0..20 {
                if add_sub(&mut client, MODEL, seed).await? == "1" {
                    return Ok(());
                }
            }
            bail!("20 requests, none answered by version 1")
        }
    })
    .await?;
    let mut by_version: BTreeMap<String, u32> = BTreeMap::new();
    for seed in 0..2000 {
        *by_version
            .entry(add_sub(&mut client, MODEL, 100_000 + seed).await?)
            .or_default() += 1;
    }
    let to_canary = by_version.get("1").copied().unwrap_or(0);
    println!("e2e: a canary at 20 % answered {to_canary} of 2000 requests through the gateway: {by_version:?}");
    ensure!(
        (300..=500).contains(&to_canary) && by_version.len() == 2,
        "a canary at 20 % answered {by_version:?} of 2000 requests, not 400 +- 100"
    );
    wait::until("both revisions' request counts in the status", LONG, || async {
        let status = api.get(MODEL).await?.status.unwrap_or_default();
        let counted: Vec<(String, String, Option<i64>)> = status
            .revisions
            .iter()
            .map(|r| (r.name.clone(), r.ready.clone(), r.requests))
            .collect();
        ensure!(
            counted.len() == 2 && status.revisions.iter().all(|r| r.requests.unwrap_or(0) > 0),
            "revisions {counted:?}"
        );
        println!("e2e: status.revisions (name, ready, requests): {counted:?}");
        Ok(())
    })
    .await?;

    // Promotion: the canary's source becomes the spec's.
    let answered = load.ok.load(Ordering::Relaxed);
    patch(serde_json::json!({"spec": {"source": source(1), "canary": null}})).await?;
    serving_only(env, &api, "1").await?;
    ensure!(
        load.ok.load(Ordering::Relaxed) > answered,
        "no request was answered during the promotion"
    );

    // Rollback: a canary of version 2 goes again.
    patch(serde_json::json!({"spec": {"canary": {"source": source(2), "trafficPercent": 50}}})).await?;
    canary_ready(&api).await?;
    let answered = load.ok.load(Ordering::Relaxed);
    patch(serde_json::json!({"spec": {"canary": null}})).await?;
    serving_only(env, &api, "1").await?;
    for seed in 0..50 {
        let version = add_sub(&mut client, MODEL, 200_000 + seed).await?;
        ensure!(version == "1", "version {version} answered after the rollback");
    }
    println!(
        "e2e: canary promoted and another rolled back under the gateway load, {} answered meanwhile",
        load.ok.load(Ordering::Relaxed) - answered
    );
    Ok(())
}

/// Waits for the `CanaryReady` condition and the canary revision ready.
async fn canary_ready(api: &Api<nereid_crds::InferenceModel>) -> Result<()> {
    wait::until("the canary to be ready", LONG, || async {
        let status = api.get(MODEL).await?.status.unwrap_or_default();
        let condition = status.conditions.iter().find(|c| c.type_ == "CanaryReady");
        ensure!(
            condition.is_some_and(|c| c.status == "True"),
            "CanaryReady {condition:?}, revisions {:?}",
            status.revisions
        );
        Ok(())
    })
    .await
}

/// Waits until the canary's Deployment is gone, no revision is listed, and
/// the model's three pods serve only `version`.
async fn serving_only(env: &Env, api: &Api<nereid_crds::InferenceModel>, version: &str) -> Result<()> {
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), NAMESPACE);
    wait::until(
        &format!("only version {version} to be served, by 3 pods"),
        LONG,
        || async {
            let canary = deployments.get_opt(&format!("{MODEL}-canary")).await?;
            let model = api.get(MODEL).await?;
            let current = model.status.as_ref().and_then(|s| s.observed_generation) == model.metadata.generation;
            let status = model.status.unwrap_or_default();
            let rolled = status
                .conditions
                .iter()
                .any(|c| c.type_ == "Progressing" && c.reason == "RolloutComplete");
            let ready = models::pods(env, NAMESPACE, MODEL)
                .await?
                .iter()
                .filter(|p| models::running_and_ready(p))
                .count();
            ensure!(
                current
                    && rolled
                    && canary.is_none()
                    && status.revisions.is_empty()
                    && status.loaded_versions == [version]
                    && ready == 3,
                "status current: {current}, rollout complete: {rolled}; canary Deployment left: {}; revisions {:?}; \
             loadedVersions {:?}; {ready} pods ready",
                canary.is_some(),
                status.revisions,
                status.loaded_versions
            );
            Ok(())
        },
    )
    .await
}

/// `adder`: the `simple` folder renamed, in the shared bucket, one replica.
async fn deploy_adder(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    models::apply(env, NAMESPACE, &s3::credentials_secret(env, CREDENTIALS)).await?;
    simple_model::upload_as(env, MODEL).await?;
    let source = format!("    uri: s3://{BUCKET}/{MODEL}\n    credentialsSecret: {CREDENTIALS}\n");
    let manifest = models::manifest_of(MODEL, 1, &source, SMALL_CPU, ON_PROCESS_NODES);
    models::apply(env, NAMESPACE, &manifest).await
}

/// The chart's gateway Deployment available, and its pod's IP.
pub async fn pod_ip(env: &Env) -> Result<IpAddr> {
    let name = format!("{RELEASE}-gateway");
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    wait::until("the chart's gateway to be available", LONG, || async {
        let deployment = deployments.get(&name).await?;
        let available = deployment
            .status
            .as_ref()
            .and_then(|s| s.available_replicas)
            .unwrap_or(0);
        ensure!(available >= 1, "{name}: {available} available");
        let selector = "app.kubernetes.io/component=gateway";
        let ready: Vec<Pod> = pods
            .list(&ListParams::default().labels(selector))
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && models::running_and_ready(p))
            .collect();
        match ready.first() {
            Some(pod) => models::pod_ip(pod),
            None => bail!("no ready gateway pod"),
        }
    })
    .await
}

/// Triton's Python client against the gateway, as a Triton user would call
/// it: both models by their plain names over gRPC and HTTP, each answer
/// checked, and the repository index listing both.
async fn tritonclient(env: &Env, gateway: IpAddr) -> Result<()> {
    const SCRIPT: &str = r#"
import sys
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

gateway = sys.argv[1]
a = np.arange(16, dtype=np.int32).reshape(1, 16)
b = np.full((1, 16), 3, dtype=np.int32)
for module, url in ((grpcclient, gateway + ":8001"), (httpclient, gateway + ":8000")):
    client = module.InferenceServerClient(url=url)
    assert client.is_server_live() and client.is_server_ready(), url
    for model in ("adder", "simple"):
        assert client.is_model_ready(model), (url, model)
        inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer(model, inputs)
        assert (result.as_numpy("OUTPUT0") == a + b).all(), (url, model, result.as_numpy("OUTPUT0"))
        assert (result.as_numpy("OUTPUT1") == a - b).all(), (url, model, result.as_numpy("OUTPUT1"))
index = grpcclient.InferenceServerClient(url=gateway + ":8001").get_model_repository_index(as_json=True)
names = sorted(m["name"] for m in index["models"])
assert "adder" in names and "simple" in names, index
print("tritonclient: both models answered through the gateway over gRPC and HTTP")
"#;
    env.python_client(
        "tritonclient through the gateway",
        60,
        ["-c", SCRIPT, &gateway.to_string()],
    )
    .await
}

/// Scales `adder` from one replica to three while the load runs, waits until
/// every pod has answered its share, then deletes one pod.
async fn scale_and_delete(env: &Env, ports: &Ports, load: &Load) -> Result<()> {
    wait::until("requests to flow through the gateway", LONG, || async {
        ensure!(
            load.ok.load(Ordering::Relaxed) >= 20,
            "{} answered",
            load.ok.load(Ordering::Relaxed)
        );
        Ok(())
    })
    .await?;
    env.kubectl(["scale", "inferencemodel", MODEL, "-n", NAMESPACE, "--replicas=3"])
        .await?;
    models::ready(env, NAMESPACE, MODEL, 3).await?;
    let pods = models::running_pods(env, NAMESPACE, MODEL, 3).await?;
    let before = served(&pods, ports).await?;
    // "Within seconds": the gateway follows the EndpointSlices, so each new
    // pod gets a share of the same connection's requests at once.
    let spread = wait::until(
        "every pod to answer part of one connection's requests",
        Duration::from_secs(30),
        || async {
            let now = served(&pods, ports).await?;
            let gained: BTreeMap<&String, u64> = now
                .iter()
                .map(|(pod, count)| (pod, count - before.get(pod).copied().unwrap_or(0)))
                .collect();
            ensure!(
                gained.values().all(|g| *g >= 20),
                "requests per pod since scaling: {gained:?}"
            );
            Ok(now)
        },
    )
    .await?;
    println!("e2e: one gRPC connection through the gateway, answered per pod: {spread:?}");

    let victim = pods[0].metadata.name.clone().context("a pod name")?;
    env.kubectl(["delete", "pod", "-n", NAMESPACE, &victim, "--wait=false"])
        .await?;
    wait::until("the deleted pod to be gone and replaced", LONG, || async {
        let pods = models::pods(env, NAMESPACE, MODEL).await?;
        let gone = !pods.iter().any(|p| p.metadata.name.as_deref() == Some(victim.as_str()));
        let ready = pods.iter().filter(|p| models::running_and_ready(p)).count();
        ensure!(gone && ready == 3, "deleted pod gone: {gone}; {ready} ready");
        Ok(())
    })
    .await?;
    // Requests keep flowing after the deletion.
    let after = load.ok.load(Ordering::Relaxed);
    wait::until("requests to flow after the deletion", LONG, || async {
        ensure!(load.ok.load(Ordering::Relaxed) >= after + 20, "no progress");
        Ok(())
    })
    .await
}

/// Each pod's `inference_count` for the model, from its statistics API.
async fn served(pods: &[Pod], ports: &Ports) -> Result<BTreeMap<String, u64>> {
    let http = inference::client();
    let mut counts = BTreeMap::new();
    for pod in pods {
        let ip = models::pod_ip(pod)?;
        let url = format!("http://{ip}:{}/v2/models/{MODEL}/stats", ports.http);
        let stats: serde_json::Value = http.get(&url).send().await?.error_for_status()?.json().await?;
        let count = stats["model_stats"][0]["inference_count"]
            .as_u64()
            .with_context(|| format!("no inference_count in {url}: {stats}"))?;
        counts.insert(pod.metadata.name.clone().unwrap_or_default(), count);
    }
    Ok(counts)
}

/// Add/sub requests for `adder` from four senders sharing one gRPC
/// connection, each answer checked.
struct Load {
    stop: CancellationToken,
    senders: Vec<JoinHandle<()>>,
    ok: Arc<AtomicU64>,
    failures: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Load {
    const SENDERS: i32 = 4;

    fn start(client: GrpcInferenceServiceClient<Channel>) -> Load {
        let stop = CancellationToken::new();
        let ok = Arc::new(AtomicU64::new(0));
        let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
        let senders = (0..Self::SENDERS)
            .map(|sender| {
                let (mut client, stop) = (client.clone(), stop.clone());
                let (ok, failures) = (Arc::clone(&ok), Arc::clone(&failures));
                tokio::spawn(async move {
                    let mut seed = sender;
                    while !stop.is_cancelled() {
                        seed += Self::SENDERS;
                        let answer =
                            tokio::time::timeout(Duration::from_secs(10), add_sub(&mut client, MODEL, seed)).await;
                        match answer {
                            Ok(Ok(_)) => {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(Err(error)) => failures.lock().unwrap().push(format!("{error:#}")),
                            Err(_) => failures
                                .lock()
                                .unwrap()
                                .push(format!("request {seed}: no answer in 10 s")),
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                })
            })
            .collect();
        Load {
            stop,
            senders,
            ok,
            failures,
        }
    }

    async fn stop(self) -> Tally {
        self.stop.cancel();
        for sender in self.senders {
            let _ = sender.await;
        }
        let failures = std::mem::take(&mut *self.failures.lock().unwrap());
        Tally {
            ok: self.ok.load(Ordering::Relaxed),
            failed: failures.len() as u64,
            failures: failures.into_iter().take(10).collect(),
            // One connection to the gateway: the pods' own statistics tell
            // who served what.
            served_by: BTreeMap::new(),
        }
    }
}

/// One add/sub inference of `model` (the `simple` example under its name)
/// through the gateway, both outputs checked; the version that answered.
pub async fn add_sub(client: &mut GrpcInferenceServiceClient<Channel>, model: &str, seed: i32) -> Result<String> {
    let a: Vec<i32> = (0..16).map(|i| seed.wrapping_mul(31).wrapping_add(i)).collect();
    let b: Vec<i32> = (0..16).map(|i| i * 7 - seed % 1000).collect();
    let input = |name: &str, values: &[i32]| InferInputTensor {
        name: name.to_string(),
        datatype: "INT32".to_string(),
        shape: vec![1, 16],
        contents: Some(InferTensorContents {
            int_contents: values.to_vec(),
            ..InferTensorContents::default()
        }),
        ..InferInputTensor::default()
    };
    let request = ModelInferRequest {
        model_name: model.to_string(),
        id: seed.to_string(),
        inputs: vec![input("INPUT0", &a), input("INPUT1", &b)],
        ..ModelInferRequest::default()
    };
    let reply = client
        .model_infer(request)
        .await
        .with_context(|| format!("request {seed}"))?
        .into_inner();
    let output = |name: &str| -> Result<Vec<i32>> {
        let index = reply
            .outputs
            .iter()
            .position(|o| o.name == name)
            .with_context(|| format!("request {seed}: no {name}"))?;
        let raw = reply
            .raw_output_contents
            .get(index)
            .with_context(|| format!("request {seed}: no raw {name}"))?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    };
    let sum: Vec<i32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_add(*y)).collect();
    let difference: Vec<i32> = a.iter().zip(&b).map(|(x, y)| x.wrapping_sub(*y)).collect();
    ensure!(
        output("OUTPUT0")? == sum,
        "request {seed}: OUTPUT0 is not INPUT0 + INPUT1"
    );
    ensure!(
        output("OUTPUT1")? == difference,
        "request {seed}: OUTPUT1 is not INPUT0 - INPUT1"
    );
    Ok(reply.model_version)
}
