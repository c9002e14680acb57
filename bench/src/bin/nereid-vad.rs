//! nereid-vad: real-time VAD streams against a stateful model, and the model run directly (see `nereid_bench::vad`).

use std::process::ExitCode;

use clap::Parser;
use nereid_bench::vad::{self, VadArgs};

#[tokio::main]
async fn main() -> ExitCode {
    let args = VadArgs::parse();
    match vad::run(&args).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nereid-vad: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
