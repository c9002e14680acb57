//! The `nereid-server` binary: flags, start-up, and graceful shutdown.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Parser;
use nereid_server::allocator;
use nereid_server::backend::onnx;
use nereid_server::grpc::{self, GrpcOptions};
use nereid_server::http::body::BodyLimits;
use nereid_server::http::{self, HttpOptions, HttpServeOptions};
use nereid_server::in_flight::InFlight;
use nereid_server::memory_budget::MemoryBudget;
use nereid_server::model_lifecycle::LoadOptions;
use nereid_server::model_repository_manager::{ControlMode, ModelRepositoryManager};
use nereid_server::repository::{Repository, Root, cache_dir};
use nereid_server::restricted_api::{RestrictedApis, RestrictionFlag};
use nereid_server::server::InferenceServer;
use nereid_server::transport::tls::ReloadingTls;
use nereid_server::transport::{Acceptor, ConnectionLimits, TlsSettings};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// A Triton-compatible inference server.
#[derive(Debug, Parser)]
#[command(name = "nereid-server", version)]
struct Args {
    /// A model repository (Triton's layout): a local folder, or object
    /// storage as s3://bucket/path, gs://bucket/path or
    /// as://account/container/path; may be given more than once.
    #[arg(
        long = "model-repository",
        required = true,
        env = "NEREID_MODEL_REPOSITORY",
        value_delimiter = ','
    )]
    model_repositories: Vec<String>,

    /// Where models from object storage are copied before they load
    /// (default: a new private folder, mode 0700, under the system's
    /// temporary directory).
    #[arg(long, env = "NEREID_MODEL_CACHE_DIR")]
    model_cache_dir: Option<PathBuf>,

    /// `none` loads every model at start-up; `explicit` only those named by
    /// --load-model, and the repository API loads and unloads.
    #[arg(long, value_enum, default_value = "none")]
    model_control_mode: ControlMode,

    /// A model to load at start-up in explicit mode ("*" for all); may repeat.
    #[arg(long = "load-model")]
    load_models: Vec<String>,

    /// Do not complete missing config fields from the model file.
    #[arg(long)]
    disable_auto_complete_config: bool,

    /// `MODEL=FILE`: a partial model config in JSON merged over MODEL's
    /// config.pbtxt at every load (JSON merge patch); may repeat. The
    /// Kubernetes operator passes an InferenceModel's `spec.config` this way.
    #[arg(long = "model-config-patch", value_parser = parse_patch)]
    model_config_patches: Vec<(String, PathBuf)>,

    /// Exit (status 1) when a model fails to load at start-up, instead of
    /// serving the others; in Kubernetes the pod then shows the reason.
    #[arg(long)]
    exit_on_error: bool,

    /// The name reported by server metadata (`/v2`).
    #[arg(long, default_value = "nereid")]
    server_name: String,

    #[command(flatten)]
    http: HttpArgs,

    #[command(flatten)]
    grpc: GrpcArgs,

    /// Seconds to let in-flight requests finish after SIGTERM/SIGINT.
    #[arg(long, default_value_t = 30)]
    exit_timeout_secs: u64,

    /// The most bytes of request data held at once, over all requests and
    /// both protocols (bodies as they arrive, decoded and decompressed
    /// copies, encoded answers); beyond it requests are refused with 503 /
    /// RESOURCE_EXHAUSTED. 0 means no limit.
    #[arg(long, env = "NEREID_MAX_IN_FLIGHT_BYTES", default_value_t = 1 << 30)]
    max_in_flight_bytes: usize,

    /// Seconds a new connection has for its TLS handshake and first bytes.
    #[arg(long, default_value_t = 10)]
    handshake_timeout_secs: u64,

    /// The ONNX Runtime shared library (libonnxruntime.so.1.3x).
    #[arg(long, env = "ORT_DYLIB_PATH")]
    onnxruntime_library: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "HTTP/REST")]
struct HttpArgs {
    #[arg(long, default_value = "0.0.0.0")]
    http_address: String,
    /// 0 picks a free port (the log says which).
    #[arg(long, default_value_t = 8000)]
    http_port: u16,
    /// Largest request body, before and after decompression.
    #[arg(long, default_value_t = 128 << 20)]
    http_max_input_size: usize,
    /// Connections open at once; more are closed at once.
    #[arg(long, default_value_t = 4096)]
    http_max_connections: usize,
    /// Seconds for a request's headers to arrive (also the idle time after
    /// which a keep-alive connection is closed).
    #[arg(long, default_value_t = 30)]
    http_header_read_timeout_secs: u64,
    /// Seconds for a request's body to arrive, once its headers have.
    #[arg(long, default_value_t = 60)]
    http_body_timeout_secs: u64,
    /// `<api>,<api>,...:<key>=<value>`: requests to these API groups need
    /// header <key> with <value> (groups: health, metadata, inference,
    /// shared-memory, model-config, model-repository, statistics, trace,
    /// logging); may repeat, one group per flag.
    #[arg(long = "http-restricted-api")]
    http_restricted_api: Vec<RestrictionFlag>,
    #[command(flatten)]
    tls: HttpTlsArgs,
}

