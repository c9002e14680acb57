//! The OpenAI-compatible API on real pods: the test suite's text generator
//! (a Python-backend model with the inputs and outputs of Triton's vLLM
//! backend, tests/python_models/text_generator) fetched from S3 by two
//! pods, and the real `openai` client (PyPI) against one pod and against
//! the chart's gateway: models, completions and chats, whole and streamed,
//! the same text both ways and through both endpoints for the same seed,
//! usage that adds up, then 100 concurrent streams through the gateway,
//! which must spread them over both pods.
//!
//! The model needs `tokenizers`, which Nereid's image does not hold; as a
//! Triton user would, its config names an environment that does
//! (`EXECUTION_ENV_PATH`): the test environment scripts/setup.sh made,
//! which the process nodes' pods can read.

use std::collections::BTreeMap;
use std::ffi::OsStr;

use anyhow::{Context, Result, ensure};
use nereid_operator::builders::service;

use crate::env::Env;
use crate::gateway;
use crate::inference;
use crate::models::{self, ON_PROCESS_NODES, SMALL_CPU};
use crate::s3;

const NAMESPACE: &str = "openai";
/// The model's name: an InferenceModel's, so `text_generator` renamed.
const MODEL: &str = "text-generator";
const BUCKET: &str = "e2e-openai";
const CREDENTIALS: &str = "s3-credentials";
/// The model's folder in the repository.
const MODEL_FOLDER: &str = "tests/python_models/text_generator";

pub async fn run(env: &Env) -> Result<()> {
    deploy(env).await?;
    let model = models::ready(env, NAMESPACE, MODEL, 2).await?;
    let ports = service::ports(&model);
    let pods = models::running_pods(env, NAMESPACE, MODEL, 2).await?;
    let ips = pods.iter().map(models::pod_ip).collect::<Result<Vec<_>>>()?;
    let gateway = gateway::pod_ip(env).await?;

    let http = inference::client();
    let served = |ip| inference::requests_served(&http, ip, ports.metrics, MODEL);
    let mut before = BTreeMap::new();
    for ip in &ips {
        // No request yet: the family has no series for the model.
        before.insert(*ip, served(*ip).await.unwrap_or(0.0));
    }

    let client = env.path("operator/tests/e2e/openai_client.py");
    let pod = format!("http://{}:{}", ips[0], ports.http);
    let through = format!("http://{gateway}:8000");
    let args: [&OsStr; 4] = [client.as_os_str(), pod.as_ref(), through.as_ref(), MODEL.as_ref()];
    env.python_client("the openai client", 300, args).await?;

    // The second pod had only the gateway's streams: it must have had some.
    let mut gained = BTreeMap::new();
    for ip in &ips {
        gained.insert(*ip, served(*ip).await? - before[ip]);
    }
    println!("e2e: OpenAI requests answered per pod: {gained:?}");
    ensure!(
        gained[&ips[1]] >= 1.0,
        "the gateway sent none of 100 concurrent streams to the second pod: {gained:?}"
    );
    Ok(())
}

/// The text generator in the bucket under [`MODEL`], its config naming
/// the test environment, served by two pods on the process nodes.
async fn deploy(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    s3::bucket(env, BUCKET).await?;
    models::apply(env, NAMESPACE, &s3::credentials_secret(env, CREDENTIALS)).await?;
    let source = env.path(MODEL_FOLDER);
    let folder = env.scratch(MODEL);
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(folder.join("1"))?;
    std::fs::copy(source.join("1/model.py"), folder.join("1/model.py"))?;
    let config = std::fs::read_to_string(source.join("config.pbtxt"))?;
    let named = "name: \"text_generator\"";
    ensure!(config.contains(named), "the text generator names itself");
    let config = config.replace(named, &format!("name: \"{MODEL}\""));
    let python_env = env.path(".venv");
    let python_env = python_env.to_str().context("a UTF-8 path to .venv")?;
    std::fs::write(
        folder.join("config.pbtxt"),
        format!("{config}parameters {{ key: \"EXECUTION_ENV_PATH\" value: {{ string_value: \"{python_env}\" }} }}\n"),
    )?;
    s3::upload_folder(env, &folder, BUCKET, MODEL).await?;
    let source = format!("    uri: s3://{BUCKET}/{MODEL}\n    credentialsSecret: {CREDENTIALS}\n");
    let manifest = models::manifest_of(MODEL, 2, &source, SMALL_CPU, ON_PROCESS_NODES);
    models::apply(env, NAMESPACE, &manifest).await
}
