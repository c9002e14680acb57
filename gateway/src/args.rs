//! The gateway's command line (each flag also read from the environment,
//! as the chart sets them).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

use crate::activation::HoldLimits;
use crate::limits::Limits;
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

    /// Namespaces whose models only requests carrying `authorization:
    /// Bearer <token>` reach (HTTP header or gRPC metadata):
    /// `NAMESPACE=FILE`, the token being FILE's content with the whitespace
    /// around it trimmed (a mounted Secret's key). FILE is read at start
    /// (missing or empty: the gateway does not start), then looked at again
    /// at most once a second and read again when it changes, so a rotated
    /// Secret takes effect without a restart. Repeat the flag (or separate
    /// with commas) for more namespaces, or for a namespace's old and new
    /// token while clients move to the new one. Other requests for these
    /// namespaces' models get 401 / UNAUTHENTICATED, and the repository
    /// index lists only the namespaces a request's token opens. Default:
    /// none, every namespace open to any client of the gateway.
    #[arg(
        long = "namespace-token",
        env = "NEREID_GATEWAY_NAMESPACE_TOKEN",
        value_name = "NAMESPACE=FILE",
        value_delimiter = ',',
        value_parser = parse_namespace_token
    )]
    pub namespace_tokens: Vec<(String, PathBuf)>,
    /// Refuse every request for a model in a namespace that has no
    /// --namespace-token (deny by default). Default: off, such namespaces
    /// are open to any client of the gateway.
    #[arg(long, env = "NEREID_GATEWAY_REQUIRE_NAMESPACE_TOKENS")]
    pub require_namespace_tokens: bool,

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

    /// The largest request body the gateway reads before forwarding (a
    /// ModelStreamInfer call's: its first message); larger gets 413 /
    /// RESOURCE_EXHAUSTED. 64 MiB, Triton's default gRPC message limit
    /// raised to the tensors our models take.
    #[arg(long, env = "NEREID_GATEWAY_MAX_BODY_BYTES", default_value_t = 64 << 20)]
    pub max_body_bytes: usize,
    /// The request bytes the gateway buffers at once, all requests
    /// together: bodies are read whole before they are forwarded (to be
    /// retried elsewhere), and a body that would take the total over this
    /// is refused with 503 / RESOURCE_EXHAUSTED. 256 MiB is half the
    /// chart's 512Mi memory limit, leaving the rest for connections,
    /// answers in flight and the allocator; raise both together.
    #[arg(long, env = "NEREID_GATEWAY_MAX_IN_FLIGHT_BYTES", value_parser = parse_count, default_value = "268435456")]
    pub max_in_flight_bytes: usize,
    /// How long a request body (a ModelStreamInfer call's first message)
    /// may take to arrive whole before it is refused with 408 /
    /// DEADLINE_EXCEEDED. 60 s is nginx's client_body_timeout; here it
    /// bounds the whole body (64 MiB in 60 s needs about 9 Mbit/s), so an
    /// upload held one byte short holds its share of the budget no longer.
    #[arg(long, env = "NEREID_GATEWAY_BODY_TIMEOUT_SECS", value_parser = parse_secs, default_value = "60")]
    pub body_timeout_secs: Duration,

    /// Open client connections per listening port (HTTP, gRPC and metrics
    /// each); one more is closed as soon as it is accepted, and counted in
    /// nereid_gateway_connections_closed_total. An open connection holds
    /// its buffers whatever it sends: about 48 KiB for HTTP/2 (h2's read
    /// and write buffers and the cork's), at most 64 KiB for HTTP/1.1
    /// (hyper's, capped), estimated from their sizes, not measured. At
    /// 1024 the three ports' connections take under 180 MiB, which with
    /// --max-in-flight-bytes fits the chart's 512Mi limit; a gRPC client
    /// keeps one connection, and an HTTP/1.1 client a few. Raise it with
    /// the memory limit.
    #[arg(long, env = "NEREID_GATEWAY_MAX_CONNECTIONS", value_parser = parse_count, default_value = "1024")]
    pub max_connections: usize,
    /// How long a new connection has to send its first bytes (the HTTP
    /// port) or its whole HTTP/2 preface (the gRPC port) before it is
    /// closed. A client in the cluster sends them within milliseconds of
    /// connecting; 10 s allows a congested path and closes silent sockets
    /// six times sooner than nginx's 60 s client_header_timeout.
    #[arg(long, env = "NEREID_GATEWAY_HANDSHAKE_TIMEOUT_SECS", value_parser = parse_secs, default_value = "10")]
    pub handshake_timeout_secs: Duration,
    /// How long an HTTP/1.1 request head may take from its first byte to
    /// its end before the connection is closed. 30 s is hyper's default
    /// and half nginx's client_header_timeout: a head is a few hundred
    /// bytes.
    #[arg(long, env = "NEREID_GATEWAY_HEADER_READ_TIMEOUT_SECS", value_parser = parse_secs, default_value = "30")]
    pub header_read_timeout_secs: Duration,
    /// How long a connection may stay with no request (HTTP/1.1 keep-alive)
    /// or no stream (HTTP/2) open before the gateway closes it (HTTP/2 with
    /// a GOAWAY, so clients reconnect without failing a call). 120 s keeps
    /// a client that polls every minute on one connection (nginx's
    /// keepalive_timeout is 75 s) and frees a forgotten one within two
    /// minutes.
    #[arg(long, env = "NEREID_GATEWAY_IDLE_TIMEOUT_SECS", value_parser = parse_secs, default_value = "120")]
    pub idle_timeout_secs: Duration,
    /// ModelStreamInfer calls one client connection may have open at once;
    /// one more is refused with RESOURCE_EXHAUSTED. Each holds a stream to
    /// its pod for as long as the client wants, and a pod takes 1024 per
    /// connection: at 100 (gRPC-Go's default stream limit), it takes ten
    /// client connections to fill one, by when the pool has opened another
    /// (--max-pod-connections).
    #[arg(
        long,
        env = "NEREID_GATEWAY_MAX_STREAMING_CALLS_PER_CONNECTION",
        value_parser = parse_count,
        default_value = "100"
    )]
    pub max_streaming_calls_per_connection: usize,
    /// HTTP/2 connections the gateway opens to one pod (each port) when
    /// the open ones carry as many streams as the pod allows (1024 each for
    /// nereid-server); past that, a request goes to another pod or fails at
    /// once with 503 / UNAVAILABLE instead of waiting for a stream. 4 lets
    /// one replica hold 4096 calls on a pod, far more than a pod runs at
    /// once, while a flood of idle streams is refused instead of queuing
    /// everyone else's calls.
    #[arg(long, env = "NEREID_GATEWAY_MAX_POD_CONNECTIONS", value_parser = parse_count, default_value = "4")]
    pub max_pod_connections: usize,
    /// Requests held at once for one model waking from zero replicas (a
    /// model with minReplicas 0 and no ready pod); one more is refused with
    /// 503 / UNAVAILABLE saying the model is waking up. A held request is a
    /// parked task and its stream, a few KiB besides its body (bounded by
    /// --max-held-bytes-per-model): 1000 covers a burst of a thousand
    /// clients calling a sleeping model at once, in a few MiB.
    #[arg(
        long,
        env = "NEREID_GATEWAY_MAX_HELD_REQUESTS_PER_MODEL",
        value_parser = parse_count,
        default_value = "1000"
    )]
    pub max_held_requests_per_model: usize,
    /// Request body bytes held at once for one model waking from zero
    /// replicas; a request that would pass it is refused with 503 /
    /// UNAVAILABLE. These bytes also count against --max-in-flight-bytes:
    /// 64 MiB (a quarter of it) keeps one sleeping model's burst from
    /// taking the buffer every other model's requests need.
    #[arg(
        long,
        env = "NEREID_GATEWAY_MAX_HELD_BYTES_PER_MODEL",
        value_parser = parse_count,
        default_value = "67108864"
    )]
    pub max_held_bytes_per_model: usize,
    /// How long connecting to a pod may take before another is tried.
    #[arg(long, env = "NEREID_GATEWAY_CONNECT_TIMEOUT", value_parser = parse_millis, default_value = "1000")]
    pub connect_timeout_ms: Duration,
    /// Attempts per request (the first included) when pods cannot be reached.
    #[arg(long, env = "NEREID_GATEWAY_ATTEMPTS", default_value_t = 3)]
    pub attempts: usize,

    /// Threads that serve requests; 0 means one per CPU. One thread spends
    /// about a fifth less CPU per request than two on a small machine (no
    /// wake-ups between threads), at the cost of using one core at most:
    /// see docs/benchmarks-log.md, entry 5, before changing it.
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

