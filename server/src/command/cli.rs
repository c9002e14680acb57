//! The command line: Triton's flags and Nereid's, in clap groups, and the
//! small conversions from flags to the typed settings the library takes.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use crate::backend::settings::BackendConfig;
use crate::logging::{LogFormat, LogSettings};
use crate::model_repository_manager::ControlMode;
use crate::restricted_api::{EnvRestrictionFlag, RestrictionFlag};
use crate::transport::tls::ReloadingTls;
use crate::transport::{ConnectionLimits, ServeOptions, TlsSettings};
use anyhow::{Context, Result};
use clap::Parser;

/// A Triton-compatible inference server.
#[derive(Debug, Parser)]
#[command(name = "nereid-server", version)]
pub struct Args {
    /// A model repository (Triton's layout): a local folder, or object
    /// storage as s3://bucket/path, gs://bucket/path or
    /// as://account/container/path; may be given more than once.
    #[arg(
        long = "model-repository",
        required = true,
        env = "NEREID_MODEL_REPOSITORY",
        value_delimiter = ','
    )]
    pub model_repositories: Vec<String>,

    /// Where models from object storage are copied before they load
    /// (default: a new private folder, mode 0700, under the system's
    /// temporary directory).
    #[arg(long, env = "NEREID_MODEL_CACHE_DIR")]
    pub model_cache_dir: Option<PathBuf>,

    /// `none` loads every model at start-up; `explicit` only those named by
    /// --load-model, and the repository API loads and unloads; `poll` loads
    /// every model at start-up, then picks up new, changed and removed
    /// models every --repository-poll-secs.
    #[arg(long, value_enum, default_value = "none")]
    pub model_control_mode: ControlMode,

    /// Seconds between two polls of the model repositories in poll mode
    /// (at least 1).
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u64).range(1..))]
    pub repository_poll_secs: u64,

    /// Seconds an unload (the repository API's, or poll mode's for a
    /// removed model) waits for the requests the model had admitted to
    /// finish and its instances to be dropped; past it the unload answers
    /// and the model stays UNLOADING until they are.
    #[arg(long, default_value_t = 30)]
    pub model_unload_timeout_secs: u64,

    /// A model to load at start-up in explicit mode ("*" for all); may repeat.
    #[arg(long = "load-model")]
    pub load_models: Vec<String>,

    /// Do not complete missing config fields from the model file.
    #[arg(long)]
    pub disable_auto_complete_config: bool,

    /// Triton's backend settings: `<backend>,<setting>=<value>`, or
    /// `<setting>=<value>` for every backend that has it; may repeat. Known:
    /// `onnxruntime,default-max-batch-size=N`, what auto-complete sets an
    /// unset max_batch_size to (4 unless set).
    #[arg(long = "backend-config")]
    pub backend_config: Vec<BackendConfig>,

    /// `MODEL=FILE`: a partial model config in JSON merged over MODEL's
    /// config.pbtxt at every load (JSON merge patch); may repeat. The
    /// Kubernetes operator passes an InferenceModel's `spec.config` this way.
    #[arg(long = "model-config-patch", value_parser = parse_patch)]
    pub model_config_patches: Vec<(String, PathBuf)>,

    /// Exit (with status 3, `LOAD_FAILED_EXIT_CODE`) when a model fails to
    /// load at start-up, instead of serving the others; in Kubernetes the
    /// pod then shows the reason, and the operator tells a failed load from
    /// any other crash by that status.
    #[arg(long)]
    pub exit_on_error: bool,

    /// The name reported by server metadata (`/v2`).
    #[arg(long, default_value = "nereid")]
    pub server_name: String,

    #[command(flatten)]
    pub http: HttpArgs,

    #[command(flatten)]
    pub grpc: GrpcArgs,

    #[command(flatten)]
    pub metrics: MetricsArgs,

    #[command(flatten)]
    pub log: LogArgs,

    /// Triton's trace settings: `level=TIMESTAMPS`, `rate=N`, `count=N`,
    /// `mode=opentelemetry`, `opentelemetry,url=<OTLP/gRPC endpoint>`,
    /// `opentelemetry,resource=<key>=<value>`,
    /// `opentelemetry,bsp_schedule_delay=<ms>`; may repeat.
    #[arg(long = "trace-config")]
    pub trace_config: Vec<String>,

    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30)]
    pub exit_timeout_secs: u64,

    /// The most bytes of request data held at once, over all requests and
    /// both protocols (bodies as they arrive, decoded and decompressed
    /// copies, encoded answers); beyond it requests are refused with 503 /
    /// RESOURCE_EXHAUSTED. 0 means no limit.
    #[arg(long, env = "NEREID_MAX_IN_FLIGHT_BYTES", default_value_t = 1 << 30)]
    pub max_in_flight_bytes: usize,

    /// Seconds a new connection has for its TLS handshake and first bytes
    /// (and, over HTTP/2, to start its first request).
    #[arg(long, default_value_t = 10)]
    pub handshake_timeout_secs: u64,

    /// Seconds after which an HTTP/2 connection (any port) with no request
    /// answering and none started is drained with a GOAWAY; it is closed
    /// between one and two of these after its last request.
    #[arg(long, default_value_t = 120)]
    pub http2_idle_timeout_secs: u64,

    /// Take changes of the log and trace settings and shared-memory
    /// registrations from clients on other hosts too, without a
    /// restricted-API header (Triton's behaviour); by default only clients
    /// on the server's host may make them.
    #[arg(long)]
    pub allow_remote_control: bool,

    /// The ONNX Runtime shared library (libonnxruntime.so.1.3x).
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub onnxruntime_library: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "HTTP/REST")]
pub struct HttpArgs {
    #[arg(long, default_value = "0.0.0.0")]
    pub http_address: String,
    /// 0 picks a free port (the log says which).
    #[arg(long, default_value_t = 8000)]
    pub http_port: u16,
    /// Largest request body, before and after decompression.
    #[arg(long, default_value_t = 128 << 20)]
    pub http_max_input_size: usize,
    /// Connections open at once; more are closed at once.
    #[arg(long, default_value_t = 4096)]
    pub http_max_connections: usize,
    /// Seconds for a request's headers to arrive (also the idle time after
    /// which a keep-alive connection is closed).
    #[arg(long, default_value_t = 30)]
    pub http_header_read_timeout_secs: u64,
    /// Seconds for a request's body to arrive, once its headers have.
    #[arg(long, default_value_t = 60)]
    pub http_body_timeout_secs: u64,
    /// `<api>,<api>,...:<key>=<value>`: requests to these API groups need
    /// header <key> with <value> (groups: health, metadata, inference,
    /// shared-memory, model-config, model-repository, statistics, trace,
    /// logging); may repeat, one group per flag.
    #[arg(long = "http-restricted-api")]
    pub http_restricted_api: Vec<RestrictionFlag>,
    /// `<api>,...:<key>=<ENV_VAR>`: as --http-restricted-api, the value
    /// read from the environment variable ENV_VAR at start (kept out of the
    /// process's arguments); may repeat.
    #[arg(long = "http-restricted-api-from-env")]
    pub http_restricted_api_from_env: Vec<EnvRestrictionFlag>,
    #[command(flatten)]
    pub tls: HttpTlsArgs,
}

