//! Model sources in the cluster's S3 endpoint (moto, run by e2e/cluster.sh):
//! buckets and objects created with plain S3 REST calls, and the credentials
//! Secret a model names in `spec.source.credentialsSecret`.
//!
//! moto checks no signature unless its IAM emulation is on, but it treats a
//! request without an `Authorization` header as anonymous, and an anonymous
//! writer may not overwrite an object. So the calls name the test account's
//! key in a SigV4-shaped header whose signature moto does not verify.

use std::path::Path;

use anyhow::{Context, Result, ensure};

use crate::env::Env;

/// Who the requests are from (see the module docs).
const AUTHORIZATION: &str = "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, \
                             SignedHeaders=host, Signature=unverified";

/// The S3 endpoint, as pods reach it.
fn endpoint(env: &Env) -> &str {
    &env.cluster.s3_endpoint
}

/// Creates `bucket` (idempotent: moto answers 200 for a bucket one owns).
pub async fn bucket(env: &Env, bucket: &str) -> Result<()> {
    let response = reqwest::Client::new()
        .put(format!("{}/{bucket}", endpoint(env)))
        .header("authorization", AUTHORIZATION)
        .send()
        .await
        .with_context(|| format!("creating bucket {bucket}"))?;
    ensure!(
        response.status().is_success(),
        "creating bucket {bucket}: {}",
        response.status()
    );
    Ok(())
}

/// Puts one object.
pub async fn put(env: &Env, bucket: &str, key: &str, body: Vec<u8>) -> Result<()> {
    let response = reqwest::Client::new()
        .put(format!("{}/{bucket}/{key}", endpoint(env)))
        .header("authorization", AUTHORIZATION)
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .with_context(|| format!("putting s3://{bucket}/{key}"))?;
    ensure!(
        response.status().is_success(),
        "putting s3://{bucket}/{key}: {}",
        response.status()
    );
    Ok(())
}

/// Uploads the model folder `folder` to `s3://bucket/prefix/`, every file.
pub async fn upload_folder(env: &Env, folder: &Path, bucket: &str, prefix: &str) -> Result<()> {
    let mut pending = vec![folder.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            let relative = path.strip_prefix(folder)?.to_str().context("a UTF-8 path")?;
            put(env, bucket, &format!("{prefix}/{relative}"), std::fs::read(&path)?).await?;
        }
    }
    Ok(())
}

/// A Secret named `name` whose keys are the environment the server and
/// `nereid-fetch` read S3 credentials and the endpoint from.
pub fn credentials_secret(env: &Env, name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {name}\ntype: Opaque\nstringData:\n  \
         AWS_ACCESS_KEY_ID: testing\n  AWS_SECRET_ACCESS_KEY: testing\n  AWS_REGION: us-east-1\n  \
         AWS_ENDPOINT_URL: {}\n  AWS_ALLOW_HTTP: \"true\"\n",
        endpoint(env)
    )
}
