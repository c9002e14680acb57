//! What a user sees in kubectl, and the README's "Call your model" steps.
//!
//! - The printed table, as the API server renders it (the Table response
//!   `kubectl get` asks for), for a model that serves (the shared
//!   `serving/simple`, real pods) and for one that cannot start (a missing
//!   Secret): READY x/y, REASON while not Ready, URL; `-o wide` adds more.
//! - `status.url` is the chart gateway's infer URL for the model, and the
//!   Service's addresses stay in `status.endpoints`.
//! - A healthy create makes at most two Events, none with an empty note.
//! - The README's steps for HTTP without a port-forward (`kubectl proxy`,
//!   then curl and tritonclient.http through the API server's proxy to the
//!   model's Service) return an inference from a real pod. The port-forward
//!   steps need a kubelet's streaming API, which the process nodes lack.
//! - A ModelEnsemble with a missing member shows its members and why.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use serde_json::Value;

use crate::env::{Env, OPERATOR_NAMESPACE, RELEASE};
use crate::inference;
use crate::models::{self, ON_PROCESS_NODES, SMALL_CPU};
use crate::simple_model::{self, MODEL, NAMESPACE as SERVING};
use crate::wait::{self, LONG};

const NAMESPACE: &str = "kubectl";

pub async fn run(env: &Env) -> Result<()> {
    simple_model::deployed(env).await?;
    env.namespace(NAMESPACE).await?;

    serving_model_table(env).await?;
    not_ready_model_table(env).await?;
    healthy_create_events(env).await?;
    call_through_kubectl_proxy(env).await?;
    ensemble_table(env).await
}

/// `serving/simple`: 2/2, no reason, the gateway's URL; wide columns too.
async fn serving_model_table(env: &Env) -> Result<()> {
    let gateway_url = format!(
        "http://{RELEASE}-gateway.{OPERATOR_NAMESPACE}.svc.cluster.local:8000/v2/models/{SERVING}%2F{MODEL}/infer"
    );
    let row = wait::until("serving/simple's row", LONG, || async {
        let row = table_row(env, "inferencemodels", SERVING, MODEL).await?;
        ensure!(row["Ready"] == "2/2", "{row:?}");
        Ok(row)
    })
    .await?;
    ensure!(row["Name"] == MODEL, "{row:?}");
    ensure!(row["Reason"].is_empty(), "a Ready model shows no reason: {row:?}");
    ensure!(row["URL"] == gateway_url, "URL {:?}, not {gateway_url}", row["URL"]);
    ensure!(
        row["gRPC"] == format!("{MODEL}.{SERVING}.svc.cluster.local:8001"),
        "{row:?}"
    );
    ensure!(
        row["Current"] == "2" && row["Model URI"].starts_with("s3://"),
        "{row:?}"
    );

    let model = models::get(env, SERVING, MODEL).await?;
    let status = model.status.context("status")?;
    ensure!(status.address.map(|a| a.url) == Some(gateway_url), "status.address.url");
    let endpoints = status.endpoints.context("status.endpoints")?;
    ensure!(
        endpoints.http == format!("http://{MODEL}.{SERVING}.svc.cluster.local:8000"),
        "the Service stays in status.endpoints: {endpoints:?}"
    );

    // What kubectl prints: the default columns, and more with -o wide.
    let text = env.kubectl(["get", "nmodel", MODEL, "-n", SERVING]).await?;
    let header: Vec<&str> = text.lines().next().unwrap_or_default().split_whitespace().collect();
    ensure!(header == ["NAME", "READY", "REASON", "URL", "AGE"], "{text}");
    let wide = env
        .kubectl(["get", "nmodel", MODEL, "-n", SERVING, "-o", "wide"])
        .await?;
    let header = wide.lines().next().unwrap_or_default();
    for column in ["GRPC", "GPUS", "MIN", "MAX", "CURRENT", "MODEL URI"] {
        ensure!(header.contains(column), "-o wide lacks {column}: {wide}");
    }
    Ok(())
}