#[derive(Debug, clap::Args)]
struct HttpTlsArgs {
    /// Serve HTTPS (needs --http-server-cert and --http-server-key).
    #[arg(long)]
    http_use_ssl: bool,
    /// Require client certificates signed by --http-root-cert.
    #[arg(long)]
    http_use_ssl_mutual: bool,
    #[arg(long)]
    http_server_cert: Option<PathBuf>,
    #[arg(long)]
    http_server_key: Option<PathBuf>,
    #[arg(long)]
    http_root_cert: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
#[command(next_help_heading = "gRPC")]
struct GrpcArgs {
    #[arg(long, default_value = "0.0.0.0")]
    grpc_address: String,
    /// 0 picks a free port (the log says which).
    #[arg(long, default_value_t = 8001)]
    grpc_port: u16,
    /// Largest gRPC message received or sent.
    #[arg(long, default_value_t = 128 << 20)]
    grpc_max_message_size: usize,
    /// Connections open at once; more are closed at once.
    #[arg(long, default_value_t = 4096)]
    grpc_max_connections: usize,
    /// Calls one connection may have open at once (HTTP/2 streams).
    #[arg(long, default_value_t = 1024)]
    grpc_max_concurrent_streams: u32,
    /// Milliseconds of silence before the server pings a connection.
    #[arg(long, default_value_t = 7_200_000)]
    grpc_keepalive_time: u64,
    /// Milliseconds to wait for the ping's answer before closing.
    #[arg(long, default_value_t = 20_000)]
    grpc_keepalive_timeout: u64,
    /// Seconds for a unary call's request message to arrive.
    #[arg(long, default_value_t = 60)]
    grpc_body_timeout_secs: u64,
    /// `<protocol>,<protocol>,...:<key>=<value>`: calls of these groups need
    /// metadata <key> with <value> (groups as for --http-restricted-api).
    #[arg(long = "grpc-restricted-protocol")]
    grpc_restricted_protocol: Vec<RestrictionFlag>,
    #[command(flatten)]
    tls: GrpcTlsArgs,
}

#[derive(Debug, clap::Args)]
struct GrpcTlsArgs {
    /// Serve gRPC over TLS (needs --grpc-server-cert and --grpc-server-key).
    #[arg(long)]
    grpc_use_ssl: bool,
    /// Require client certificates signed by --grpc-root-cert.
    #[arg(long)]
    grpc_use_ssl_mutual: bool,
    #[arg(long)]
    grpc_server_cert: Option<PathBuf>,
    #[arg(long)]
    grpc_server_key: Option<PathBuf>,
    #[arg(long)]
    grpc_root_cert: Option<PathBuf>,
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

fn main() -> Result<()> {
    allocator::return_large_blocks_to_the_os();
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,ort=warn")))
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("nereid-io")
        .build()
        .context("failed to start the async runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    if let Err(reason) = onnx::init(args.onnxruntime_library.as_deref()) {
        tracing::warn!(%reason, "ONNX Runtime is unavailable; ONNX models will not load");
    }

    let cache = match &args.model_cache_dir {
        Some(dir) => dir.clone(),
        None => cache_dir::private_temp().context("failed to create the model cache folder")?,
    };
    let roots = args
        .model_repositories
        .iter()
        .enumerate()
        .map(|(index, location)| Root::parse(location, &cache, index))
        .collect::<Result<Vec<_>, _>>()?;
    let manager = ModelRepositoryManager::new(
        Repository::new(roots),
        args.model_control_mode,
        LoadOptions {
            autocomplete: !args.disable_auto_complete_config,
            patches: args.model_config_patches.iter().cloned().collect(),
        },
    );
    let server = InferenceServer::new(args.server_name.clone(), manager);

    let http_restricted = Arc::new(RestrictedApis::new(&args.http.http_restricted_api).map_err(anyhow::Error::msg)?);
    let grpc_restricted =
        Arc::new(RestrictedApis::new(&args.grpc.grpc_restricted_protocol).map_err(anyhow::Error::msg)?);
    let t = &args.http.tls;
    let http_tls = tls(
        "HTTP",
        tls_settings(
            "http",
            t.http_use_ssl,
            t.http_use_ssl_mutual,
            &t.http_server_cert,
            &t.http_server_key,
            &t.http_root_cert,
        )?,
        &[b"h2", b"http/1.1"],
    )?;
    let t = &args.grpc.tls;
    let grpc_tls = tls(
        "gRPC",
        tls_settings(
            "grpc",
            t.grpc_use_ssl,
            t.grpc_use_ssl_mutual,
            &t.grpc_server_cert,
            &t.grpc_server_key,
            &t.grpc_root_cert,
        )?,
        &[b"h2"],
    )?;
    let budget = MemoryBudget::new(args.max_in_flight_bytes);
    let handshake_timeout = Duration::from_secs(args.handshake_timeout_secs);

    let http_addr = listen_address(&args.http.http_address, args.http.http_port)?;
    let grpc_addr = listen_address(&args.grpc.grpc_address, args.grpc.grpc_port)?;
    let http_listener = TcpListener::bind(http_addr)
        .await
        .with_context(|| format!("failed to bind HTTP on {http_addr}"))?;
    let grpc_listener = TcpListener::bind(grpc_addr)
        .await
        .with_context(|| format!("failed to bind gRPC on {grpc_addr}"))?;

    // Models load before the ports are announced, so that "Started" means
    // the server answers with its models in place (readiness says so too).
    let failures = server
        .manager()
        .load_startup_models(&args.load_models)
        .await
        .context("failed to read the model repository")?;
    if args.exit_on_error && !failures.is_empty() {
        let reasons: Vec<String> = failures.iter().map(|(m, e)| format!("'{m}': {e}")).collect();
        anyhow::bail!("failed to load {}", reasons.join("; "));
    }

    let shutdown = CancellationToken::new();
    let in_flight = InFlight::new();
    let grpc_local = grpc_listener.local_addr()?;
    let grpc_acceptor = Acceptor::new(
        "grpc",
        grpc_listener,
        ConnectionLimits {
            max_connections: args.grpc.grpc_max_connections,
            handshake_timeout,
        },
        grpc_tls,
    );
    let grpc_task = tokio::spawn(grpc::serve(
        grpc_acceptor,
        server.clone(),
        GrpcOptions {
            max_message_size: args.grpc.grpc_max_message_size,
            max_concurrent_streams: args.grpc.grpc_max_concurrent_streams,
            keepalive_time: Duration::from_millis(args.grpc.grpc_keepalive_time),
            keepalive_timeout: Duration::from_millis(args.grpc.grpc_keepalive_timeout),
            body_timeout: Duration::from_secs(args.grpc.grpc_body_timeout_secs),
            budget: Arc::clone(&budget),
            restricted: grpc_restricted,
        },
        in_flight.clone(),
        shutdown.clone().cancelled_owned(),
    ));
    tracing::info!("Started GRPCInferenceService at {grpc_local}");
    let router = http::router(
        server.clone(),
        HttpOptions {
            body: BodyLimits {
                max_size: args.http.http_max_input_size,
                timeout: Duration::from_secs(args.http.http_body_timeout_secs),
            },
            budget,
            restricted: http_restricted,
        },
        in_flight.clone(),
    );
    let http_local = http_listener.local_addr()?;
    let http_acceptor = Acceptor::new(
        "http",
        http_listener,
        ConnectionLimits {
            max_connections: args.http.http_max_connections,
            handshake_timeout,
        },
        http_tls,
    );
    let http_task = tokio::spawn(http::serve(
        http_acceptor,
        router,
        HttpServeOptions {
            header_read_timeout: Duration::from_secs(args.http.http_header_read_timeout_secs),
            max_concurrent_streams: args.grpc.grpc_max_concurrent_streams,
            keepalive: Duration::from_millis(args.grpc.grpc_keepalive_time),
        },
        shutdown.clone().cancelled_owned(),
    ));
    server.set_ready(true);
    tracing::info!("Started HTTPService at {http_local}");

    wait_for_signal().await;
    tracing::info!("shutting down: no new connections, finishing in-flight requests");
    server.set_ready(false);
    shutdown.cancel();
    // Done when the servers have closed every connection, or when no request
    // is left in flight: idle keep-alive connections are not worth waiting for.
    let servers_closed = async {
        let _ = http_task.await;
        let _ = grpc_task.await;
    };
    let drained = tokio::time::timeout(Duration::from_secs(args.exit_timeout_secs), async {
        tokio::select! {
            () = servers_closed => {}
            () = in_flight.idle() => {}
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            timeout_secs = args.exit_timeout_secs,
            "in-flight requests did not finish before the exit timeout"
        );
    }
    server.manager().unload_all();
    tracing::info!("stopped");
    Ok(())
}

fn parse_patch(value: &str) -> Result<(String, PathBuf), String> {
    match value.split_once('=') {
        Some((model, file)) if !model.is_empty() && !file.is_empty() => Ok((model.to_string(), PathBuf::from(file))),
        _ => Err(format!("expected MODEL=FILE, got '{value}'")),
    }
}

fn listen_address(host: &str, port: u16) -> Result<SocketAddr> {
    let ip: std::net::IpAddr = host.parse().with_context(|| format!("'{host}' is not an IP address"))?;
    Ok(SocketAddr::new(ip, port))
}

/// Resolves on SIGTERM or SIGINT.
async fn wait_for_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops the server");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