impl Args {
    /// The limits on what clients can make the gateway hold.
    pub fn limits(&self) -> Limits {
        Limits {
            max_connections: self.max_connections,
            handshake_timeout: self.handshake_timeout_secs,
            header_read_timeout: self.header_read_timeout_secs,
            idle_timeout: self.idle_timeout_secs,
            body_timeout: self.body_timeout_secs,
            max_body_bytes: self.max_body_bytes,
            max_in_flight_bytes: self.max_in_flight_bytes,
            max_streaming_calls_per_connection: self.max_streaming_calls_per_connection,
        }
    }

    /// The bounds on requests held for models waking from zero.
    pub fn hold_limits(&self) -> HoldLimits {
        HoldLimits {
            max_requests: self.max_held_requests_per_model,
            max_bytes: self.max_held_bytes_per_model,
        }
    }
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

/// Whole seconds, at least one: a timeout of zero would close everything.
fn parse_secs(text: &str) -> Result<Duration, String> {
    match text.parse::<u64>() {
        Ok(0) => Err("a timeout must be at least 1 s".into()),
        Ok(secs) => Ok(Duration::from_secs(secs)),
        Err(e) => Err(format!("{text:?} is not a number of seconds: {e}")),
    }
}

/// A count or size of at least one: a limit of zero would refuse everything.
fn parse_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(0) => Err("a limit must be at least 1".into()),
        Ok(count) => Ok(count),
        Err(e) => Err(format!("{text:?} is not a whole number: {e}")),
    }
}