/// A model whose credentials Secret does not exist: 0/1 and MissingSecret.
/// The operator never reads Secrets; the kubelet says the Secret is missing
/// on the pod, so the pod runs on a process node (KWOK's would not check).
async fn not_ready_model_table(env: &Env) -> Result<()> {
    let source = "    uri: s3://e2e-models/locked\n    credentialsSecret: no-such-secret\n";
    let manifest = models::manifest_of("locked", 1, source, SMALL_CPU, ON_PROCESS_NODES);
    models::apply(env, NAMESPACE, &manifest).await?;
    let row = wait::until("the locked model's row", LONG, || async {
        let row = table_row(env, "inferencemodels", NAMESPACE, "locked").await?;
        ensure!(row["Reason"] == "MissingSecret", "{row:?}");
        Ok(row)
    })
    .await?;
    ensure!(row["Ready"] == "0/1", "{row:?}");
    ensure!(
        row["URL"].ends_with(&format!("/v2/models/{NAMESPACE}%2Flocked/infer")),
        "{row:?}"
    );
    let text = env.kubectl(["get", "nmodel", "locked", "-n", NAMESPACE]).await?;
    let line = text.lines().nth(1).unwrap_or_default();
    let cells: Vec<&str> = line.split_whitespace().collect();
    ensure!(cells.get(1..3) == Some(&["0/1", "MissingSecret"][..]), "{text}");
    Ok(())
}

/// A fresh model on KWOK's nodes goes Ready with at most two Events.
async fn healthy_create_events(env: &Env) -> Result<()> {
    models::apply(env, NAMESPACE, &models::manifest("calm", 1, SMALL_CPU)).await?;
    models::ready(env, NAMESPACE, "calm", 1).await?;
    // Later reconciles (the requeue after a rollout, the pods' last
    // updates) must not add any: look again after they had their chance.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let events = Api::<Event>::namespaced(env.client.clone(), NAMESPACE)
        .list(&ListParams::default())
        .await?
        .items;
    let about: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.regarding
                .as_ref()
                .is_some_and(|r| r.kind.as_deref() == Some("InferenceModel") && r.name.as_deref() == Some("calm"))
        })
        .collect();
    let told: Vec<String> = about
        .iter()
        .map(|e| {
            format!(
                "{}: {}",
                e.reason.as_deref().unwrap_or_default(),
                e.note.as_deref().unwrap_or_default()
            )
        })
        .collect();
    ensure!(
        !about.is_empty() && about.len() <= 2,
        "a healthy create made {} Events: {told:?}",
        about.len()
    );
    for event in &about {
        let note = event.note.as_deref().unwrap_or_default().trim();
        ensure!(
            !note.is_empty() && !note.ends_with(':'),
            "an Event with an empty message: {told:?}"
        );
    }
    println!("e2e: a healthy create's Events: {told:?}");
    Ok(())
}

/// The README's HTTP steps without a port-forward: `kubectl proxy`, then
/// curl (here reqwest) and tritonclient.http through the API server's proxy
/// to the model's Service, answered by a real pod.
async fn call_through_kubectl_proxy(env: &Env) -> Result<()> {
    let proxy = KubectlProxy::start(env)?;
    let prefix = format!(
        "127.0.0.1:{}/api/v1/namespaces/{SERVING}/services/{MODEL}:http/proxy",
        proxy.port
    );
    let http = inference::client();
    for seed in 0..3 {
        inference::add_sub_at(&http, &format!("http://{prefix}"), MODEL, seed).await?;
    }

    const SCRIPT: &str = r#"
import sys
import numpy as np
import tritonclient.http as httpclient

client = httpclient.InferenceServerClient(url=sys.argv[1])
a = np.arange(16, dtype=np.int32).reshape(1, 16)
b = np.full((1, 16), 5, dtype=np.int32)
inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"), httpclient.InferInput("INPUT1", [1, 16], "INT32")]
inputs[0].set_data_from_numpy(a)
inputs[1].set_data_from_numpy(b)
result = client.infer(sys.argv[2], inputs)
assert (result.as_numpy("OUTPUT0") == a + b).all(), result.as_numpy("OUTPUT0")
assert (result.as_numpy("OUTPUT1") == a - b).all(), result.as_numpy("OUTPUT1")
print("tritonclient.http answered through kubectl proxy")
"#;
    env.python_client("tritonclient through kubectl proxy", 60, ["-c", SCRIPT, &prefix, MODEL])
        .await
}

