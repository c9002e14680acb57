//! Command-line flags (each also an environment variable), grouped by what
//! they configure.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use crate::autoscaling::scraper::ScrapeSettings;
use crate::context::{Autoscaler, Gateway, OperatorConfig};
use crate::external_metrics::ServeSettings;
use crate::external_scaler::{self, TlsFiles, Transport};

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

    /// The HTTP base URL of the cluster's nereid-gateway
    /// (`http://<service>.<namespace>.svc.<domain>:8000`), when one is
    /// installed: `status.url` then points there.
    #[arg(long, env = "NEREID_GATEWAY_URL")]
    pub gateway_url: Option<String>,

    /// Its gRPC address (`<service>.<namespace>.svc.<domain>:8001`); remote
    /// ensemble steps call members through it. Default: the URL's host, port 8001.
    #[arg(long, env = "NEREID_GATEWAY_GRPC")]
    pub gateway_grpc: Option<String>,

    /// The namespaces that gateway routes, comma-separated; all when empty.
    #[arg(long, env = "NEREID_GATEWAY_NAMESPACES", value_delimiter = ',', num_args = 0..)]
    pub gateway_namespaces: Vec<String>,

    /// Where /healthz, /readyz and /metrics are served.
    #[arg(long, env = "NEREID_OPERATOR_METRICS_ADDRESS", default_value = "0.0.0.0:8080")]
    pub metrics_address: SocketAddr,

    #[command(flatten)]
    pub election: ElectionArgs,

    #[command(flatten)]
    pub autoscaling: AutoscalingArgs,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Autoscaling")]
pub struct AutoscalingArgs {
    /// Seconds between two scrapes of every ready serving pod's /metrics.
    #[arg(long, env = "NEREID_SCRAPE_INTERVAL_SECS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=300))]
    pub scrape_interval_secs: u64,

    /// Seconds a pod has to answer a scrape before it is left out of the round.
    #[arg(long, env = "NEREID_SCRAPE_TIMEOUT_SECS", default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..=60))]
    pub scrape_timeout_secs: u64,

    /// The sliding window queue time and inference rate are averaged over, in seconds.
    #[arg(long, env = "NEREID_METRICS_WINDOW_SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub metrics_window_secs: u64,

    /// Where the external metrics API (external.metrics.k8s.io, over TLS)
    /// is served; not served when absent.
    #[arg(long, env = "NEREID_EXTERNAL_METRICS_ADDRESS", requires_all = ["external_metrics_cert", "external_metrics_key"])]
    pub external_metrics_address: Option<SocketAddr>,

    /// The external metrics API's serving certificate (PEM), the one the
    /// APIService's caBundle vouches for.
    #[arg(long, env = "NEREID_EXTERNAL_METRICS_CERT")]
    pub external_metrics_cert: Option<PathBuf>,

    /// Its private key (PEM).
    #[arg(long, env = "NEREID_EXTERNAL_METRICS_KEY")]
    pub external_metrics_key: Option<PathBuf>,

    /// Where KEDA's External Scaler gRPC service is served; not served when
    /// absent. Over TLS (--keda-scaler-cert and --keda-scaler-key), unless
    /// --keda-scaler-plaintext says otherwise.
    #[arg(long, env = "NEREID_KEDA_SCALER_ADDRESS")]
    pub keda_scaler_address: Option<SocketAddr>,

    /// The External Scaler service's certificate (PEM), for the name KEDA
    /// dials (the Service's `<name>.<namespace>`).
    #[arg(long, env = "NEREID_KEDA_SCALER_CERT", requires = "keda_scaler_key")]
    pub keda_scaler_cert: Option<PathBuf>,

    /// Its private key (PEM).
    #[arg(long, env = "NEREID_KEDA_SCALER_KEY", requires = "keda_scaler_cert")]
    pub keda_scaler_key: Option<PathBuf>,

    /// Mutual TLS: the CA (PEM) that signed KEDA's client certificate; a
    /// client without a certificate it signed is refused at the handshake.
    #[arg(long, env = "NEREID_KEDA_SCALER_CLIENT_CA", requires = "keda_scaler_cert")]
    pub keda_scaler_client_ca: Option<PathBuf>,

    /// Serve the External Scaler service without TLS. Anyone who reaches its
    /// port can then read the figures of every model in the operator's
    /// namespaces: only where a NetworkPolicy (or a mesh) lets KEDA alone reach it.
    #[arg(long, env = "NEREID_KEDA_SCALER_PLAINTEXT")]
    pub keda_scaler_plaintext: bool,

