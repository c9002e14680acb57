//! The `nereid-operator` command (its binary, and the `nereid` multicall
//! binary, run [`main`]): connect, elect, serve health, reconcile.

use std::ffi::OsString;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::args::Args;
use crate::autoscaling::scraper::{self, Board};
use crate::context::Context;
use crate::external_scaler::Scaler;
use crate::external_scaler::scope::{Scope, Watched};
use crate::leader::LeaderElector;
use crate::metrics::Metrics;
use crate::{controller, external_metrics, external_scaler, health};
use anyhow::{Context as _, Result, bail};
use clap::Parser;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;

/// Runs the operator with these command-line arguments (the program's name
/// first, as `std::env::args_os` gives them).
pub fn main(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let args = Args::parse_from(args);
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("nereid-operator: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nereid-operator: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<()> {
    // Settings that cannot work fail before anything starts.
    let keda_scaler = args.autoscaling.keda_scaler().map_err(anyhow::Error::msg)?;
    let client = Client::try_default()
        .await
        .context("no Kubernetes cluster found: set KUBECONFIG or run in a pod with a service account")?;
    let version = tokio::time::timeout(Duration::from_secs(10), client.apiserver_version())
        .await
        .context("the Kubernetes API server did not answer within 10 s")?
        .context("cannot reach the Kubernetes API server")?;
    tracing::info!(version = %version.git_version, "connected to the Kubernetes API server");
    match args.watched_namespaces() {
        Some(namespaces) => tracing::info!(namespaces = namespaces.join(","), "watching these namespaces"),
        None => tracing::info!("watching all namespaces"),
    }

    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            wait_for_signal().await;
            tracing::info!("shutting down");
            stop.cancel();
        }
    });

    let metrics = Arc::new(Metrics::new());
    let ready = Arc::new(AtomicBool::new(false));
    let health_task = tokio::spawn(health::serve(
        args.metrics_address,
        health::router(metrics.clone(), ready.clone()),
        stop.clone().cancelled_owned(),
    ));

    // Every replica scrapes and serves the external metrics API, standbys
    // included: the APIService's Service may send the API server to any.
    let board = Arc::new(Board::default());
    let scrape_task = tokio::spawn(scraper::run(
        client.clone(),
        args.watched_namespaces(),
        args.autoscaling.scrape_settings(),
        board.clone(),
        metrics.clone(),
        stop.clone(),
    ));
    let window_secs = args.autoscaling.metrics_window_secs;
    let external_metrics_task = match args.autoscaling.external_metrics() {
        Some(settings) => Some(external_metrics::start(&client, settings, board.clone(), window_secs, &stop).await?),
        None => None,
    };
    let keda_task = match keda_scaler {
        Some(settings) => {
            // It answers for the models of the watched namespaces only.
            let namespaces = args.watched_namespaces();
            let models = Watched::start(&client, namespaces.as_deref(), &stop, Duration::from_secs(30)).await;
            let scope = Scope::new(namespaces, Arc::new(models));
            let poll = args.autoscaling.scrape_settings().interval;
            Some(external_scaler::start(settings, Scaler::new(board.clone(), poll, scope), &stop).await?)
        }
        None => None,
    };

    let identity = args.election.identity();
    let (leading_tx, mut leading) = tokio::sync::watch::channel(args.election.disable_leader_election);
    let election = if args.election.disable_leader_election {
        None
    } else {
        let elector = LeaderElector::new(
            client.clone(),
            &args.election.lease_namespace,
            &args.election.lease_name,
            &identity,
            args.election.lease_duration(),
        );
        Some(tokio::spawn(elector.run(leading_tx, stop.clone())))
    };
    ready.store(true, Ordering::Release);

    // Standby until we lead (or are told to stop).
    tokio::select! {
        () = stop.cancelled() => {}
        _ = leading.wait_for(|l| *l) => {}
    }
    let mut outcome = Ok(());
    if !stop.is_cancelled() {
        tracing::info!(%identity, "leading: reconciling");
        metrics.set_leader(true);
        let context = Arc::new(Context {
            client: client.clone(),
            metrics: metrics.clone(),
            board: board.clone(),
            config: args.operator_config(),
            recorder: Recorder::new(
                client.clone(),
                Reporter {
                    controller: "nereid-operator".into(),
                    instance: Some(identity.clone()),
                },
            ),
        });
        // Reconcile until asked to stop or until the lease is lost: a
        // replica that lost its lease must stop writing at once.
        let lost = CancellationToken::new();
        let controller_stop = {
            let (stop, lost) = (stop.clone(), lost.clone());
            async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    _ = leading.wait_for(|l| !*l) => lost.cancel(),
                }
            }
        };
        controller::run(context, args.watched_namespaces(), controller_stop).await;
        metrics.set_leader(false);
        if lost.is_cancelled() {
            outcome = Err(anyhow::anyhow!(
                "lost the leader lease; exiting so that a fresh start can compete again"
            ));
            stop.cancel();
        }
    }
    if let Some(election) = election {
        let _ = election.await;
    }
    let _ = scrape_task.await;
    for task in [external_metrics_task, keda_task].into_iter().flatten() {
        let _ = task.await;
    }
    let _ = health_task.await;
    if let Err(e) = outcome {
        bail!(e);
    }
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
async fn wait_for_signal() {
    let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
