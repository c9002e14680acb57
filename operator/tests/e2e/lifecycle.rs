//! A spec change rolls the pods; deleting the InferenceModel lets the
//! garbage collector remove everything it owned.

use std::collections::BTreeSet;
use std::fmt::Debug;

use anyhow::{Result, bail};
use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::ListParams;
use kube::{Api, Resource};
use nereid_operator::builders::labels;
use serde::de::DeserializeOwned;

use crate::env::Env;
use crate::models;
use crate::wait::{self, LONG};

const NAMESPACE: &str = "lifecycle";

pub async fn run(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    models::apply(env, NAMESPACE, &models::manifest("rolling", 2, models::SMALL_CPU)).await?;
    models::ready(env, NAMESPACE, "rolling", 2).await?;
    let before: BTreeSet<String> = models::running_pods(env, NAMESPACE, "rolling", 2)
        .await?
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();

    // A config change (the batch size) changes the pod template through the
    // ConfigMap's hash: new pods replace every old one.
    models::merge_patch(env, NAMESPACE, "rolling", r#"{"spec":{"config":{"maxBatchSize":16}}}"#).await?;
    wait::until("the rollout to replace every pod", LONG, || async {
        let pods = models::pods(env, NAMESPACE, "rolling").await?;
        let names: BTreeSet<String> = pods.iter().filter_map(|p| p.metadata.name.clone()).collect();
        let running = pods.iter().filter(|p| models::running_and_ready(p)).count();
        if pods.len() != 2 || running != 2 || !names.is_disjoint(&before) {
            bail!("pods {names:?} ({running} running), old ones {before:?}");
        }
        Ok(())
    })
    .await?;
    models::ready(env, NAMESPACE, "rolling", 2).await?;
    let config = Api::<ConfigMap>::namespaced(env.client.clone(), NAMESPACE)
        .get("rolling-config")
        .await?;
    let json = config
        .data
        .unwrap_or_default()
        .remove("config.json")
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_str(&json)?;
    anyhow::ensure!(json["max_batch_size"] == 16, "config.json {json}");

    // Delete: the garbage collector removes the owned objects and their pods.
    env.kubectl(["delete", "-n", NAMESPACE, "nmodel/rolling", "--wait=true"])
        .await?;
    let selector = format!("{}=rolling", labels::MODEL);
    let params = ListParams::default().labels(&selector);
    wait::until("garbage collection of everything rolling owned", LONG, || async {
        let left = [
            ("Deployments", count::<Deployment>(env, &params).await?),
            ("Services", count::<Service>(env, &params).await?),
            ("ConfigMaps", count::<ConfigMap>(env, &params).await?),
            (
                "PodDisruptionBudgets",
                count::<PodDisruptionBudget>(env, &params).await?,
            ),
            ("Pods", count::<Pod>(env, &params).await?),
        ];
        let left: Vec<_> = left.into_iter().filter(|(_, n)| *n > 0).collect();
        if !left.is_empty() {
            bail!("still there: {left:?}");
        }
        Ok(())
    })
    .await
}

/// How many objects of kind `K` in this scenario's namespace match `params`.
async fn count<K>(env: &Env, params: &ListParams) -> Result<usize>
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let objects = Api::<K>::namespaced(env.client.clone(), NAMESPACE)
        .list_metadata(params)
        .await?;
    Ok(objects.items.len())
}