fn parse_namespace_token(text: &str) -> Result<(String, PathBuf), String> {
    let (namespace, file) = text
        .split_once('=')
        .ok_or_else(|| format!("{text:?} is not NAMESPACE=FILE"))?;
    if namespace.is_empty() || namespace.contains('/') {
        return Err(format!("{text:?} names no namespace (NAMESPACE=FILE)"));
    }
    if file.is_empty() {
        return Err(format!("{text:?} names no file (NAMESPACE=FILE)"));
    }
    Ok((namespace.to_string(), PathBuf::from(file)))
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
    use clap::CommandFactory;

    use super::*;
    use crate::limits::flag;

    #[test]
    fn every_limit_a_refusal_names_is_a_flag() {
        let command = Args::command();
        for name in flag::ALL {
            let long = name.strip_prefix("--").unwrap();
            assert!(
                command.get_arguments().any(|arg| arg.get_long() == Some(long)),
                "{name} is not a flag"
            );
        }
    }

    #[test]
    fn the_limits_defaults() {
        let limits = Args::parse_from(["nereid-gateway"]).limits();
        assert_eq!(limits.max_connections, 1024);
        assert_eq!(limits.handshake_timeout, Duration::from_secs(10));
        assert_eq!(limits.header_read_timeout, Duration::from_secs(30));
        assert_eq!(limits.idle_timeout, Duration::from_secs(120));
        assert_eq!(limits.body_timeout, Duration::from_secs(60));
        assert_eq!(limits.max_in_flight_bytes, 256 << 20);
        assert_eq!(limits.max_streaming_calls_per_connection, 100);
        for zero in ["--max-connections=0", "--idle-timeout-secs=0"] {
            assert!(Args::try_parse_from(["nereid-gateway", zero]).is_err(), "{zero}");
        }
    }

    #[test]
    fn namespace_tokens() {
        let args = Args::parse_from(["nereid-gateway"]);
        assert!(args.namespace_tokens.is_empty() && !args.require_namespace_tokens);
        let args = Args::parse_from([
            "nereid-gateway",
            "--namespace-token",
            "ml=/run/tokens/ml",
            "--namespace-token=team=/run/a=b,ops=/run/ops",
            "--require-namespace-tokens",
        ]);
        let given: Vec<(&str, &str)> = args
            .namespace_tokens
            .iter()
            .map(|(namespace, file)| (namespace.as_str(), file.to_str().unwrap()))
            .collect();
        assert_eq!(
            given,
            [("ml", "/run/tokens/ml"), ("team", "/run/a=b"), ("ops", "/run/ops")]
        );
        assert!(args.require_namespace_tokens);
        for bad in ["ml", "=/run/ml", "ml=", "ml/x=/run/ml"] {
            assert!(parse_namespace_token(bad).is_err(), "{bad}");
        }
    }

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
