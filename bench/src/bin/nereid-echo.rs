//! nereid-echo: the transport baseline (see `nereid_bench::echo`).

use std::process::ExitCode;

use clap::Parser;
use nereid_bench::echo::{self, EchoArgs};
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> ExitCode {
    let args = EchoArgs::parse();
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        trigger.cancel();
    });
    match echo::run(args, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nereid-echo: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
