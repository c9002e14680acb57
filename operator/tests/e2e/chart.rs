//! The Helm chart: lint, the plain manifests in deploy/ kept in sync, the
//! rendered objects accepted by the API server (server-side dry-run), and a
//! real install whose operator pods run on the process nodes; then the
//! wait for one of them to lead.

use std::process::Command;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

use crate::env::{self, Env, OPERATOR_NAME, OPERATOR_NAMESPACE, RELEASE, SERVER_IMAGE};
use crate::operator::{self, LEASE_DURATION_SECS};
use crate::wait::{self, LONG};

/// What this suite sets in the chart (a user's values file): the operator
/// pods on the process nodes (their nodeSelector and toleration), the
/// serving image they hand to models, a short lease, and debug logs; one
/// gateway replica, also on the process nodes.
pub fn values(env: &Env) -> Result<std::path::PathBuf> {
    let (repository, tag) = SERVER_IMAGE.split_once(':').context("the server image's tag")?;
    let path = env.scratch("e2e-values.yaml");
    std::fs::write(
        &path,
        format!(
            "serverImage:\n  repository: {repository}\n  tag: {tag}\nleaderElection:\n  \
             leaseDurationSeconds: {LEASE_DURATION_SECS}\nlogLevel: info,nereid_operator=debug\n\
             nodeSelector:\n  nereid.dev/process-node: \"true\"\ntolerations:\n\
             - key: nereid.dev/process-node\n  operator: Exists\n  effect: NoSchedule\n\
             autoscaling:\n  scrapeIntervalSeconds: 1\n  windowSeconds: 5\nkeda:\n  enabled: true\n  plaintext: true\n\
             gateway:\n  replicaCount: 1\n  drainDelaySeconds: 1\n  logLevel: info,nereid_gateway=debug\n  \
             nodeSelector:\n    nereid.dev/process-node: \"true\"\n  tolerations:\n  \
             - key: nereid.dev/process-node\n    operator: Exists\n    effect: NoSchedule\n"
        ),
    )?;
    Ok(path)
}

pub async fn install(env: &Env) -> Result<()> {
    let chart = env.path("charts/nereid");
    let chart = chart.to_str().context("a UTF-8 path")?;
    env.helm(["lint", "--strict", chart]).await.context("helm lint")?;

    // deploy/nereid-operator.yaml is a fresh render of the chart.
    let mut render = Command::new("bash");
    render
        .arg(env.path("deploy/render.sh"))
        .arg("--check")
        .env("HELM", env.bin.join("helm"));
    env::checked(env::run(render, None).await?).context("deploy/render.sh --check")?;

    // The API server accepts every rendered object: the plain manifests, and
    // the chart with per-namespace RBAC and without leader election.
    env.namespace(OPERATOR_NAMESPACE).await?;
    env.namespace("team-a").await?;
    env.namespace("team-b").await?;
    let crds = env.path("deploy/crds/nereid-crds.yaml");
    let plain = env.path("deploy/nereid-operator.yaml");
    for file in [&crds, &plain] {
        env.kubectl([
            "apply",
            "--server-side",
            "--dry-run=server",
            "-f",
            file.to_str().unwrap_or_default(),
        ])
        .await
        .with_context(|| format!("server-side dry-run of {}", file.display()))?;
    }
    for values in [
        &["--set", "watchNamespaces={team-a,team-b}"][..],
        &["--set", "leaderElection.enabled=false", "--set", "replicaCount=1"][..],
    ] {
        let mut args = vec!["template", RELEASE, chart, "--namespace", OPERATOR_NAMESPACE];
        args.extend_from_slice(values);
        let rendered = env.helm(args).await?;
        env.kubectl_stdin(["apply", "--server-side", "--dry-run=server", "-f", "-"], &rendered)
            .await
            .with_context(|| format!("server-side dry-run of the chart rendered with {values:?}"))?;
    }

    let values = values(env)?;
    env.helm([
        "install",
        RELEASE,
        chart,
        "--namespace",
        OPERATOR_NAMESPACE,
        "--values",
        values.to_str().context("a UTF-8 path")?,
        "--wait",
        "--timeout",
        "180s",
    ])
    .await
    .context("helm install")?;

    // What the install made: established CRDs, the operator Deployment (its
    // pods run on KWOK nodes), cluster-wide RBAC bound to its ServiceAccount.
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    for name in [
        "inferencemodels.serving.nereid.dev",
        "modelensembles.serving.nereid.dev",
    ] {
        let crd = crds.get(name).await?;
        let established = crd
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True");
        ensure!(established, "CRD {name} is not Established");
    }
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    let deployment = deployments.get(OPERATOR_NAME).await?;
    let spec = deployment.spec;
    ensure!(
        spec.replicas == Some(2),
        "the chart runs 2 operator replicas, not {:?}",
        spec.replicas
    );
    ensure!(
        deployment.status.and_then(|s| s.ready_replicas) == Some(2),
        "helm --wait returned before both operator pods were ready"
    );
    let account = spec
        .template
        .spec
        .and_then(|s| s.service_account_name)
        .context("serviceAccountName")?;
    let binding: Api<ClusterRoleBinding> = Api::all(env.client.clone());
    let bound = binding.list(&Default::default()).await?.items.into_iter().any(|b| {
        b.subjects.unwrap_or_default().iter().any(|s| {
            s.kind == "ServiceAccount" && s.name == account && s.namespace.as_deref() == Some(OPERATOR_NAMESPACE)
        })
    });
    ensure!(bound, "no ClusterRoleBinding binds ServiceAccount {account}");
    Ok(())
}

/// Waits until both operator pods serve and one of them holds the lease.
pub async fn operator_leads(env: &Env) -> Result<()> {
    wait::until("an operator pod to hold the lease", LONG, || async {
        let replicas = operator::replicas(env, OPERATOR_NAMESPACE, RELEASE).await?;
        ensure!(replicas.len() == 2, "{} ready operator pods", replicas.len());
        let (leader, _) = operator::leader_and_standbys(env, OPERATOR_NAMESPACE, OPERATOR_NAME, replicas).await?;
        ensure!(
            leader.metric(operator::LEADER).await? == 1.0,
            "{} does not report leading yet",
            leader.name
        );
        Ok(())
    })
    .await
}
