//! The gateway's command line (each flag also read from the environment,
//! as the chart sets them).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::registry::{Address, ModelKey};

#[derive(Debug, Parser)]
#[command(
    name = "nereid-gateway",
    version,
    about = "One KServe v2 endpoint for the cluster: routes each request to the least-loaded ready pod of its model"
)]
pub struct Args {
    /// The address the three ports listen on.
    #[arg(long, env = "NEREID_GATEWAY_ADDRESS", default_value = "0.0.0.0")]
    pub address: IpAddr,
    #[arg(long, env = "NEREID_GATEWAY_HTTP_PORT", default_value_t = 8000)]
    pub http_port: u16,
    #[arg(long, env = "NEREID_GATEWAY_GRPC_PORT", default_value_t = 8001)]
    pub grpc_port: u16,
    /// Prometheus metrics and the probes' /healthz and /readyz.
    #[arg(long, env = "NEREID_GATEWAY_METRICS_PORT", default_value_t = 8002)]
    pub metrics_port: u16,

    /// Namespaces whose models are served (comma-separated); all when empty.
    #[arg(long, env = "NEREID_GATEWAY_NAMESPACES", value_delimiter = ',')]
    pub namespaces: Vec<String>,
    /// The namespace a plain model name means when several namespaces
    /// hold that name (others are named `namespace/name`).
    #[arg(long, env = "NEREID_GATEWAY_DEFAULT_NAMESPACE")]
    pub default_namespace: Option<String>,

    /// How an endpoint is chosen per request: `least-loaded` (power of two
    /// choices on in-flight requests plus the pod's reported queue) or
    /// `round-robin` (load-blind, for comparison).
    #[arg(long, env = "NEREID_GATEWAY_PICKER", value_enum, default_value = "least-loaded")]
    pub picker: PickerKind,

    /// Serve these endpoints instead of discovering them in Kubernetes:
    /// `MODEL=HTTP_ADDRESS,GRPC_ADDRESS`, MODEL plain (namespace "default")
    /// or `namespace/name`; repeat for more pods and models.
    #[arg(long = "endpoint", value_name = "MODEL=HTTP,GRPC", value_parser = parse_endpoint)]
    pub endpoints: Vec<(ModelKey, Address)>,

    /// The largest request body the gateway reads before forwarding.
    #[arg(long, env = "NEREID_GATEWAY_MAX_BODY_BYTES", default_value_t = 64 << 20)]
    pub max_body_bytes: usize,
    /// How long connecting to a pod may take before another is tried.
    #[arg(long, env = "NEREID_GATEWAY_CONNECT_TIMEOUT", value_parser = parse_millis, default_value = "1000")]
    pub connect_timeout_ms: Duration,
    /// Attempts per request (the first included) when pods cannot be reached.
    #[arg(long, env = "NEREID_GATEWAY_ATTEMPTS", default_value_t = 3)]
    pub attempts: usize,

    /// Threads that serve requests; 0 means one per CPU. One thread spends
    /// about a fifth less CPU per request than two on a small machine (no
    /// wake-ups between threads), at the cost of using one core at most:
    /// see docs/benchmarks.md before changing it.
    #[arg(long, env = "NEREID_GATEWAY_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    /// After SIGTERM, how long the gateway keeps accepting connections with
    /// /readyz failing, while the cluster takes it out of its Service.
    #[arg(long, env = "NEREID_GATEWAY_DRAIN_DELAY", value_parser = parse_millis, default_value = "2000")]
    pub drain_delay_ms: Duration,
    /// Then how long the requests in flight have to finish before the
    /// gateway exits anyway (keep it under the pod's grace period).
    #[arg(long, env = "NEREID_GATEWAY_SHUTDOWN_TIMEOUT", value_parser = parse_millis, default_value = "20000")]
    pub shutdown_timeout_ms: Duration,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PickerKind {
    LeastLoaded,
    RoundRobin,
}

fn parse_millis(text: &str) -> Result<Duration, String> {
    text.parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|e| format!("{text:?} is not a number of milliseconds: {e}"))
}

fn parse_endpoint(text: &str) -> Result<(ModelKey, Address), String> {
    let (model, addresses) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not MODEL=HTTP_ADDRESS,GRPC_ADDRESS"))?;
    let (namespace, name) = model.split_once('/').unwrap_or(("default", model));
    if name.is_empty() || namespace.is_empty() {
        return Err(format!("{text:?} names no model"));
    }
    let (http, grpc) = addresses
        .split_once(',')
        .ok_or_else(|| format!("{text:?} gives no gRPC address (MODEL=HTTP_ADDRESS,GRPC_ADDRESS)"))?;
    let socket = |address: &str| {
        address
            .parse::<SocketAddr>()
            .map_err(|e| format!("{address:?} in {text:?} is not an IP:port: {e}"))
    };
    Ok((
        ModelKey {
            namespace: namespace.to_string(),
            name: name.to_string(),
        },
        Address {
            http: socket(http)?,
            grpc: socket(grpc)?,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_endpoints() {
        let (key, address) = parse_endpoint("ml/resnet=127.0.0.1:8000,127.0.0.1:8001").unwrap();
        assert_eq!((key.namespace.as_str(), key.name.as_str()), ("ml", "resnet"));
        assert_eq!(address.grpc, "127.0.0.1:8001".parse().unwrap());
        assert_eq!(parse_endpoint("bert=[::1]:1,[::1]:2").unwrap().0.namespace, "default");
        for bad in ["bert", "bert=127.0.0.1:1", "=1.2.3.4:1,1.2.3.4:2", "bert=host:1,host:2"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }
}
