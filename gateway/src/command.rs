//! The `nereid-gateway` command (its binary, and the `nereid` multicall
//! binary, run [`main`]): discover (or take) the endpoints, listen on
//! the gRPC, HTTP and metrics ports, route.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::activation::Activation;
use crate::args::{Args, PickerKind};
use crate::forward::{Upstream, UpstreamOptions};
use crate::listen::Port;
use crate::memory_budget::MemoryBudget;
use crate::metrics::Metrics;
use crate::namespace_tokens::NamespaceTokens;
use crate::registry::Registry;
use crate::router::Router;
use crate::scale_up::ScaleUp;
use crate::state::Gateway;
use crate::{Ejection, Picker, PowerOfTwoChoices, RoundRobin, admin_front, discovery, http_front, listen};
use anyhow::{Context as _, Result};
use clap::Parser;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Runs the gateway with these command-line arguments (the program's name
/// first, as `std::env::args_os` gives them).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = Args::parse_from(args);
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if args.worker_threads > 0 {
        builder.worker_threads(args.worker_threads);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("nereid-gateway: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("nereid-gateway: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    let picker: Box<dyn Picker> = match args.picker {
        PickerKind::LeastLoaded => {
            let seed = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64);
            Box::new(PowerOfTwoChoices::with_seed(seed))
        }
        PickerKind::RoundRobin => Box::new(RoundRobin::default()),
    };
    // Before anything listens: a token file that cannot be read stops the
    // gateway rather than leaving its namespace open.
    let tokens = NamespaceTokens::load(&args.namespace_tokens, args.require_namespace_tokens)
        .context("cannot read a --namespace-token file")?;
    let router = Router::new(
        Registry::new(args.default_namespace.clone()),
        picker,
        Ejection::default(),
    );
    let gateway = Arc::new(Gateway {
        router: Arc::clone(&router),
        upstream: Upstream::new(UpstreamOptions {
            connect_timeout: args.connect_timeout_ms,
            attempts: args.attempts.max(1),
            max_pod_connections: args.max_pod_connections,
        }),
        metrics: Arc::new(Metrics::new()),
        activation: Activation::new(args.hold_limits()),
        limits: args.limits(),
        budget: MemoryBudget::new(args.max_in_flight_bytes),
        tokens,
        draining: AtomicBool::new(false),
    });

    // Endpoints given on the command line are in the routing table before
    // the ports open: a client that connects as soon as the listening line
    // is printed must find its model, not "unknown model".
    if !args.endpoints.is_empty() {
        serve_static(&router, &args);
    }

    let bind = |port: u16| {
        let address = SocketAddr::new(args.address, port);
        async move {
            TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen on {address}"))
        }
    };
    let http = bind(args.http_port).await?;
    let grpc = bind(args.grpc_port).await?;
    let admin = bind(args.metrics_port).await?;
    tracing::info!(
        http = %http.local_addr()?, grpc = %grpc.local_addr()?, metrics = %admin.local_addr()?,
        picker = ?args.picker, "nereid-gateway listening"
    );
    tracing::info!(limits = ?gateway.limits, max_pod_connections = args.max_pod_connections, "client limits");
    // Which namespaces want a token, never the tokens.
    if gateway.tokens.enforced() {
        let others = if args.require_namespace_tokens {
            "refused"
        } else {
            "open"
        };
        tracing::info!(
            protected = gateway.tokens.protected().join(","),
            others,
            "namespaces take requests only with their bearer token"
        );
    }
    // The metrics port stops last: the probes and Prometheus see the drain.
    let (stop_fronts, stop_admin) = (CancellationToken::new(), CancellationToken::new());
    let fronts = [
        tokio::spawn(listen::serve(
            http,
            Arc::clone(&gateway),
            http_front::serve,
            Port::Http,
            stop_fronts.clone(),
        )),
        tokio::spawn(listen::serve_grpc(grpc, Arc::clone(&gateway), stop_fronts.clone())),
    ];
    let admin = tokio::spawn(listen::serve(
        admin,
        Arc::clone(&gateway),
        admin_front::serve,
        Port::Metrics,
        stop_admin.clone(),
    ));

    if args.endpoints.is_empty() {
        let client = kube::Client::try_default()
            .await
            .context("no Kubernetes cluster found: set KUBECONFIG, run in a pod, or give --endpoint")?;
        match args.namespaces.as_slice() {
            [] => tracing::info!("serving the models of all namespaces"),
            namespaces => tracing::info!(
                namespaces = namespaces.join(","),
                "serving the models of these namespaces"
            ),
        }
        // A model scaled to zero is woken through the same client.
        gateway.activation.set_waker(Arc::new(ScaleUp::new(client.clone())));
        let namespaces = args.namespaces.clone();
        tokio::spawn(async move {
            if let Err(error) = discovery::run(client, &namespaces, router).await {
                tracing::error!(%error, "discovery stopped");
            }
        });
    }

    wait_for_signal().await;
    // A Service keeps sending new connections here for a moment after the
    // pod is deleted (endpoint removal propagates asynchronously): serve
    // them, unready, then close the connections gracefully and let the
    // requests in flight finish.
    tracing::info!(drain_delay = ?args.drain_delay_ms, "shutting down: draining");
    gateway.draining.store(true, Ordering::Relaxed);
    tokio::time::sleep(args.drain_delay_ms).await;
    stop_fronts.cancel();
    let finished = tokio::time::timeout(args.shutdown_timeout_ms, futures::future::join_all(fronts)).await;
    if finished.is_err() {
        tracing::warn!(timeout = ?args.shutdown_timeout_ms, "requests still in flight at the shutdown timeout");
    }
    stop_admin.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(1), admin).await;
    tracing::info!("stopped");
    Ok(())
}

/// The endpoints given on the command line, instead of discovery.
fn serve_static(router: &Router, args: &Args) {
    let mut models: std::collections::BTreeMap<_, Vec<_>> = std::collections::BTreeMap::new();
    for (model, address) in &args.endpoints {
        models.entry(model.clone()).or_default().push(*address);
    }
    router.update(|registry| {
        for (model, addresses) in models {
            tracing::info!(%model, endpoints = addresses.len(), "serving a model at the given endpoints");
            let pods = addresses.len();
            registry.set_endpoints(model, &addresses, pods);
        }
    });
    router.set_synced();
}

async fn wait_for_signal() {
    let mut terminate = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(signal) => signal,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = terminate.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
