//! `watchNamespaces`: the chart installed for some namespaces binds the
//! operator's ClusterRole there only (RoleBindings), and the operator, told
//! the same namespaces, reconciles their InferenceModels with those rights
//! and leaves every other namespace alone.

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding};
use kube::Api;
use kube::api::ListParams;

use crate::env::Env;
use crate::models;
use crate::operator::{Operator, metrics, service_account_kubeconfig};
use crate::wait::{self, LONG};

const RELEASE: &str = "scoped";
const NAMESPACE: &str = "nereid-scoped";
const WATCHED: &str = "team-a";
const UNWATCHED: &str = "team-b";

pub async fn run(env: &Env) -> Result<()> {
    // Nobody else may reconcile from here on.
    env.operators.lock().expect("operators").clear();

    env.namespace(NAMESPACE).await?;
    let chart = env.path("charts/nereid");
    env.helm([
        "install",
        RELEASE,
        chart.to_str().unwrap_or_default(),
        "--namespace",
        NAMESPACE,
        "--set",
        "watchNamespaces={team-a}",
        "--wait",
        "--timeout",
        "180s",
    ])
    .await
    .context("helm install with watchNamespaces")?;
    let deployment = Api::<Deployment>::namespaced(env.client.clone(), NAMESPACE)
        .list(&ListParams::default())
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

    // Its rights: a RoleBinding in the watched namespace, nothing elsewhere.
    let bound_in = |namespace: &'static str| {
        let account = account.clone();
        async move {
            let bindings = Api::<RoleBinding>::namespaced(env.client.clone(), namespace)
                .list(&ListParams::default())
                .await?;
            anyhow::Ok(bindings.items.iter().any(|b| {
                b.subjects
                    .iter()
                    .flatten()
                    .any(|s| s.name == account && s.namespace.as_deref() == Some(NAMESPACE))
            }))
        }
    };
    ensure!(bound_in(WATCHED).await?, "no RoleBinding for {account} in {WATCHED}");
    ensure!(
        !bound_in(UNWATCHED).await?,
        "a RoleBinding for {account} in {UNWATCHED}"
    );
    let cluster_wide = Api::<ClusterRoleBinding>::all(env.client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .any(|b| b.subjects.iter().flatten().any(|s| s.name == account));
    ensure!(!cluster_wide, "{account} is bound cluster-wide");

    let kubeconfig = service_account_kubeconfig(env, NAMESPACE, &name).await?;
    let operator = Operator::start(
        env,
        "e2e-operator-scoped",
        &kubeconfig,
        &[
            ("NEREID_WATCH_NAMESPACES", WATCHED),
            ("POD_NAMESPACE", NAMESPACE),
            ("NEREID_LEASE_NAME", &name),
        ],
    )?;
    let address = operator.metrics;
    env.operators.lock().expect("operators").push(operator);

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
    // And nothing it tried was refused.
    let text = wait::until("the scoped operator's metrics", LONG, || metrics(address)).await?;
    let errors: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with("nereid_operator_reconcile_errors_total"))
        .collect();
    ensure!(errors.is_empty(), "reconcile errors: {errors:?}");
    Ok(())
}