    /// What spec.autoscaling becomes: an HPA on the operator's external
    /// metrics, or a KEDA ScaledObject (KEDA must be installed).
    #[arg(long, env = "NEREID_AUTOSCALER", value_enum, default_value_t = AutoscalerKind::Hpa,
          requires_if("keda", "keda_scaler_service"))]
    pub autoscaler: AutoscalerKind,

    /// With `--autoscaler keda`: the address KEDA dials for the operator's
    /// External Scaler service (`<service>.<namespace>:9090`).
    #[arg(long, env = "NEREID_KEDA_SCALER_SERVICE")]
    pub keda_scaler_service: Option<String>,

    /// With `--autoscaler keda` and a TLS External Scaler service: the KEDA
    /// ClusterTriggerAuthentication the ScaledObjects' triggers name, which
    /// gives KEDA the CA to verify the service with (`caCert`) and, for
    /// mutual TLS, its client certificate (`tlsClientCert`, `tlsClientKey`).
    #[arg(long, env = "NEREID_KEDA_TRIGGER_AUTHENTICATION")]
    pub keda_trigger_authentication: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AutoscalerKind {
    Hpa,
    Keda,
}

impl AutoscalingArgs {
    pub fn scrape_settings(&self) -> ScrapeSettings {
        ScrapeSettings {
            interval: Duration::from_secs(self.scrape_interval_secs),
            timeout: Duration::from_secs(self.scrape_timeout_secs),
            window: Duration::from_secs(self.metrics_window_secs),
        }
    }

    /// Where and how to serve the external metrics API, when asked to.
    pub fn external_metrics(&self) -> Option<ServeSettings> {
        Some(ServeSettings {
            address: self.external_metrics_address?,
            cert: self.external_metrics_cert.clone()?,
            key: self.external_metrics_key.clone()?,
        })
    }

    /// Where and how to serve KEDA's External Scaler service, when asked
    /// to: over TLS, or in plaintext only when that is asked for explicitly.
    pub fn keda_scaler(&self) -> Result<Option<external_scaler::ServeSettings>, String> {
        let Some(address) = self.keda_scaler_address else {
            return Ok(None);
        };
        let transport = match (
            &self.keda_scaler_cert,
            &self.keda_scaler_key,
            self.keda_scaler_plaintext,
        ) {
            (Some(cert), Some(key), false) => Transport::Tls(TlsFiles {
                cert: cert.clone(),
                key: key.clone(),
                client_ca: self.keda_scaler_client_ca.clone(),
            }),
            (None, None, true) if self.keda_scaler_client_ca.is_none() => Transport::Plaintext,
            (_, _, true) => {
                return Err(
                    "--keda-scaler-plaintext goes with no certificate, key or client CA: choose TLS or plaintext"
                        .into(),
                );
            }
            _ => {
                return Err(
                    "KEDA's External Scaler service needs --keda-scaler-cert and --keda-scaler-key \
                            (TLS), or --keda-scaler-plaintext to serve it without TLS"
                        .into(),
                );
            }
        };
        Ok(Some(external_scaler::ServeSettings { address, transport }))
    }
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
    /// The namespaces to watch, `None` meaning all (so
    /// `NEREID_WATCH_NAMESPACES=""` means all).
    pub fn watched_namespaces(&self) -> Option<Vec<String>> {
        namespace_list(&self.watch_namespaces)
    }

    pub fn operator_config(&self) -> OperatorConfig {
        let autoscaler = match (self.autoscaling.autoscaler, &self.autoscaling.keda_scaler_service) {
            (AutoscalerKind::Keda, Some(address)) => Autoscaler::Keda {
                scaler_address: address.clone(),
                trigger_authentication: self
                    .autoscaling
                    .keda_trigger_authentication
                    .as_deref()
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(str::to_string),
            },
            // clap refuses keda without the service address.
            _ => Autoscaler::Hpa,
        };
        let gateway = self
            .gateway_url
            .as_deref()
            .map(str::trim)
            .filter(|url| !url.is_empty())
            .map(|url| Gateway {
                http: url.to_string(),
                grpc: self.gateway_grpc.clone().unwrap_or_else(|| {
                    let authority = url.split("://").last().unwrap_or(url);
                    let host = authority.split(['/', ':']).next().unwrap_or(authority);
                    format!("{host}:8001")
                }),
                namespaces: namespace_list(&self.gateway_namespaces),
            });
        OperatorConfig {
            server_image: self.server_image.clone(),
            field_manager: "nereid-operator".into(),
            cluster_domain: self.cluster_domain.clone(),
            autoscaler,
            gateway,
        }
    }
}