#[derive(Debug, clap::Args)]
pub struct HttpTlsArgs {
    /// Serve HTTPS (needs --http-server-cert and --http-server-key).
    #[arg(long)]
    pub http_use_ssl: bool,
    /// Require client certificates signed by --http-root-cert.
    #[arg(long)]
    pub http_use_ssl_mutual: bool,
    #[arg(long)]
    pub http_server_cert: Option<PathBuf>,
    #[arg(long)]
    pub http_server_key: Option<PathBuf>,
    #[arg(long)]
    pub http_root_cert: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "gRPC")]
pub struct GrpcArgs {
    #[arg(long, default_value = "0.0.0.0")]
    pub grpc_address: String,
    /// 0 picks a free port (the log says which).
    #[arg(long, default_value_t = 8001)]
    pub grpc_port: u16,
    /// Largest gRPC message received or sent.
    #[arg(long, default_value_t = 128 << 20)]
    pub grpc_max_message_size: usize,
    /// Connections open at once; more are closed at once.
    #[arg(long, default_value_t = 4096)]
    pub grpc_max_connections: usize,
    /// Calls one connection may have open at once (HTTP/2 streams).
    #[arg(long, default_value_t = 1024)]
    pub grpc_max_concurrent_streams: u32,
    /// Milliseconds of silence before the server pings a connection.
    #[arg(long, default_value_t = 7_200_000)]
    pub grpc_keepalive_time: u64,
    /// Milliseconds to wait for the ping's answer before closing.
    #[arg(long, default_value_t = 20_000)]
    pub grpc_keepalive_timeout: u64,
    /// Seconds for a unary call's request message to arrive.
    #[arg(long, default_value_t = 60)]
    pub grpc_body_timeout_secs: u64,
    /// `<protocol>,<protocol>,...:<key>=<value>`: calls of these groups need
    /// metadata <key> with <value> (groups as for --http-restricted-api).
    #[arg(long = "grpc-restricted-protocol")]
    pub grpc_restricted_protocol: Vec<RestrictionFlag>,
    /// As --grpc-restricted-protocol, the value read from an environment
    /// variable (as --http-restricted-api-from-env).
    #[arg(long = "grpc-restricted-protocol-from-env")]
    pub grpc_restricted_protocol_from_env: Vec<EnvRestrictionFlag>,
    #[command(flatten)]
    pub tls: GrpcTlsArgs,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Metrics")]
pub struct MetricsArgs {
    /// Serve Prometheus metrics (Triton's names) on --metrics-port.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_metrics: bool,
    /// Report GPU metrics (Triton's nv_gpu_* and nv_energy_consumption, per GPU), where a GPU and NVML are.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_gpu_metrics: bool,
    /// Report CPU utilization and memory.
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub allow_cpu_metrics: bool,
    /// 0 picks a free port (the log says which).
    #[arg(long, default_value_t = 8002)]
    pub metrics_port: u16,
    /// Default: --http-address.
    #[arg(long)]
    pub metrics_address: Option<String>,
    /// How often per-interval metrics (CPU, memory, GPU) are refreshed.
    #[arg(long, default_value_t = 2000)]
    pub metrics_interval_ms: u64,
    /// `<key>=<value>`, Triton's: counter_latencies, summary_latencies,
    /// summary_quantiles, histogram_latencies (and histogram_buckets); may repeat.
    #[arg(long = "metrics-config")]
    pub metrics_config: Vec<String>,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Logging")]
pub struct LogArgs {
    /// Verbose logging: 1 adds the server's debug events, 2 its trace events.
    #[arg(long, default_value_t = 0)]
    pub log_verbose: u32,
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub log_info: bool,
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub log_warning: bool,
    #[arg(long, default_value_t = true, num_args = 0..=1, default_missing_value = "true", action = clap::ArgAction::Set)]
    pub log_error: bool,
    /// `default` (or `ISO8601`): text lines; `json`: one JSON object per line.
    #[arg(long, default_value = "default", value_parser = parse_log_format)]
    pub log_format: LogFormat,
}

impl LogArgs {
    pub fn settings(&self) -> LogSettings {
        LogSettings {
            info: self.log_info,
            warning: self.log_warning,
            error: self.log_error,
            verbose_level: self.log_verbose,
            format: self.log_format,
        }
    }
}

fn parse_log_format(value: &str) -> Result<LogFormat, String> {
    LogFormat::parse(value).ok_or_else(|| format!("expected default, ISO8601 or json, got '{value}'"))
}

impl GrpcArgs {
    /// The protocol limits of the gRPC port (HTTP/2 only).
    pub fn serve_options(&self, args: &Args) -> ServeOptions {
        ServeOptions {
            http1_header_timeout: None,
            max_concurrent_streams: self.grpc_max_concurrent_streams,
            keepalive: Duration::from_millis(self.grpc_keepalive_time),
            keepalive_timeout: Duration::from_millis(self.grpc_keepalive_timeout),
            http2_idle_timeout: Duration::from_secs(args.http2_idle_timeout_secs),
            first_request_timeout: Duration::from_secs(args.handshake_timeout_secs),
            http2_date_header: false,
        }
    }
}

impl HttpArgs {
    pub fn connection_limits(&self, handshake_timeout: Duration) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.http_max_connections,
            handshake_timeout,
        }
    }

