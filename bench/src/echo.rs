//! nereid-echo: the transport baseline. A KServe v2 server whose "model"
//! answers every request with its inputs, so nereid-perf against it shows
//! the most a server can do on this machine and protocol with zero compute.
//!
//! # Layout
//!
//! - [`model`] — the signatures it reports and the output names it uses.
//! - [`http`] — bare hyper HTTP/1.1 (binary extension and JSON).
//! - [`grpc`] — bare tonic `GRPCInferenceService`.

pub mod grpc;
pub mod http;
pub mod model;

use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use anyhow::{Context, bail};
use clap::Parser;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::flags::{self, TensorFlag};
use model::EchoModel;

/// A KServe v2 echo server (HTTP and/or gRPC): every infer is answered
/// with its inputs as outputs. Answers for any model name.
#[derive(Debug, Clone, Parser)]
#[command(name = "nereid-echo", version)]
pub struct EchoArgs {
    /// Serve HTTP (KServe v2 JSON + binary extension) on this port (0: any free port).
    #[arg(long)]
    pub http_port: Option<u16>,

    /// Serve gRPC (inference.GRPCInferenceService) on this port (0: any free port).
    #[arg(long)]
    pub grpc_port: Option<u16>,

    /// Address to bind.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub address: IpAddr,

    /// A model input for metadata, NAME:DATATYPE:d1,d2 (repeatable; default INPUT0:FP32:-1,16).
    #[arg(long = "input", value_parser = flags::parse_tensor_flag)]
    pub inputs: Vec<TensorFlag>,

    /// Name of the output echoing input i, in input order (repeatable; default OUTPUTi).
    #[arg(long = "output-name")]
    pub output_names: Vec<String>,
}

/// Binds, prints `listening http=ADDR grpc=ADDR` (`none` for a side not
/// served), and serves until `shutdown`.
pub async fn run(args: EchoArgs, shutdown: CancellationToken) -> anyhow::Result<()> {
    if args.http_port.is_none() && args.grpc_port.is_none() {
        bail!("give --http-port, --grpc-port or both");
    }
    let model = Arc::new(EchoModel::new(args.inputs, args.output_names));
    let bind = |port: Option<u16>| async move {
        match port {
            None => Ok(None),
            Some(port) => {
                let addr = SocketAddr::new(args.address, port);
                let listener = TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding {addr}"))?;
                anyhow::Ok(Some(listener))
            }
        }
    };
    let http = bind(args.http_port).await?;
    let grpc = bind(args.grpc_port).await?;
    let show = |l: &Option<TcpListener>| -> anyhow::Result<String> {
        Ok(match l {
            Some(l) => l.local_addr()?.to_string(),
            None => "none".into(),
        })
    };
    println!("listening http={} grpc={}", show(&http)?, show(&grpc)?);
    std::io::stdout().flush()?;

    let http_task = http.map(|l| tokio::spawn(http::serve(l, model.clone(), shutdown.clone())));
    let grpc_task = grpc.map(|l| tokio::spawn(grpc::serve(l, model.clone(), shutdown.clone())));
    if let Some(task) = http_task {
        task.await?;
    }
    if let Some(task) = grpc_task {
        task.await?.context("gRPC server")?;
    }
    Ok(())
}
