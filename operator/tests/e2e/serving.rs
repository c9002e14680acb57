//! Models that really serve: fetched from the cluster's S3 endpoint by the
//! pods' init container, loaded by `nereid-server` processes on the process
//! nodes, answering inference on their pod IPs, and the status filled from
//! what those pods say.

use std::net::IpAddr;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::api::ListParams;
use nereid_operator::builders::deployment::SERVER_CONTAINER;

use crate::env::Env;
use crate::inference::{self, MODEL_FOLDER};
use crate::models;
use crate::s3;
use crate::simple_model::{self, BUCKET, MODEL, NAMESPACE};
use crate::traffic;
use crate::wait::{self, LONG};
use crate::workspace::POD_CIDR;

/// Whether `ip` is in the process nodes' pod range (a /16).
fn in_pod_range(ip: IpAddr) -> bool {
    let prefix: Vec<&str> = POD_CIDR.split('.').take(2).collect();
    ip.to_string().split('.').take(2).eq(prefix)
}

pub async fn run(env: &Env) -> Result<()> {
    let (pods, ports) = simple_model::deployed(env).await?;
    let http = inference::client();
    let mut ips = Vec::new();
    for (n, pod) in pods.iter().enumerate() {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.as_deref())
            .unwrap_or_default();
        ensure!(node.starts_with("proc-"), "pod on {node:?}, not a process node");
        let ip = models::pod_ip(pod)?;
        ensure!(in_pod_range(ip), "pod IP {ip} outside {POD_CIDR}");
        for seed in 0..3 {
            inference::add_sub(&http, ip, ports.http, MODEL, n as i32 * 10 + seed).await?;
        }
        ips.push(ip);
    }

    // The status's versions come from the pods themselves.
    wait::until("status.loadedVersions from the pods", LONG, || async {
        let model = models::get(env, NAMESPACE, MODEL).await?;
        let versions = model.status.map(|s| s.loaded_versions).unwrap_or_default();
        ensure!(versions == ["1"], "loadedVersions {versions:?}");
        Ok(())
    })
    .await?;

    // The endpointslice controller lists both pods, ready: it reads the
    // Ready condition the process nodes' probes set.
    wait::until("both pods ready in the EndpointSlices", LONG, || async {
        let slices = Api::<EndpointSlice>::namespaced(env.client.clone(), NAMESPACE)
            .list(&ListParams::default().labels(&format!("kubernetes.io/service-name={MODEL}")))
            .await?;
        let mut ready: Vec<IpAddr> = traffic::ready_endpoints(&slices.items)
            .into_iter()
            .map(|e| e.ip)
            .collect();
        ready.sort();
        let mut want = ips.clone();
        want.sort();
        ensure!(ready == want, "ready endpoints {ready:?}, pods {want:?}");
        Ok(())
    })
    .await?;

    // Each pod's metrics port counts the requests it served, under Triton's names.
    for ip in &ips {
        let served = inference::requests_served(&http, *ip, ports.metrics, MODEL).await?;
        ensure!(
            served >= 3.0,
            "{ip}: nv_inference_request_success {served}, 3 requests were sent"
        );
    }
    Ok(())
}

/// A model whose file is not an ONNX model: the server exits with its reason
/// (`--exit-on-error`), the kubelet stand-in keeps it as the termination
/// message and restarts it with back-off, and the status says LoadFailed
/// with the server's own words.
pub async fn load_failed(env: &Env) -> Result<()> {
    const NAME: &str = "broken";
    simple_model::prepare(env).await?;
    let config = std::fs::read_to_string(env.path(&format!("{MODEL_FOLDER}/config.pbtxt")))?
        .replace("name: \"simple\"", &format!("name: \"{NAME}\""));
    s3::put(env, BUCKET, &format!("{NAME}/config.pbtxt"), config.into_bytes()).await?;
    s3::put(
        env,
        BUCKET,
        &format!("{NAME}/1/model.onnx"),
        b"not an ONNX model".to_vec(),
    )
    .await?;
    models::apply(env, NAMESPACE, &simple_model::manifest(NAME, 1)).await?;

    let message = wait::until("LoadFailed with the server's reason and restarts", LONG, || async {
        let model = models::get(env, NAMESPACE, NAME).await?;
        let loaded = models::condition(&model, "ModelLoaded").context("no ModelLoaded condition")?;
        ensure!(
            loaded.status == "False" && loaded.reason == "LoadFailed",
            "ModelLoaded {} ({}): {}",
            loaded.status,
            loaded.reason,
            loaded.message
        );
        let pods = models::pods(env, NAMESPACE, NAME).await?;
        let restarts = pods
            .iter()
            .flat_map(|p| {
                p.status
                    .as_ref()
                    .and_then(|s| s.container_statuses.clone())
                    .unwrap_or_default()
            })
            .find(|c| c.name == SERVER_CONTAINER)
            .map_or(0, |c| c.restart_count);
        if restarts < 2 {
            bail!("the server restarted {restarts} times");
        }
        Ok(loaded.message.clone())
    })
    .await?;
    // The server's own words: the model, and ONNX Runtime's complaint.
    ensure!(
        message.contains(&format!("failed to load '{NAME}'")) && message.to_lowercase().contains("protobuf"),
        "the status does not carry the server's reason: {message}"
    );
    let ready = models::condition(&models::get(env, NAMESPACE, NAME).await?, "Ready")
        .map(|c| c.status.clone())
        .unwrap_or_default();
    ensure!(ready == "False", "a model that cannot load is Ready={ready}");
    // A crash loop costs CPU the other scenarios need.
    env.kubectl(["delete", "-n", NAMESPACE, &format!("nmodel/{NAME}"), "--wait=true"])
        .await?;
    Ok(())
}