/// A namespace list flag: `None` meaning all (blank entries dropped,
/// duplicates removed, so an empty variable means all).
fn namespace_list(given: &[String]) -> Option<Vec<String>> {
    let mut namespaces: Vec<String> = given
        .iter()
        .map(|n| n.trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    namespaces.sort();
    namespaces.dedup();
    (!namespaces.is_empty()).then_some(namespaces)
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

    #[test]
    fn the_external_metrics_api_needs_its_certificate() {
        assert!(parse(&[]).autoscaling.external_metrics().is_none());
        let args = ["--external-metrics-address", "0.0.0.0:6443"];
        assert!(Args::try_parse_from(std::iter::once("nereid-operator").chain(args)).is_err());
        let args = parse(&[
            "--external-metrics-address",
            "0.0.0.0:6443",
            "--external-metrics-cert",
            "/tls/tls.crt",
            "--external-metrics-key",
            "/tls/tls.key",
        ]);
        assert_eq!(
            args.autoscaling.external_metrics().unwrap().cert,
            PathBuf::from("/tls/tls.crt")
        );
        assert_eq!(args.autoscaling.scrape_settings().window, Duration::from_secs(30));
    }

    #[test]
    fn a_gateway_is_known_only_when_its_url_is_given() {
        assert_eq!(parse(&[]).operator_config().gateway, None);
        assert_eq!(parse(&["--gateway-url", " "]).operator_config().gateway, None);
        let gateway = parse(&[
            "--gateway-url",
            "http://gw.nereid.svc.cluster.local:8000",
            "--gateway-namespaces",
            "b,a,",
        ])
        .operator_config()
        .gateway
        .unwrap();
        assert_eq!(gateway.http, "http://gw.nereid.svc.cluster.local:8000");
        assert_eq!(
            gateway.grpc, "gw.nereid.svc.cluster.local:8001",
            "the URL's host, gRPC's port"
        );
        assert_eq!(gateway.namespaces, Some(vec!["a".to_string(), "b".to_string()]));
        assert!(gateway.routes("a") && !gateway.routes("c"));
    }

    #[test]
    fn keda_needs_the_address_keda_dials() {
        assert_eq!(parse(&[]).operator_config().autoscaler, Autoscaler::Hpa);
        let args = ["--autoscaler", "keda"];
        assert!(Args::try_parse_from(std::iter::once("nereid-operator").chain(args)).is_err());
        let args = parse(&[
            "--autoscaler",
            "keda",
            "--keda-scaler-service",
            "op-keda.nereid-system:9090",
        ]);
        assert_eq!(
            args.operator_config().autoscaler,
            Autoscaler::Keda {
                scaler_address: "op-keda.nereid-system:9090".into(),
                trigger_authentication: None,
            }
        );
        let args = parse(&[
            "--autoscaler",
            "keda",
            "--keda-scaler-service",
            "op-keda.nereid-system:9090",
            "--keda-trigger-authentication",
            "nereid-keda-scaler",
        ]);
        assert_eq!(
            args.operator_config().autoscaler,
            Autoscaler::Keda {
                scaler_address: "op-keda.nereid-system:9090".into(),
                trigger_authentication: Some("nereid-keda-scaler".into()),
            }
        );
    }

    #[test]
    fn the_keda_scaler_is_served_over_tls_unless_plaintext_is_asked_for() {
        assert_eq!(parse(&[]).autoscaling.keda_scaler(), Ok(None));
        let address = ["--keda-scaler-address", "0.0.0.0:9090"];
        // An address alone is not enough: TLS or an explicit plaintext.
        assert!(parse(&address).autoscaling.keda_scaler().is_err());

        let tls = parse(&[
            address[0],
            address[1],
            "--keda-scaler-cert",
            "/tls/tls.crt",
            "--keda-scaler-key",
            "/tls/tls.key",
            "--keda-scaler-client-ca",
            "/tls/ca.crt",
        ]);
        let settings = tls.autoscaling.keda_scaler().unwrap().unwrap();
        assert_eq!(settings.address, "0.0.0.0:9090".parse::<SocketAddr>().unwrap());
        assert_eq!(
            settings.transport,
            Transport::Tls(TlsFiles {
                cert: "/tls/tls.crt".into(),
                key: "/tls/tls.key".into(),
                client_ca: Some("/tls/ca.crt".into()),
            })
        );

        let plaintext = parse(&[address[0], address[1], "--keda-scaler-plaintext"]);
        assert_eq!(
            plaintext.autoscaling.keda_scaler().unwrap().unwrap().transport,
            Transport::Plaintext
        );
        let both = parse(&[
            address[0],
            address[1],
            "--keda-scaler-plaintext",
            "--keda-scaler-cert",
            "/tls/tls.crt",
            "--keda-scaler-key",
            "/tls/tls.key",
        ]);
        assert!(both.autoscaling.keda_scaler().is_err());
        // A certificate needs its key.
        let half = [address[0], address[1], "--keda-scaler-cert", "/tls/tls.crt"];
        assert!(Args::try_parse_from(std::iter::once("nereid-operator").chain(half)).is_err());
    }
}
