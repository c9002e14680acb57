//! The `nereid-server` command: flags, start-up, and graceful shutdown.
//! The `nereid-server` binary and the `nereid` multicall binary both run
//! [`main`]; [`fetch`] is `nereid-fetch`, the init containers' copier.
//!
//! Start-up in order: logging; the ONNX Runtime library; metrics; the model
//! repository and its manager; the listeners (bound before models load, so a
//! taken port fails fast); the start-up loads; then the front ends, each on
//! its accept loop, and "Started ..." lines once they serve.

mod cli;
pub mod fetch;

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use crate::allocator;
use crate::backend::settings::BackendSettings;
use crate::backend::{self, BackendKind};
use crate::grpc::{self, GrpcOptions};
use crate::http::body::{BodyLimits, SizeLimit};
use crate::http::{self, HttpOptions};
use crate::in_flight::InFlight;
use crate::local_control::LocalControl;
use crate::logging::{self, LogControl};
use crate::memory_budget::MemoryBudget;
use crate::metrics::gpu::GpuMetrics;
use crate::metrics::system::SystemMetrics;
use crate::metrics::{Metrics, MetricsConfig};
use crate::metrics_endpoint as endpoint;
use crate::model_lifecycle::LoadOptions;
use crate::model_repository_manager::{ControlMode, ModelRepositoryManager};
use crate::repository::{Repository, Root, cache_dir};
use crate::restricted_api::{EnvRestrictionFlag, RestrictedApis, RestrictionFlag};
use crate::server::InferenceServer;
use crate::trace::{TraceConfig, Traces};
use crate::transport::tls::ReloadingTls;
use crate::transport::{self, Acceptor, ConnectionLimits};
use anyhow::{Context, Result};
use clap::Parser;
use cli::{Args, listen_address};
use hyper_util::service::TowerToHyperService;
use nereid_gpu::{GpuMonitor, Gpus};
use nereid_onnxruntime::OnnxRuntimeBackend;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Connections the metrics port takes at once (scrapers, not clients).
const METRICS_CONNECTIONS: usize = 256;
/// The exit status when `--exit-on-error` stops the server because a model
/// failed to load at start-up. The operator reads it from the container's
/// last termination to report `LoadFailed` (with the message below as the
/// reason) rather than a generic crash loop; any other failure exits with 1.
const LOAD_FAILED_EXIT_CODE: u8 = nereid_proto::contract::exit::LOAD_FAILED;
/// How long, once nothing is in flight, shutdown waits for open connections
/// to finish closing (the HTTP/2 GOAWAY exchange takes a round trip).
const GOAWAY_GRACE: Duration = Duration::from_secs(1);

/// `--exit-on-error` tripped: the models that failed and why.
#[derive(Debug, thiserror::Error)]
#[error("failed to load {0}")]
struct StartupLoadFailed(String);

