//! nereid-chain: an ensemble against its steps called by the client (see `nereid_bench::chain`).

use std::process::ExitCode;

use clap::Parser;
use nereid_bench::chain::{self, ChainArgs};

#[tokio::main]
async fn main() -> ExitCode {
    let args = ChainArgs::parse();
    match chain::run(&args).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nereid-chain: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
