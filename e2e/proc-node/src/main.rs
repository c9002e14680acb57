//! # nereid-proc-node
//!
//! The e2e cluster's process-backed node: a kubelet stand-in that registers
//! Node objects and runs the pods bound to them as local processes, so
//! inference, metrics and routing can be tested through pods the operator
//! made, on machines without a container engine. What the API server and
//! the controllers observe (nodes, leases, pod status, probes, deletion) is
//! what a kubelet would produce; what differs underneath is in README.md.
//!
//! ## Layout
//!
//! ```text
//! main        flags, start (bridges, nodes, pod watches), shutdown
//! network     a bridge per node, a network namespace and veth per pod
//! node        Node objects, their Lease and Ready heartbeat
//! pods        one supervisor per pod: admit, init containers, containers, delete
//! container   one container: process, probes, restarts with back-off, graceful stop
//! plan        a container's program, arguments, environment and paths
//! volumes     emptyDir, configMap, secret and projected volumes as files
//! process     one container's process: spawn, logs, signals, exit
//! probe       httpGet, tcpSocket, grpc and exec probes
//! grpc_probe  grpc.health.v1 Check, as the kubelet's gRPC probe
//! status      pod status as a kubelet writes it
//! ```

mod container;
mod grpc_probe;
mod network;
mod node;
mod plan;
mod pods;
mod probe;
mod process;
mod status;
mod volumes;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;

use crate::network::PodNetwork;
use crate::node::NodeSpec;
use crate::pods::Runner;

/// Runs pods bound to this host's process nodes as local processes.
#[derive(Debug, Parser)]
struct Args {
    /// The cluster's admin kubeconfig.
    #[arg(long)]
    kubeconfig: PathBuf,
    /// Nodes to register: `name` or `name:gpu=N` (N GPUs, with the taint).
    #[arg(long, value_delimiter = ',', default_value = "proc-0,proc-1,proc-gpu-0:gpu=4")]
    nodes: Vec<NodeSpec>,
    /// Pod IPs: one /24 per node out of this /16, on the node's bridge.
    #[arg(long, default_value = "10.244.0.0/16")]
    cidr: String,
    /// Where the binaries of Nereid's images are (nereid-server, ...).
    #[arg(long)]
    bin_dir: PathBuf,
    /// Images whose reference contains this run from --bin-dir; others are refused.
    #[arg(long, default_value = "nereid")]
    image_pattern: String,
    /// Per-pod roots (volumes, logs) go here.
    #[arg(long)]
    state_dir: PathBuf,
    /// The API server as pods reach it (host:port): the `kubernetes`
    /// Service's ClusterIP in a cluster with kube-proxy.
    #[arg(long)]
    api_server: String,
    /// The API server's CA certificate, given to pods with their token.
    #[arg(long)]
    api_ca: PathBuf,
    /// Stop after this many seconds whatever happens.
    #[arg(long, default_value_t = 2400)]
    max_seconds: u64,
    /// The first CrashLoopBackOff delay in seconds (the kubelet's is 10),
    /// doubled at each restart up to 5 minutes.
    #[arg(long, default_value_t = 10)]
    backoff_seconds: u64,
    /// The cluster's DNS server (the kube-dns Service), in every pod's resolv.conf.
    #[arg(long, default_value = "10.96.0.10")]
    cluster_dns: Ipv4Addr,
    /// The cluster's DNS domain, searched from every pod's resolv.conf.
    #[arg(long, default_value = "cluster.local")]
    cluster_domain: String,
}

fn main() -> Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(run(args))
}

async fn run(args: Args) -> Result<()> {
    // First, so that a node started in the wrong namespace changes nothing.
    let network = PodNetwork::claim(&args.cidr, args.nodes.len(), args.cluster_dns, &args.cluster_domain).await?;
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::read_from(&args.kubeconfig).context("reading the kubeconfig")?,
        &Default::default(),
    )
    .await
    .context("loading the kubeconfig")?;
    let client = kube::Client::try_from(config).context("building the API client")?;
    tokio::fs::create_dir_all(&args.state_dir).await?;
    let runner = Arc::new(Runner::new(pods::RunnerConfig {
        client: client.clone(),
        bin_dir: args.bin_dir.clone(),
        image_pattern: args.image_pattern.clone(),
        state_dir: args.state_dir.clone(),
        api_server: args.api_server.clone(),
        api_ca: args.api_ca.clone(),
        network: network.clone(),
        backoff: Duration::from_secs(args.backoff_seconds.max(1)),
    }));

    for (index, spec) in args.nodes.iter().enumerate() {
        node::register(&client, spec, &network.node_ip(index)).await?;
        tokio::spawn(node::heartbeat(client.clone(), spec.name.clone()));
        tokio::spawn(Arc::clone(&runner).watch(spec.name.clone(), index));
    }
    println!("ready");
    tracing::info!(nodes = args.nodes.len(), cidr = %args.cidr, "process nodes registered");

    // Stop on SIGTERM/SIGINT (e2e/cluster.sh's teardown) or after
    // --max-seconds. Every process started dies with this one anyway
    // (PR_SET_PDEATHSIG), should it be killed outright.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT"),
        () = tokio::time::sleep(Duration::from_secs(args.max_seconds)) => tracing::info!("ran out of time"),
    }
    runner.stop_all().await;
    network.release_all().await;
    tracing::info!("stopped");
    Ok(())
}