/// Runs the server with these command-line arguments (the program's name
/// first, as `std::env::args_os` gives them).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    allocator::return_large_blocks_to_the_os();
    let args = Args::parse_from(args);
    let log = LogControl::new(&args.log.settings());
    logging::install(&log, std::io::stderr().is_terminal());
    let outcome = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("nereid-io")
        .build()
        .context("failed to start the async runtime")
        .and_then(|runtime| runtime.block_on(run(args, log)));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        // Last on stderr, so it ends the log the termination message is cut from.
        Err(error) => {
            eprintln!("Error: {error:?}");
            if error.is::<StartupLoadFailed>() {
                ExitCode::from(LOAD_FAILED_EXIT_CODE)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Poll mode: one pass over the repositories every `every`, the first one
/// `every` after start-up (which loaded everything).
async fn poll(server: Arc<InferenceServer>, every: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        server.manager().poll().await;
    }
}

/// What protects each front end, checked before anything slow happens so
/// that a bad certificate or flag fails the start at once.
struct Protection {
    http_tls: Option<Arc<ReloadingTls>>,
    grpc_tls: Option<Arc<ReloadingTls>>,
    http_restricted: Arc<RestrictedApis>,
    grpc_restricted: Arc<RestrictedApis>,
}

impl Protection {
    fn from_args(args: &Args) -> Result<Self> {
        let restricted = |plain: &[RestrictionFlag], from_env: &[EnvRestrictionFlag]| {
            let flags: Vec<RestrictionFlag> = plain
                .iter()
                .cloned()
                .chain(from_env.iter().map(|f| f.0.clone()))
                .collect();
            RestrictedApis::new(&flags).map(Arc::new).map_err(anyhow::Error::msg)
        };
        Ok(Protection {
            http_tls: args.http.tls()?,
            grpc_tls: args.grpc.tls()?,
            http_restricted: restricted(&args.http.http_restricted_api, &args.http.http_restricted_api_from_env)?,
            grpc_restricted: restricted(
                &args.grpc.grpc_restricted_protocol,
                &args.grpc.grpc_restricted_protocol_from_env,
            )?,
        })
    }
}

/// The three listeners, bound before anything slow happens.
struct Listeners {
    http: TcpListener,
    grpc: TcpListener,
    metrics: Option<TcpListener>,
}

impl Listeners {
    async fn bind(args: &Args) -> Result<Self> {
        let bind = |host: &str, port: u16, what: &'static str| {
            let addr = listen_address(host, port);
            async move {
                let addr = addr?;
                TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("failed to bind {what} on {addr}"))
            }
        };
        let http = bind(&args.http.http_address, args.http.http_port, "HTTP").await?;
        let grpc = bind(&args.grpc.grpc_address, args.grpc.grpc_port, "gRPC").await?;
        let metrics = match args.metrics.allow_metrics {
            true => {
                let host = args
                    .metrics
                    .metrics_address
                    .as_deref()
                    .unwrap_or(&args.http.http_address);
                let port = args.metrics.metrics_port;
                Some(
                    bind(host, port, "the metrics port")
                        .await
                        .with_context(|| format!("--metrics-port {port} is not available"))?,
                )
            }
            false => None,
        };
        Ok(Listeners { http, grpc, metrics })
    }
}

/// Plugs the backends and the object storage that live in their own
/// crates into the core. The ONNX Runtime backend owns its environment;
/// it lives as long as the process, as the registry's entries do. Python
/// models' own metrics join the server's registry.
fn plug_in(args: &Args, metrics: &Metrics) {
    let onnx: &'static OnnxRuntimeBackend =
        Box::leak(Box::new(OnnxRuntimeBackend::load(args.onnxruntime_library.as_deref())));
    if let Some(reason) = onnx.unavailable() {
        tracing::warn!(%reason, "ONNX Runtime is unavailable; ONNX models will not load");
    }
    backend::plug_in(BackendKind::OnnxRuntime, onnx);
    backend::plug_in(BackendKind::Remote, &nereid_remote::RemoteBackend);
    let registry = args.metrics.allow_metrics.then(|| metrics.registry().clone());
    let python =
        nereid_python::PythonBackend::new(nereid_python::Settings::from_configs(&args.backend_config), registry);
    backend::plug_in(BackendKind::Python, Box::leak(Box::new(python)));
    crate::repository::plug_in(nereid_object_storage::open);
}

