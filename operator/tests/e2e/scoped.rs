//! `watchNamespaces`: the chart installed for some namespaces binds the
//! operator's ClusterRole there only (RoleBindings), and its operator pods,
//! told the same namespaces, reconcile their InferenceModels with those
//! rights (their own token: nothing else is granted) and leave every other
//! namespace alone.
//!
//! This release also runs with `autoscaling.autoscaler=keda`: an autoscaled
//! model gets a ScaledObject (KEDA's own CRD is installed; KEDA itself does
//! not run) whose external trigger calls the release's scaler Service, and
//! no HPA of the operator's.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::autoscaling::v2::HorizontalPodAutoscaler;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::Api;
use kube::api::ListParams;

use crate::env::{Env, OPERATOR_NAME, OPERATOR_NAMESPACE};
use crate::models;
use crate::operator;
use crate::wait::{self, LONG};

const RELEASE: &str = "scoped";
const NAMESPACE: &str = "nereid-scoped";
const WATCHED: &str = "team-a";
const UNWATCHED: &str = "team-b";

pub async fn run(env: &Env) -> Result<()> {
    // Nobody else may reconcile from here on: the cluster-wide release stops.
    env.kubectl([
        "scale",
        "-n",
        OPERATOR_NAMESPACE,
        &format!("deployment/{OPERATOR_NAME}"),
        "--replicas=0",
    ])
    .await?;
    wait::until("the cluster-wide operators to be gone", LONG, || async {
        let left = operator::pods(env, OPERATOR_NAMESPACE, crate::env::RELEASE).await?;
        ensure!(left.is_empty(), "{} operator pods left", left.len());
        Ok(())
    })
    .await?;

    env.namespace(NAMESPACE).await?;
    let keda_crd = env.bin.join("keda-crds/keda.sh_scaledobjects.yaml");
    env.kubectl([
        "apply",
        "--server-side",
        "-f",
        keda_crd.to_str().context("a UTF-8 path")?,
    ])
    .await
    .context("installing KEDA's ScaledObject CRD")?;
    let chart = env.path("charts/nereid");
    let values = crate::chart::values(env)?;
    env.helm([
        "install",
        RELEASE,
        chart.to_str().unwrap_or_default(),
        "--namespace",
        NAMESPACE,
        "--values",
        values.to_str().unwrap_or_default(),
        "--set",
        "watchNamespaces={team-a}",
        // The cluster has one external metrics provider: the first release.
        "--set",
        "externalMetrics.enabled=false",
        "--set",
        "autoscaling.autoscaler=keda",
        "--set",
        "keda.enabled=true",
        // The suite calls the service from outside the cluster's KEDA, in plaintext.
        "--set",
        "keda.plaintext=true",
        "--wait",
        "--timeout",
        "180s",
    ])
    .await
    .context("helm install with watchNamespaces")?;
    // The release's operator (it also runs a gateway, whose namespaced
    // RBAC --wait has just seen work: the gateway is ready only once it has
    // listed team-a's models).
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), NAMESPACE)
        .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
        .await?
        .items
        .into_iter()
        .next()
        .context("the scoped release has no Deployment")?;
    let name = deployment.metadata.name.clone().context("name")?;
    let account = deployment
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .context("serviceAccountName")?;

    // Its rights, and its gateway's: a RoleBinding in the watched namespace,
    // nothing elsewhere.
    let bound_in = |account: String, namespace: &'static str| async move {
        let bindings = Api::<RoleBinding>::namespaced(env.client.clone(), namespace)
            .list(&ListParams::default())
            .await?;
        anyhow::Ok(bindings.items.iter().any(|b| {
            b.subjects
                .iter()
                .flatten()
                .any(|s| s.name == account && s.namespace.as_deref() == Some(NAMESPACE))
        }))
    };
    let cluster_bindings = Api::<ClusterRoleBinding>::all(env.client.clone())
        .list(&ListParams::default())
        .await?
        .items;
    for account in [account, format!("{RELEASE}-nereid-gateway")] {
        ensure!(
            bound_in(account.clone(), WATCHED).await?,
            "no RoleBinding for {account} in {WATCHED}"
        );
        ensure!(
            !bound_in(account.clone(), UNWATCHED).await?,
            "a RoleBinding for {account} in {UNWATCHED}"
        );
        let cluster_wide = cluster_bindings
            .iter()
            .any(|b| b.subjects.iter().flatten().any(|s| s.name == account));
        ensure!(!cluster_wide, "{account} is bound cluster-wide");
    }

    wait::until("a scoped operator pod to lead", LONG, || async {
        let replicas = operator::replicas(env, NAMESPACE, RELEASE).await?;
        operator::leader_and_standbys(env, NAMESPACE, &name, replicas).await
    })
    .await?;

    models::apply(env, UNWATCHED, &models::manifest("unwatched", 1, models::SMALL_CPU)).await?;
    models::apply(env, WATCHED, &models::manifest("watched", 1, models::SMALL_CPU)).await?;
    models::ready(env, WATCHED, "watched", 1).await?;
    // Applied first, yet untouched: no status, no Deployment.
    let unwatched = models::get(env, UNWATCHED, "unwatched").await?;
    ensure!(
        unwatched.status.is_none(),
        "the unwatched model got a status: {:?}",
        unwatched.status
    );
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), UNWATCHED)
        .get_opt("unwatched")
        .await?;
    ensure!(deployment.is_none(), "the unwatched model got a Deployment");
    keda_scaled_object(env, &name).await?;

    // And nothing any replica tried was refused.
    for replica in operator::replicas(env, NAMESPACE, RELEASE).await? {
        let text = replica.metrics().await?;
        let errors: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("nereid_operator_reconcile_errors_total"))
            .collect();
        ensure!(errors.is_empty(), "reconcile errors in {}: {errors:?}", replica.name);
    }
    Ok(())
}