/// An ensemble over `calm` and a model that does not exist: members 1/2,
/// nothing deployed, and the missing member as the reason.
async fn ensemble_table(env: &Env) -> Result<()> {
    let manifest = "apiVersion: serving.nereid.dev/v1alpha1\nkind: ModelEnsemble\nmetadata:\n  name: pair\nspec:\n  \
                    inputs:\n  - {name: \"in\", datatype: FP32, dims: [256]}\n  outputs:\n  - {name: \"out\", datatype: FP32, dims: [256]}\n  \
                    steps:\n  - {name: first, model: calm, inputMap: {INPUT0: \"in\"}, outputMap: {OUTPUT0: mid}}\n  \
                    - {name: second, model: absent, inputMap: {INPUT0: mid}, outputMap: {OUTPUT0: \"out\"}}\n";
    models::apply(env, NAMESPACE, manifest).await?;
    let row = wait::until("the ensemble's row", LONG, || async {
        let row = table_row(env, "modelensembles", NAMESPACE, "pair").await?;
        ensure!(row["Members"] == "1/2", "{row:?}");
        Ok(row)
    })
    .await?;
    ensure!(
        row["Ready"] == "0/1" && row["Placement"] == "remote" && row["Reason"] == "MemberMissing",
        "{row:?}"
    );
    let ensemble = env
        .kubectl(["get", "nensemble", "pair", "-n", NAMESPACE, "-o", "json"])
        .await?;
    let ensemble: Value = serde_json::from_str(&ensemble)?;
    let members = ensemble["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "MembersReady"))
        .context("no MembersReady condition")?;
    let message = members["message"].as_str().unwrap_or_default();
    ensure!(
        members["reason"] == "MemberMissing"
            && message.contains("InferenceModel 'absent' (step 'second') does not exist"),
        "{members}"
    );
    Ok(())
}

/// One object's row of the API server's Table, keyed by column name (every
/// column, `-o wide` ones included); empty cells are "".
async fn table_row(env: &Env, plural: &str, namespace: &str, name: &str) -> Result<BTreeMap<String, String>> {
    let request = http::Request::get(format!(
        "/apis/serving.nereid.dev/v1alpha1/namespaces/{namespace}/{plural}/{name}"
    ))
    .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
    .body(Vec::new())?;
    let table: Value = serde_json::from_str(&env.client.request_text(request).await?)?;
    let columns = table["columnDefinitions"].as_array().context("no columnDefinitions")?;
    let cells = table["rows"][0]["cells"].as_array().context("no row")?;
    ensure!(columns.len() == cells.len(), "{table}");
    Ok(columns
        .iter()
        .zip(cells)
        .map(|(column, cell)| {
            let text = match cell {
                Value::Null => String::new(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (column["name"].as_str().unwrap_or_default().to_string(), text)
        })
        .collect())
}

/// `kubectl proxy` on a free local port, stopped (by its PID) when dropped.
struct KubectlProxy {
    child: Child,
    port: u16,
}

impl KubectlProxy {
    fn start(env: &Env) -> Result<KubectlProxy> {
        let mut child = Command::new(env.bin.join("kubectl"))
            .arg("--kubeconfig")
            .arg(&env.cluster.kubeconfig)
            .args(["proxy", "--port=0"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting kubectl proxy")?;
        let mut line = String::new();
        let stdout = child.stdout.take().context("kubectl proxy's stdout")?;
        BufReader::new(stdout).read_line(&mut line)?;
        // "Starting to serve on 127.0.0.1:PORT"
        let port = line.trim().rsplit(':').next().and_then(|p| p.parse().ok());
        let mut proxy = KubectlProxy { child, port: 0 };
        match port {
            Some(port) => proxy.port = port,
            None => bail!("kubectl proxy said {line:?}"),
        }
        Ok(proxy)
    }
}

impl Drop for KubectlProxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
