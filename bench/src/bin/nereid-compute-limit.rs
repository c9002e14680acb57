//! nereid-compute-limit: the compute baseline (see `nereid_bench::compute_limit`).

use std::process::ExitCode;

use clap::Parser;
use nereid_bench::compute_limit::{self, ComputeArgs};

fn main() -> ExitCode {
    let args = ComputeArgs::parse();
    match compute_limit::run(&args) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nereid-compute-limit: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
