//! `nereid-operator` processes, run the way the chart runs them: with the
//! chart's ServiceAccount (a token of it, so the chart's RBAC is what is
//! tested), its lease settings, and a metrics port to read.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{Context, Result};
use k8s_openapi::api::apps::v1::Deployment;
use kube::Api;
use kube::config::Kubeconfig;

use crate::env::{Env, OPERATOR_NAME, OPERATOR_NAMESPACE, SERVER_IMAGE};

/// Short, so that a takeover is quick to see.
pub const LEASE_DURATION_SECS: u64 = 5;
/// The chart's lease name (its Role grants only this one).
pub const LEASE_NAME: &str = OPERATOR_NAME;

pub struct Operator {
    pub identity: String,
    pub metrics: SocketAddr,
    pub log: PathBuf,
    child: Child,
}

impl Operator {
    /// Starts an operator with the identity `identity` and the rights in
    /// `kubeconfig`; `settings` (environment variables) override the defaults.
    pub fn start(env: &Env, identity: &str, kubeconfig: &Path, settings: &[(&str, &str)]) -> Result<Operator> {
        let metrics = free_port()?;
        let log = env.scratch(&format!("logs/operator-{identity}.log"));
        let output = std::fs::File::create(&log)?;
        // setpriv (util-linux) execs the operator with a parent-death signal:
        // should this harness be killed outright, its operators die with it
        // instead of retrying a vanished API server for ever. The signal
        // follows the spawning thread, a runtime worker that lives as long
        // as the harness.
        let child = Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--"])
            .arg(env!("CARGO_BIN_EXE_nereid-operator"))
            .env_clear()
            .env("KUBECONFIG", kubeconfig)
            .env("NEREID_SERVER_IMAGE", SERVER_IMAGE)
            .env("NEREID_OPERATOR_METRICS_ADDRESS", metrics.to_string())
            .env("POD_NAMESPACE", OPERATOR_NAMESPACE)
            .env("POD_NAME", identity)
            .env("NEREID_LEASE_NAME", LEASE_NAME)
            .env("NEREID_LEASE_DURATION_SECS", LEASE_DURATION_SECS.to_string())
            .env("RUST_LOG", "info,nereid_operator=debug")
            .env("NO_COLOR", "1")
            .envs(settings.iter().copied())
            .stdin(Stdio::null())
            .stdout(output.try_clone()?)
            .stderr(output)
            .spawn()
            .context("starting nereid-operator")?;
        Ok(Operator {
            identity: identity.to_string(),
            metrics,
            log,
            child,
        })
    }

    /// Whether `/readyz` answers 200.
    pub async fn ready(&self) -> Result<()> {
        reqwest::get(format!("http://{}/readyz", self.metrics))
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Kills the process at once (SIGKILL: no chance to release the lease),
    /// as a crashed node or an OOM kill would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The last lines of its log, for failure reports.
    pub fn log_tail(&self, lines: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A kubeconfig holding a token of the ServiceAccount of the chart's
/// operator Deployment `deployment` in `namespace`.
pub async fn service_account_kubeconfig(env: &Env, namespace: &str, deployment: &str) -> Result<PathBuf> {
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), namespace);
    let deployment = deployments
        .get(deployment)
        .await
        .context("the chart's operator Deployment")?;
    let account = deployment
        .spec
        .template
        .spec
        .and_then(|s| s.service_account_name)
        .context("the operator Deployment names no ServiceAccount")?;
    let token = env
        .kubectl(["create", "token", &account, "-n", namespace, "--duration", "2h"])
        .await?;
    let admin = Kubeconfig::read_from(&env.cluster.kubeconfig)?;
    let cluster = admin
        .clusters
        .first()
        .and_then(|c| c.cluster.as_ref())
        .context("the admin kubeconfig has no cluster")?;
    let server = cluster.server.clone().context("no server")?;
    let ca = cluster.certificate_authority.clone().context("no CA")?;
    let path = env.scratch(&format!("{namespace}-{account}.kubeconfig"));
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {server}\n    \
             certificate-authority: {ca}\nusers:\n- name: {account}\n  user:\n    token: {}\ncontexts:\n\
             - name: e2e\n  context: {{cluster: e2e, user: {account}, namespace: {namespace}}}\n\
             current-context: e2e\n",
            token.trim()
        ),
    )?;
    Ok(path)
}

/// A metric of the operator serving metrics at `address`: the value of the
/// line that starts with `series` (name and labels as Prometheus prints
/// them), 0 when absent (an unset counter).
pub async fn metric(address: SocketAddr, series: &str) -> Result<f64> {
    Ok(metrics(address)
        .await?
        .lines()
        .filter_map(|line| line.strip_prefix(series))
        .find_map(|rest| rest.strip_prefix(' ').and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0.0))
}

/// Everything the operator at `address` exports.
pub async fn metrics(address: SocketAddr) -> Result<String> {
    Ok(reqwest::get(format!("http://{address}/metrics"))
        .await?
        .error_for_status()?
        .text()
        .await?)
}

fn free_port() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}
