//! The `nereid-server` binary: flags, start-up, and graceful shutdown.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use nereid_server::backend::onnx;
use nereid_server::grpc::{self, GrpcOptions};
use nereid_server::http::{self, HttpOptions};
use nereid_server::in_flight::InFlight;
use nereid_server::model_lifecycle::LoadOptions;
use nereid_server::model_repository_manager::{ControlMode, ModelRepositoryManager};
use nereid_server::repository::{Repository, Root};
use nereid_server::server::InferenceServer;
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
    /// (default: a folder under the system's temporary directory).
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
}

fn main() -> Result<()> {
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

    let cache = args
        .model_cache_dir
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("nereid-model-cache-{}", std::process::id())));
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
    let grpc_task = tokio::spawn(grpc::serve(
        grpc_listener,
        server.clone(),
        GrpcOptions {
            max_message_size: args.grpc.grpc_max_message_size,
        },
        in_flight.clone(),
        shutdown.clone().cancelled_owned(),
    ));
    tracing::info!("Started GRPCInferenceService at {grpc_local}");
    let router = http::router(
        server.clone(),
        HttpOptions {
            max_input_size: args.http.http_max_input_size,
        },
        in_flight.clone(),
    );
    let http_local = http_listener.local_addr()?;
    let http_task = tokio::spawn(http::serve(http_listener, router, shutdown.clone().cancelled_owned()));
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