    /// The protocol limits of an HTTP port; `grpc` gives the HTTP/2 ones,
    /// `args` the timeouts every port shares.
    pub fn serve_options(&self, grpc: &GrpcArgs, args: &Args) -> ServeOptions {
        ServeOptions {
            http1_header_timeout: Some(Duration::from_secs(self.http_header_read_timeout_secs)),
            http2_date_header: true,
            ..grpc.serve_options(args)
        }
    }

    pub fn tls(&self) -> Result<Option<Arc<ReloadingTls>>> {
        let t = &self.tls;
        let settings = tls_settings(
            "http",
            t.http_use_ssl,
            t.http_use_ssl_mutual,
            &t.http_server_cert,
            &t.http_server_key,
            &t.http_root_cert,
        )?;
        tls("HTTP", settings, &[b"h2", b"http/1.1"])
    }
}

impl GrpcArgs {
    pub fn connection_limits(&self, handshake_timeout: Duration) -> ConnectionLimits {
        ConnectionLimits {
            max_connections: self.grpc_max_connections,
            handshake_timeout,
        }
    }

    pub fn tls(&self) -> Result<Option<Arc<ReloadingTls>>> {
        let t = &self.tls;
        let settings = tls_settings(
            "grpc",
            t.grpc_use_ssl,
            t.grpc_use_ssl_mutual,
            &t.grpc_server_cert,
            &t.grpc_server_key,
            &t.grpc_root_cert,
        )?;
        tls("gRPC", settings, &[b"h2"])
    }
}

