//! Two operator replicas: only the lease holder reconciles; when it dies
//! without a goodbye (SIGKILL), the standby takes the lease once it expires
//! and reconciles from then on.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;

use crate::chart::{FIRST_OPERATOR, lease_holder_is};
use crate::env::{Env, OPERATOR_NAME, OPERATOR_NAMESPACE};
use crate::models;
use crate::operator::{LEASE_DURATION_SECS, Operator, metric, service_account_kubeconfig};
use crate::wait::{self, LONG};

const NAMESPACE: &str = "leader";
const SECOND_OPERATOR: &str = "e2e-operator-b";
const RECONCILES: &str = "nereid_operator_reconcile_total{kind=\"InferenceModel\"}";
const LEADER: &str = "nereid_operator_leader";

pub async fn run(env: &Env) -> Result<()> {
    env.namespace(NAMESPACE).await?;
    let kubeconfig = service_account_kubeconfig(env, OPERATOR_NAMESPACE, OPERATOR_NAME).await?;
    let standby = Operator::start(env, SECOND_OPERATOR, &kubeconfig, &[])?;
    wait::until("the second operator to be ready", LONG, || standby.ready()).await?;
    let standby_metrics = standby.metrics;
    env.operators.lock().expect("operators").push(standby);

    // While the first holds the lease, a new model is reconciled by it alone.
    lease_holder_is(env, FIRST_OPERATOR).await?;
    models::apply(
        env,
        NAMESPACE,
        &models::manifest("before-takeover", 1, models::SMALL_CPU),
    )
    .await?;
    models::ready(env, NAMESPACE, "before-takeover", 1).await?;
    let standby = |series| metric(standby_metrics, series);
    ensure!(standby(LEADER).await? == 0.0, "the standby claims to lead");
    ensure!(
        standby(RECONCILES).await? == 0.0,
        "the standby reconciled while not leading"
    );

    // Kill the leader; the standby takes over once the lease expires.
    let killed_at = Instant::now();
    {
        let mut operators = env.operators.lock().expect("operators");
        let first = operators
            .iter_mut()
            .find(|o| o.identity == FIRST_OPERATOR)
            .context("the first operator")?;
        first.kill();
    }
    let bound = Duration::from_secs(LEASE_DURATION_SECS * 3 + 10);
    wait::until("the standby to take the lease", bound, || {
        lease_holder_is(env, SECOND_OPERATOR)
    })
    .await?;
    println!(
        "e2e: the standby took the lease {:.1}s after the leader was killed (lease duration {LEASE_DURATION_SECS}s)",
        killed_at.elapsed().as_secs_f64()
    );
    wait::until("the standby to report leading", LONG, || async {
        ensure!(standby(LEADER).await? == 1.0, "not leading yet");
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
    ensure!(standby(RECONCILES).await? > 0.0, "the new leader counted no reconcile");
    Ok(())
}