async fn run(args: Args, log: Arc<LogControl>) -> Result<()> {
    let metrics_config = MetricsConfig::parse(&args.metrics.metrics_config).map_err(anyhow::Error::msg)?;
    let metrics = Metrics::new(&metrics_config, args.metrics.allow_metrics);
    plug_in(&args, &metrics);
    let protection = Protection::from_args(&args)?;
    let trace_config = TraceConfig::parse(&args.trace_config).map_err(anyhow::Error::msg)?;
    let traces = crate::trace_export::start(&trace_config).map_err(anyhow::Error::msg)?;
    // Object storage is fetched into a cache folder; the default one is
    // made only when needed and removed when the server stops.
    let default_cache = match &args.model_cache_dir {
        None if args.model_repositories.iter().any(|l| Root::is_remote(l)) => {
            Some(cache_dir::private_temp().context("failed to create the model cache folder")?)
        }
        _ => None,
    };
    let cache = match (&args.model_cache_dir, &default_cache) {
        (Some(dir), _) => dir.clone(),
        (None, Some(temporary)) => temporary.path().to_path_buf(),
        (None, None) => PathBuf::new(),
    };
    let gpus = Arc::new(discover_gpus());
    let server = build_server(&args, &cache, &metrics, log, traces, &gpus)?;
    let listeners = Listeners::bind(&args).await?;

    // Models load before the ports are announced, so that "Started" means
    // the server answers with its models in place (readiness says so too).
    let failures = server
        .manager()
        .load_startup_models(&args.load_models)
        .await
        .context("failed to read the model repository")?;
    if args.exit_on_error && !failures.is_empty() {
        let reasons: Vec<String> = failures.iter().map(|(m, e)| format!("'{m}': {e}")).collect();
        return Err(StartupLoadFailed(reasons.join("; ")).into());
    }

    let shutdown = CancellationToken::new();
    let in_flight = InFlight::new();
    let serving = serve(&args, &server, listeners, protection, &metrics, &in_flight, &shutdown)?;
    let poller = (args.model_control_mode == ControlMode::Poll).then(|| {
        tokio::spawn(poll(
            Arc::clone(&server),
            Duration::from_secs(args.repository_poll_secs),
        ))
    });

    wait_for_signal().await;
    if let Some(poller) = poller {
        poller.abort();
    }
    tracing::info!("shutting down: no new connections, finishing in-flight requests");
    server.set_ready(false);
    shutdown.cancel();
    // Done when the servers have closed every connection, or when no request
    // is left in flight: idle keep-alive connections are not worth waiting for
    // beyond a moment. That moment lets HTTP/2 clients finish the GOAWAY
    // exchange, which tells them the requests they sent meanwhile were not
    // processed, so a router can send those elsewhere instead of seeing the
    // connection break under them.
    let drained = tokio::time::timeout(Duration::from_secs(args.exit_timeout_secs), async {
        let closed = serving.closed();
        tokio::pin!(closed);
        tokio::select! {
            () = &mut closed => {}
            () = in_flight.idle() => {
                let _ = tokio::time::timeout(GOAWAY_GRACE, closed).await;
            }
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
    // Unloaded models' instances end on their own threads: a Python
    // model's finalize runs there, and its stub must have exited before
    // this process does.
    let exit_timeout = Duration::from_secs(args.exit_timeout_secs);
    let stopped =
        tokio::task::spawn_blocking(move || nereid_core::instance_pool::wait_for_instances(exit_timeout)).await;
    if !matches!(stopped, Ok(true)) {
        tracing::warn!(
            timeout_secs = args.exit_timeout_secs,
            "model instances did not stop before the exit timeout"
        );
    }
    server.flush_traces();
    tracing::info!("stopped");
    Ok(())
}

/// The GPUs this process may use (`CUDA_VISIBLE_DEVICES` applied), logged
/// as Triton logs them at start; none on a machine without a driver.
fn discover_gpus() -> Gpus {
    let gpus = Gpus::discover();
    for gpu in gpus.devices() {
        tracing::info!(
            ordinal = gpu.ordinal,
            uuid = %gpu.uuid,
            name = %gpu.name,
            memory_bytes = gpu.total_memory,
            "GPU visible"
        );
    }
    if let Some(reason) = gpus.absent_reason() {
        tracing::info!(%reason, "no GPU visible: models run on the CPU");
    }
    gpus
}

/// The repositories, the model manager and the transport-free server.
fn build_server(
    args: &Args,
    cache: &Path,
    metrics: &Arc<Metrics>,
    log: Arc<LogControl>,
    traces: Arc<Traces>,
    gpus: &Arc<Gpus>,
) -> Result<Arc<InferenceServer>> {
    let roots = args
        .model_repositories
        .iter()
        .enumerate()
        .map(|(index, location)| Root::parse(location, cache, index))
        .collect::<Result<Vec<_>, _>>()?;
    let manager = ModelRepositoryManager::new(
        Repository::new(roots),
        args.model_control_mode,
        LoadOptions {
            autocomplete: !args.disable_auto_complete_config,
            backend_settings: BackendSettings::from_configs(&args.backend_config),
            patches: args.model_config_patches.iter().cloned().collect(),
            metrics: Arc::clone(metrics),
            // Set by the manager, which holds the loaded models.
            members: Default::default(),
            unload_timeout: Duration::from_secs(args.model_unload_timeout_secs),
            gpus: Arc::clone(gpus),
        },
    );
    Ok(InferenceServer::new(args.server_name.clone(), manager, log, traces))
}

/// Starts the front ends (and the metrics port) on their listeners; returns
/// the HTTP and gRPC serving tasks, which end once shutdown has drained them.
fn serve(
    args: &Args,
    server: &Arc<InferenceServer>,
    listeners: Listeners,
    protection: Protection,
    metrics: &Arc<Metrics>,
    in_flight: &Arc<InFlight>,
    shutdown: &CancellationToken,
) -> Result<Serving> {
    let handshake_timeout = Duration::from_secs(args.handshake_timeout_secs);
    let budget = MemoryBudget::new(args.max_in_flight_bytes);
    let local_control = LocalControl {
        from_anywhere: args.allow_remote_control,
    };

    let grpc_local = listeners.grpc.local_addr()?;
    let grpc_acceptor = Acceptor::new(
        "grpc",
        listeners.grpc,
        args.grpc.connection_limits(handshake_timeout),
        protection.grpc_tls,
    );
    let grpc_task = tokio::spawn(grpc::serve(
        grpc_acceptor,
        Arc::clone(server),
        GrpcOptions {
            max_message_size: args.grpc.grpc_max_message_size,
            serve: args.grpc.serve_options(args),
            body_timeout: Duration::from_secs(args.grpc.grpc_body_timeout_secs),
            budget: Arc::clone(&budget),
            restricted: protection.grpc_restricted,
            local_control,
            metrics: Arc::clone(metrics),
        },
        Arc::clone(in_flight),
        shutdown.clone().cancelled_owned(),
    ));
    tracing::info!("Started GRPCInferenceService at {grpc_local}");

    if let Some(listener) = listeners.metrics {
        let local = listener.local_addr()?;
        if args.metrics.allow_cpu_metrics {
            let mut system = SystemMetrics::register(metrics);
            // The first scrape already sees memory (utilization needs two readings).
            system.refresh();
            tokio::spawn(system.run(Duration::from_millis(args.metrics.metrics_interval_ms)));
        }
        if args.metrics.allow_gpu_metrics {
            match GpuMonitor::open(server.manager().gpus()) {
                Ok(monitor) => {
                    let mut gpu = GpuMetrics::register(metrics, monitor);
                    gpu.refresh();
                    tokio::spawn(gpu.run(Duration::from_millis(args.metrics.metrics_interval_ms)));
                }
                Err(reason) => tracing::info!(%reason, "no GPU metrics"),
            }
        }
        let limits = ConnectionLimits {
            max_connections: METRICS_CONNECTIONS,
            handshake_timeout,
        };
        tokio::spawn(transport::serve(
            Acceptor::new("metrics", listener, limits, None),
            TowerToHyperService::new(endpoint::router(Arc::clone(metrics))),
            args.http.serve_options(&args.grpc, args),
            shutdown.clone().cancelled_owned(),
        ));
        tracing::info!("Started Metrics Service at {local}");
    }

    let service = http::service(
        Arc::clone(server),
        HttpOptions {
            body: BodyLimits {
                max_size: args.http.http_max_input_size,
                timeout: Duration::from_secs(args.http.http_body_timeout_secs),
                kind: SizeLimit::Input,
            },
            budget,
            restricted: protection.http_restricted,
            local_control,
            metrics: Arc::clone(metrics),
        },
        Arc::clone(in_flight),
    );
    let http_local = listeners.http.local_addr()?;
    let http_acceptor = Acceptor::new(
        "http",
        listeners.http,
        args.http.connection_limits(handshake_timeout),
        protection.http_tls,
    );
    let http_task = tokio::spawn(transport::serve(
        http_acceptor,
        service,
        args.http.serve_options(&args.grpc, args),
        shutdown.clone().cancelled_owned(),
    ));
    server.set_ready(true);
    tracing::info!("Started HTTPService at {http_local}");
    Ok(Serving {
        http: http_task,
        grpc: grpc_task,
    })
}

/// The front ends' serving tasks.
struct Serving {
    http: JoinHandle<std::io::Result<()>>,
    grpc: JoinHandle<std::io::Result<()>>,
}

impl Serving {
    /// Resolves once both front ends have closed every connection.
    async fn closed(self) {
        let _ = self.http.await;
        let _ = self.grpc.await;
    }
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