/// An autoscaled model in the watched namespace becomes a ScaledObject that
/// points KEDA at this release's External Scaler Service; with
/// minReplicas 0, KEDA takes it to zero after its scaleToZeroAfter.
async fn keda_scaled_object(env: &Env, operator_name: &str) -> Result<()> {
    let autoscaling = "  autoscaling:\n    minReplicas: 0\n    maxReplicas: 3\n    metric: pendingRequests\n    \
                       target: \"4\"\n    scaleToZeroAfter: 2m\n";
    let manifest = models::manifest_of(
        "keda-scaled",
        1,
        "    uri: s3://e2e-models/keda-scaled\n",
        models::SMALL_CPU,
        autoscaling,
    );
    models::apply(env, WATCHED, &manifest).await?;
    let object: serde_json::Value = wait::until("the model's ScaledObject", LONG, || async {
        let json = env
            .kubectl(["get", "scaledobject", "-n", WATCHED, "keda-scaled", "-o", "json"])
            .await?;
        Ok(serde_json::from_str(&json)?)
    })
    .await?;
    let spec = &object["spec"];
    let trigger = &spec["triggers"][0];
    ensure!(
        spec["scaleTargetRef"]["kind"] == "InferenceModel"
            && spec["scaleTargetRef"]["name"] == "keda-scaled"
            && spec["minReplicaCount"] == 0
            && spec["maxReplicaCount"] == 3
            && spec["cooldownPeriod"] == 120
            && trigger["type"] == "external"
            && trigger["metricType"] == "AverageValue"
            && trigger["metadata"]["scalerAddress"] == format!("{operator_name}-keda.{NAMESPACE}:9090")
            && trigger["metadata"]["metric"] == "nereid_pending_requests"
            && trigger["metadata"]["target"] == "4",
        "ScaledObject {object}"
    );
    let owner = &object["metadata"]["ownerReferences"][0];
    ensure!(
        owner["kind"] == "InferenceModel" && owner["controller"] == true,
        "owner {owner}"
    );
    let hpa = Api::<HorizontalPodAutoscaler>::namespaced(env.client.clone(), WATCHED)
        .get_opt("keda-scaled")
        .await?;
    ensure!(hpa.is_none(), "the operator made an HPA too");
    Ok(())
}
