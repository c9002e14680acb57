//! Serving through change: a spec change rolls the pods, and a pod is
//! deleted, both while a client sends continuously to the ready endpoints.
//! Not one request may fail: the zero-unavailable rollout, readiness on the
//! model's endpoint, the preStop pause and the server's drain make it so.

use std::collections::BTreeSet;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;

use crate::env::Env;
use crate::inference;
use crate::models;
use crate::simple_model::{self, MODEL, NAMESPACE};
use crate::traffic::Traffic;
use crate::wait::{self, LONG};

/// A config change rolls both pods while a client sends.
pub async fn spec_change(env: &Env) -> Result<()> {
    let (before, _) = simple_model::deployed(env).await?;
    let old = names(&before);

    // A config change rolls every pod, one at a time.
    let traffic = Traffic::start(env, NAMESPACE, MODEL, MODEL).await?;
    models::merge_patch(env, NAMESPACE, MODEL, r#"{"spec":{"config":{"maxBatchSize":4}}}"#).await?;
    let after = wait::until("the rollout to replace both pods", LONG, || async {
        let pods = models::pods(env, NAMESPACE, MODEL).await?;
        let ready = pods.iter().filter(|p| models::running_and_ready(p)).count();
        if pods.len() != 2 || ready != 2 || !names(&pods).is_disjoint(&old) {
            bail!("pods {:?} ({ready} ready), old ones {old:?}", names(&pods));
        }
        Ok(pods)
    })
    .await?;
    models::ready(env, NAMESPACE, MODEL, 2).await?;
    let new = names(&after);
    // Until the new pods have served, the old ones may still be draining.
    wait::until("the new pods to take traffic", LONG, || async {
        let served = traffic.served_by().await;
        ensure!(
            new.iter().all(|pod| served.contains_key(pod)),
            "served by {served:?}, new pods {new:?}"
        );
        Ok(())
    })
    .await?;
    let tally = traffic.stop().await;
    tally.no_failures("the rollout")?;
    ensure!(
        old.iter().any(|pod| tally.served_by.contains_key(pod)),
        "the old pods {old:?} served nothing during the rollout: {:?}",
        tally.served_by
    );
    Ok(())
}

/// A pod deleted under load: the other keeps serving, the Deployment
/// replaces the deleted one, and the replacement serves.
pub async fn pod_deletion(env: &Env) -> Result<()> {
    let (before, ports) = simple_model::deployed(env).await?;
    let traffic = Traffic::start(env, NAMESPACE, MODEL, MODEL).await?;
    let victim = before[0].metadata.name.clone().unwrap_or_default();
    let survivor = before[1].metadata.name.clone().unwrap_or_default();
    env.kubectl(["delete", "pod", "-n", NAMESPACE, &victim, "--wait=false"])
        .await?;
    let after = wait::until("the deleted pod to be gone and replaced", LONG, || async {
        let pods = models::pods(env, NAMESPACE, MODEL).await?;
        let gone = Api::<Pod>::namespaced(env.client.clone(), NAMESPACE)
            .get_opt(&victim)
            .await?
            .is_none();
        let ready = pods.iter().filter(|p| models::running_and_ready(p)).count();
        if !gone || pods.len() != 2 || ready != 2 {
            bail!("deleted pod gone: {gone}; pods {:?} ({ready} ready)", names(&pods));
        }
        Ok(pods)
    })
    .await?;
    let replacement = after
        .iter()
        .find(|p| p.metadata.name.as_deref() != Some(survivor.as_str()))
        .context("no replacement pod")?;
    let replacement_name = replacement.metadata.name.clone().unwrap_or_default();
    wait::until("the replacement to take traffic", LONG, || async {
        let served = traffic.served_by().await;
        ensure!(served.contains_key(&replacement_name), "served by {served:?}");
        Ok(())
    })
    .await?;
    let tally = traffic.stop().await;
    tally.no_failures("the pod's deletion")?;
    ensure!(
        tally.served_by.contains_key(&survivor),
        "the surviving pod served nothing: {tally:?}"
    );
    let ip = models::pod_ip(replacement)?;
    inference::add_sub(&inference::client(), ip, ports.http, MODEL, 7).await?;
    Ok(())
}

fn names(pods: &[Pod]) -> BTreeSet<String> {
    pods.iter().filter_map(|p| p.metadata.name.clone()).collect()
}
