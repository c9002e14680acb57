//! nereid-relay: the proxy floor (see `nereid_bench::relay`).

use std::process::ExitCode;

use clap::Parser;
use nereid_bench::relay::{self, RelayArgs};
use tokio_util::sync::CancellationToken;

/// One thread: the cheapest form of the relay (no cross-thread wake-ups),
/// so what it costs is a floor, not one relay's choice.
#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = RelayArgs::parse();
    let shutdown = CancellationToken::new();
    let trigger = shutdown.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        trigger.cancel();
    });
    match relay::run(args, shutdown).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nereid-relay: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