#[derive(Debug, clap::Args)]
pub struct GrpcTlsArgs {
    /// Serve gRPC over TLS (needs --grpc-server-cert and --grpc-server-key).
    #[arg(long)]
    pub grpc_use_ssl: bool,
    /// Require client certificates signed by --grpc-root-cert.
    #[arg(long)]
    pub grpc_use_ssl_mutual: bool,
    #[arg(long)]
    pub grpc_server_cert: Option<PathBuf>,
    #[arg(long)]
    pub grpc_server_key: Option<PathBuf>,
    #[arg(long)]
    pub grpc_root_cert: Option<PathBuf>,
}

/// The TLS settings of one front end from its flags; `None` when off.
fn tls_settings(
    port: &str,
    use_ssl: bool,
    mutual: bool,
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    root: &Option<PathBuf>,
) -> Result<Option<TlsSettings>> {
    if !use_ssl && !mutual {
        return Ok(None);
    }
    let (Some(cert), Some(key)) = (cert, key) else {
        anyhow::bail!("--{port}-use-ssl needs --{port}-server-cert and --{port}-server-key");
    };
    if mutual && root.is_none() {
        anyhow::bail!("--{port}-use-ssl-mutual needs --{port}-root-cert");
    }
    Ok(Some(TlsSettings {
        cert: cert.clone(),
        key: key.clone(),
        root: root.clone(),
        mutual,
    }))
}

fn tls(port: &str, settings: Option<TlsSettings>, alpn: &[&[u8]]) -> Result<Option<Arc<ReloadingTls>>> {
    settings
        .map(|s| ReloadingTls::new(s, alpn).map(Arc::new))
        .transpose()
        .map_err(|reason| anyhow::anyhow!("{port} TLS: {reason}"))
}

pub fn parse_patch(value: &str) -> Result<(String, PathBuf), String> {
    match value.split_once('=') {
        Some((model, file)) if !model.is_empty() && !file.is_empty() => Ok((model.to_string(), PathBuf::from(file))),
        _ => Err(format!("expected MODEL=FILE, got '{value}'")),
    }
}

pub fn listen_address(host: &str, port: u16) -> Result<SocketAddr> {
    let ip: std::net::IpAddr = host.parse().with_context(|| format!("'{host}' is not an IP address"))?;
    Ok(SocketAddr::new(ip, port))
}
