//! nereid-perf: a KServe v2 load generator (see `nereid_bench::perf`).

use std::process::ExitCode;

use clap::Parser;
use nereid_bench::perf::{self, args::PerfArgs};

#[tokio::main]
async fn main() -> ExitCode {
    let args = PerfArgs::parse();
    match perf::run(args).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nereid-perf: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
