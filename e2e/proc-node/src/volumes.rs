//! A pod's volumes as folders under its root: emptyDir as an empty folder,
//! configMap and secret volumes as one file per key, and the projected
//! service-account volume (token from the TokenRequest API, the cluster's
//! CA, the namespace). A missing ConfigMap or Secret that is not optional
//! is an error naming it, as the kubelet's would be.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath, Pod, Secret, ServiceAccount, Volume};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use crate::plan::Addresses;

/// Materialises every volume of `pod` under `root/volumes/<name>`.
pub async fn materialise(
    client: &Client,
    pod: &Pod,
    root: &Path,
    addresses: Addresses,
) -> Result<BTreeMap<String, PathBuf>> {
    let namespace = pod.namespace().unwrap_or_default();
    let mut dirs = BTreeMap::new();
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        let dir = root.join("volumes").join(&volume.name);
        tokio::fs::create_dir_all(&dir).await?;
        fill(client, pod, &namespace, volume, &dir, addresses)
            .await
            .with_context(|| format!("volume '{}'", volume.name))?;
        dirs.insert(volume.name.clone(), dir);
    }
    Ok(dirs)
}

async fn fill(
    client: &Client,
    pod: &Pod,
    namespace: &str,
    volume: &Volume,
    dir: &Path,
    addresses: Addresses,
) -> Result<()> {
    if volume.empty_dir.is_some() {
        return Ok(());
    }
    if let Some(cm) = &volume.config_map {
        let data = config_map(client, namespace, &cm.name, cm.optional.unwrap_or(false)).await?;
        return write_keys(dir, &data, cm.items.as_deref()).await;
    }
    if let Some(secret) = &volume.secret {
        let name = secret.secret_name.clone().unwrap_or_default();
        let data = secret_data(client, namespace, &name, secret.optional.unwrap_or(false)).await?;
        return write_keys(dir, &data, secret.items.as_deref()).await;
    }
    if let Some(projected) = &volume.projected {
        for source in projected.sources.iter().flatten() {
            if let Some(token) = &source.service_account_token {
                let value = token_for(client, pod, namespace, token.expiration_seconds).await?;
                write(dir, &token.path, value.as_bytes()).await?;
            }
            if let Some(cm) = &source.config_map {
                let data = config_map(client, namespace, &cm.name, cm.optional.unwrap_or(false)).await?;
                write_keys(dir, &data, cm.items.as_deref()).await?;
            }
            if let Some(secret) = &source.secret {
                let data = secret_data(client, namespace, &secret.name, secret.optional.unwrap_or(false)).await?;
                write_keys(dir, &data, secret.items.as_deref()).await?;
            }
            if let Some(downward) = &source.downward_api {
                for item in downward.items.iter().flatten() {
                    if let Some(field) = &item.field_ref {
                        let value = crate::plan::field(pod, &field.field_path, addresses)?;
                        write(dir, &item.path, value.as_bytes()).await?;
                    }
                }
            }
        }
        return Ok(());
    }
    if volume.persistent_volume_claim.is_some() {
        bail!("persistentVolumeClaim volumes are not supported by the process node");
    }
    bail!("this volume type is not supported by the process node (emptyDir, configMap, secret, projected are)")
}

/// A ConfigMap's keys and values (text and binary), empty when optional and missing.
pub async fn config_map(
    client: &Client,
    namespace: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await? {
        Some(cm) => {
            let mut out: BTreeMap<String, Vec<u8>> = cm
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, v.into_bytes()))
                .collect();
            out.extend(
                cm.binary_data
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, ByteString(v))| (k, v)),
            );
            Ok(out)
        }
        None if optional => Ok(BTreeMap::new()),
        None => bail!("configmap \"{name}\" not found"),
    }
}

/// A Secret's keys and values, empty when optional and missing.
pub async fn secret_data(
    client: &Client,
    namespace: &str,
    name: &str,
    optional: bool,
) -> Result<BTreeMap<String, Vec<u8>>> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    match api.get_opt(name).await? {
        Some(secret) => {
            // (The API server folds stringData into data; it never returns it.)
            Ok(secret
                .data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, ByteString(v))| (k, v))
                .collect())
        }
        None if optional => Ok(BTreeMap::new()),
        None => bail!("secret \"{name}\" not found"),
    }
}

async fn write_keys(dir: &Path, data: &BTreeMap<String, Vec<u8>>, items: Option<&[KeyToPath]>) -> Result<()> {
    match items {
        Some(items) => {
            for item in items {
                let value = data
                    .get(&item.key)
                    .with_context(|| format!("key '{}' not found", item.key))?;
                write(dir, &item.path, value).await?;
            }
        }
        None => {
            for (key, value) in data {
                write(dir, key, value).await?;
            }
        }
    }
    Ok(())
}

async fn write(dir: &Path, relative: &str, value: &[u8]) -> Result<()> {
    if relative.starts_with('/') || relative.split('/').any(|p| p == "..") {
        bail!("path '{relative}' must stay inside the volume");
    }
    let path = dir.join(relative);
    if let Some(parent) = path.parent() {
        tokio::fs::create_dir_all(parent).await?;
    }
    tokio::fs::write(&path, value)
        .await
        .with_context(|| format!("writing {}", path.display()))
}

/// A token for the pod's service account, bound to the pod (TokenRequest).
pub async fn token_for(client: &Client, pod: &Pod, namespace: &str, expiration: Option<i64>) -> Result<String> {
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(expiration.unwrap_or(3607).max(600)),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.uid(),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let issued = api
        .create_token_request(&account, &PostParams::default(), &request)
        .await
        .with_context(|| format!("a token for service account {namespace}/{account}"))?;
    issued
        .status
        .and_then(|s| s.token)
        .context("the TokenRequest came back without a token")
}
