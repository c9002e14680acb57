//! The chart's two operator replicas: only the lease holder reconciles;
//! when it stops without a goodbye (frozen: no renewal, no release, as a
//! hung process or a partitioned node), the standby takes the lease once it
//! expires and reconciles from then on.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;

use crate::env::{Env, OPERATOR_NAME, OPERATOR_NAMESPACE, RELEASE};
use crate::models;
use crate::operator::{self, LEADER, LEASE_DURATION_SECS};
use crate::wait::{self, LONG};

const NAMESPACE: &str = "leader";
const RECONCILES: &str = "nereid_operator_reconcile_total{kind=\"InferenceModel\"}";

pub async fn run(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    let replicas = operator::replicas(env, OPERATOR_NAMESPACE, RELEASE).await?;
    let (leader, standbys) = operator::leader_and_standbys(env, OPERATOR_NAMESPACE, OPERATOR_NAME, replicas).await?;
    let standby = standbys.into_iter().next().context("no standby replica")?;

    // While the leader holds the lease, a new model is reconciled by it alone.
    models::apply(
        env,
        NAMESPACE,
        &models::manifest("before-takeover", 1, models::SMALL_CPU),
    )
    .await?;
    models::ready(env, NAMESPACE, "before-takeover", 1).await?;
    ensure!(standby.metric(LEADER).await? == 0.0, "the standby claims to lead");
    ensure!(
        standby.metric(RECONCILES).await? == 0.0,
        "the standby reconciled while not leading"
    );

    // Freeze the leader; the standby takes over once the lease expires.
    leader.freeze()?;
    let frozen_at = Instant::now();
    let bound = Duration::from_secs(LEASE_DURATION_SECS * 3 + 10);
    wait::until("the standby to take the lease", bound, || async {
        let holder = operator::lease_holder(env, OPERATOR_NAMESPACE, OPERATOR_NAME).await?;
        ensure!(holder == standby.name, "the lease is held by {holder}");
        Ok(())
    })
    .await?;
    println!(
        "e2e: the standby took the lease {:.1}s after the leader froze (lease duration {LEASE_DURATION_SECS}s)",
        frozen_at.elapsed().as_secs_f64()
    );
    wait::until("the standby to report leading", LONG, || async {
        ensure!(standby.metric(LEADER).await? == 1.0, "not leading yet");
        Ok(())
    })
    .await?;

    // It reconciles now: a new model gets its Deployment and a Ready status.
    models::apply(
        env,
        NAMESPACE,
        &models::manifest("after-takeover", 1, models::SMALL_CPU),
    )
    .await?;
    models::ready(env, NAMESPACE, "after-takeover", 1).await?;
    Api::<Deployment>::namespaced(env.client.clone(), NAMESPACE)
        .get("after-takeover")
        .await
        .context("the new leader did not create the Deployment")?;
    ensure!(
        standby.metric(RECONCILES).await? > 0.0,
        "the new leader counted no reconcile"
    );

    // The frozen pod goes (SIGKILL at its grace period: a stopped process
    // handles no SIGTERM); the Deployment brings a new standby.
    env.kubectl([
        "delete",
        "pod",
        "-n",
        OPERATOR_NAMESPACE,
        &leader.name,
        "--grace-period=1",
        "--wait=true",
    ])
    .await?;
    wait::until("a new standby", LONG, || async {
        let replicas = operator::replicas(env, OPERATOR_NAMESPACE, RELEASE).await?;
        ensure!(replicas.len() == 2, "{} ready operator pods", replicas.len());
        Ok(())
    })
    .await
}
