//! The model the serving scenarios share: the `simple` example (Triton's
//! add/sub) in the cluster's S3 endpoint, served as `serving/simple` by two
//! pods on the process nodes. Whichever scenario runs first deploys it; the
//! others find it in place.

use anyhow::Result;
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
    let source = format!("    uri: s3://{BUCKET}/{name}\n    credentialsSecret: {CREDENTIALS}\n");
    models::manifest_of(name, replicas, &source, SMALL_CPU, ON_PROCESS_NODES)
}

/// The namespace, the bucket and the credentials Secret (idempotent).
pub async fn prepare(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    s3::bucket(env, BUCKET).await?;
    models::apply(env, NAMESPACE, &s3::credentials_secret(env, CREDENTIALS)).await
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
