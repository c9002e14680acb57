//! The model the serving scenarios share: the `simple` example (Triton's
//! add/sub) in the cluster's S3 endpoint, served as `serving/simple` by two
//! pods on the process nodes. Whichever scenario runs first deploys it; the
//! others find it in place.

use anyhow::{Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use nereid_operator::builders::service::{self, Ports};

use crate::env::Env;
use crate::inference::MODEL_FOLDER;
use crate::models::{self, ON_PROCESS_NODES, SMALL_CPU};
use crate::s3;

pub const NAMESPACE: &str = "serving";
/// The served model (the `simple` example, under its own name).
pub const MODEL: &str = "simple";
pub const BUCKET: &str = "e2e-serving";
const CREDENTIALS: &str = "s3-credentials";

/// An InferenceModel from `s3://e2e-serving/<name>` on the process nodes.
pub fn manifest(name: &str, replicas: i32) -> String {
    manifest_placed(name, replicas, ON_PROCESS_NODES)
}

/// [`manifest`] with its own `scheduling` (spec lines, as [`ON_PROCESS_NODES`]).
pub fn manifest_placed(name: &str, replicas: i32, scheduling: &str) -> String {
    let source = format!("    uri: s3://{BUCKET}/{name}\n    credentialsSecret: {CREDENTIALS}\n");
    models::manifest_of(name, replicas, &source, SMALL_CPU, scheduling)
}

/// The namespace, the bucket and the credentials Secret (idempotent).
pub async fn prepare(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    s3::bucket(env, BUCKET).await?;
    models::apply(env, NAMESPACE, &s3::credentials_secret(env, CREDENTIALS)).await
}

/// The `simple` example under another name (its folder and its config's
/// `name`), in the bucket at `s3://e2e-serving/<name>`.
pub async fn upload_as(env: &Env, name: &str) -> Result<()> {
    let folder = env.scratch(name);
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(folder.join("1"))?;
    let source = env.path(MODEL_FOLDER);
    std::fs::copy(source.join("1/model.onnx"), folder.join("1/model.onnx"))?;
    let config = std::fs::read_to_string(source.join("config.pbtxt"))?;
    let named = format!("name: \"{MODEL}\"");
    ensure!(config.contains(&named), "the simple example names itself");
    std::fs::write(
        folder.join("config.pbtxt"),
        config.replace(&named, &format!("name: \"{name}\"")),
    )?;
    s3::upload_folder(env, &folder, BUCKET, name).await
}

/// `simple` with two replicas, Ready, and the ports its pods serve on.
pub async fn deployed(env: &Env) -> Result<(Vec<Pod>, Ports)> {
    prepare(env).await?;
    s3::upload_folder(env, &env.path(MODEL_FOLDER), BUCKET, MODEL).await?;
    models::apply(env, NAMESPACE, &manifest(MODEL, 2)).await?;
    let model = models::ready(env, NAMESPACE, MODEL, 2).await?;
    let pods = models::running_pods(env, NAMESPACE, MODEL, 2).await?;
    Ok((pods, service::ports(&model)))
}
