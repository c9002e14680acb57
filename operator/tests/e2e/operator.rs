//! The operator as the chart deploys it: the chart's Deployment, its pods
//! on the process nodes running this checkout's `nereid-operator` with
//! in-cluster configuration (the projected token of the chart's
//! ServiceAccount, so the chart's RBAC is what is tested), electing a
//! leader through the chart's Lease. The scenarios read a replica's
//! metrics on its pod IP, and can freeze one to take its lease away.

use std::net::IpAddr;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;
use nereid_proto::keda::external_scaler_client::ExternalScalerClient;
use tonic::transport::Channel;

use crate::env::Env;
use crate::procfs;

/// The chart's lease duration in this suite (`leaderElection.leaseDurationSeconds`):
/// short, so that a takeover is quick to see.
pub const LEASE_DURATION_SECS: u64 = 5;
/// The port the chart gives the operator's metrics and health endpoints.
const METRICS_PORT: u16 = 8080;
/// Whether a replica leads (1) or stands by (0).
pub const LEADER: &str = "nereid_operator_leader";

/// One running operator replica: its pod and where its metrics are.
#[derive(Clone, Debug)]
pub struct Replica {
    pub name: String,
    pub ip: IpAddr,
}

impl Replica {
    /// A metric of this replica: the value of the line that starts with
    /// `series` (name and labels as Prometheus prints them), 0 when absent
    /// (an unset counter).
    pub async fn metric(&self, series: &str) -> Result<f64> {
        Ok(self
            .metrics()
            .await?
            .lines()
            .filter_map(|line| line.strip_prefix(series))
            .find_map(|rest| rest.strip_prefix(' ').and_then(|v| v.trim().parse().ok()))
            .unwrap_or(0.0))
    }

    /// Everything it exports.
    pub async fn metrics(&self) -> Result<String> {
        Ok(crate::inference::client()
            .get(format!("http://{}:{METRICS_PORT}/metrics", self.ip))
            .send()
            .await?
            .error_for_status()?
            .text()
            .await?)
    }

    /// Stops the replica's process where it stands (SIGSTOP): it renews
    /// nothing and says no goodbye, like a hung process or a partitioned
    /// node; its pod must be deleted afterwards.
    pub fn freeze(&self) -> Result<()> {
        let pid = process_of_pod(&self.name)?;
        let status = std::process::Command::new("kill")
            .args(["-STOP", &pid.to_string()])
            .status()?;
        ensure!(status.success(), "kill -STOP {pid} failed");
        Ok(())
    }
}

/// Every operator pod of the Helm release `release` in `namespace`,
/// terminating ones included.
pub async fn pods(env: &Env, namespace: &str, release: &str) -> Result<Vec<Pod>> {
    let selector = format!("app.kubernetes.io/instance={release},app.kubernetes.io/component=operator");
    Ok(Api::<Pod>::namespaced(env.client.clone(), namespace)
        .list(&ListParams::default().labels(&selector))
        .await?
        .items)
}

/// The ready operator pods of the Helm release `release` in `namespace`.
/// The chart's first operator replica and a client of its KEDA External
/// Scaler service (the e2e values serve it in plaintext on 9090), as KEDA
/// calls it.
pub async fn keda_scaler(env: &Env) -> Result<(Replica, ExternalScalerClient<Channel>)> {
    let replica = replicas(env, crate::env::OPERATOR_NAMESPACE, crate::env::RELEASE)
        .await?
        .into_iter()
        .next()
        .context("no operator pod")?;
    let client = ExternalScalerClient::connect(format!("http://{}:9090", replica.ip)).await?;
    Ok((replica, client))
}

pub async fn replicas(env: &Env, namespace: &str, release: &str) -> Result<Vec<Replica>> {
    pods(env, namespace, release)
        .await?
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && crate::models::running_and_ready(p))
        .map(|p| {
            Ok(Replica {
                name: p.metadata.name.clone().context("a pod name")?,
                ip: crate::models::pod_ip(p)?,
            })
        })
        .collect()
}

/// The identity holding the Lease `lease` in `namespace`.
pub async fn lease_holder(env: &Env, namespace: &str, lease: &str) -> Result<String> {
    Api::<Lease>::namespaced(env.client.clone(), namespace)
        .get(lease)
        .await?
        .spec
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty())
        .context("the lease has no holder")
}

/// The leader among `replicas` (by the Lease) and the others.
pub async fn leader_and_standbys(
    env: &Env,
    namespace: &str,
    lease: &str,
    replicas: Vec<Replica>,
) -> Result<(Replica, Vec<Replica>)> {
    let holder = lease_holder(env, namespace, lease).await?;
    let (leaders, standbys): (Vec<Replica>, Vec<Replica>) = replicas.into_iter().partition(|r| r.name == holder);
    let leader = leaders
        .into_iter()
        .next()
        .with_context(|| format!("the lease holder {holder} is not a ready replica"))?;
    Ok((leader, standbys))
}

/// The operator process of pod `pod`: the process node gives each
/// container `POD_NAME` from the downward API, as the chart asks.
pub fn process_of_pod(pod: &str) -> Result<u32> {
    let wanted = format!("POD_NAME={pod}");
    procfs::all()
        .into_iter()
        .find(|p| p.cmdline.contains("nereid-operator") && p.has_env(&wanted))
        .map(|p| p.pid)
        .with_context(|| format!("no nereid-operator process of pod {pod}"))
}

/// The end of every operator container's log under the process nodes'
/// state folder, for failure reports.
pub fn log_tails(env: &Env, lines: usize) -> String {
    let mut out = String::new();
    let Ok(pods) = std::fs::read_dir(env.cluster.dir.join("pods")) else {
        return out;
    };
    for pod in pods.flatten() {
        let log = pod.path().join("containers/operator/log");
        let Ok(text) = std::fs::read_to_string(&log) else {
            continue;
        };
        let all: Vec<&str> = text.lines().collect();
        out.push_str(&format!(
            "--- {} (last lines)\n{}\n",
            pod.file_name().to_string_lossy(),
            all[all.len().saturating_sub(lines)..].join("\n")
        ));
    }
    out
}
