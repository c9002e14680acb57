//! Command-line flags (each also an environment variable), grouped by what
//! they configure.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;

use crate::context::OperatorConfig;

/// The Nereid Kubernetes operator.
#[derive(Debug, Parser)]
#[command(name = "nereid-operator", version)]
pub struct Args {
    /// The nereid-server image used when an InferenceModel names none.
    #[arg(long, env = "NEREID_SERVER_IMAGE", default_value = "nereid:latest")]
    pub server_image: String,

    /// Cluster DNS domain, for the endpoints reported in status.
    #[arg(long, env = "NEREID_CLUSTER_DOMAIN", default_value = "cluster.local")]
    pub cluster_domain: String,

    /// Namespaces whose InferenceModels are reconciled, comma-separated; all
    /// namespaces when empty. With a list, the operator needs rights in those
    /// namespaces only (the Helm chart binds its ClusterRole per namespace).
    #[arg(long, env = "NEREID_WATCH_NAMESPACES", value_delimiter = ',', num_args = 0..)]
    pub watch_namespaces: Vec<String>,

    /// Where /healthz, /readyz and /metrics are served.
    #[arg(long, env = "NEREID_OPERATOR_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: SocketAddr,

    #[command(flatten)]
    pub election: ElectionArgs,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Leader election")]
pub struct ElectionArgs {
    /// Run without a lease (a single replica only).
    #[arg(long, env = "NEREID_DISABLE_LEADER_ELECTION")]
    pub disable_leader_election: bool,

    /// The Lease's name.
    #[arg(long, env = "NEREID_LEASE_NAME", default_value = "nereid-operator")]
    pub lease_name: String,

    /// The Lease's namespace; in a pod, its own namespace.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,

    /// This replica's identity in the Lease; in a pod, its name.
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,

    /// How long a lease lasts without renewal, in seconds.
    #[arg(long, env = "NEREID_LEASE_DURATION_SECS", default_value_t = 15)]
    pub lease_duration_secs: u64,
}

impl Args {
    /// The namespaces to watch, `None` meaning all (blank entries dropped,
    /// duplicates removed, so `NEREID_WATCH_NAMESPACES=""` means all).
    pub fn watched_namespaces(&self) -> Option<Vec<String>> {
        let mut namespaces: Vec<String> = self
            .watch_namespaces
            .iter()
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();
        namespaces.sort();
        namespaces.dedup();
        (!namespaces.is_empty()).then_some(namespaces)
    }

    pub fn operator_config(&self) -> OperatorConfig {
        OperatorConfig {
            server_image: self.server_image.clone(),
            field_manager: "nereid-operator".into(),
            cluster_domain: self.cluster_domain.clone(),
        }
    }
}

impl ElectionArgs {
    pub fn lease_duration(&self) -> Duration {
        Duration::from_secs(self.lease_duration_secs.max(3))
    }

    /// The identity, falling back to the host name and the process id.
    pub fn identity(&self) -> String {
        self.identity.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
            format!("{}-{}", host.trim(), std::process::id())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("nereid-operator").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn watched_namespaces_are_all_unless_listed() {
        assert_eq!(parse(&[]).watched_namespaces(), None);
        assert_eq!(parse(&["--watch-namespaces", ""]).watched_namespaces(), None);
        assert_eq!(
            parse(&["--watch-namespaces", "b, a,b,"]).watched_namespaces(),
            Some(vec!["a".to_string(), "b".to_string()])
        );
    }
}
