//! nereid-perf's command line, named after perf_analyzer's flags where
//! they exist.

use std::path::PathBuf;

use clap::{ArgGroup, Parser};

use crate::flags::{self, DatatypeFlag, ShapeFlag};
use crate::input_data::DataMode;
use crate::perf::range::Range;
use crate::request::Protocol;

fn concurrency_range(s: &str) -> Result<Range, String> {
    Range::parse(s, true)
}

fn rate_range(s: &str) -> Result<Range, String> {
    Range::parse(s, false)
}

/// A load generator for KServe v2 inference servers (HTTP and gRPC), in
/// the spirit of Triton's perf_analyzer.
#[derive(Debug, Clone, Parser)]
#[command(name = "nereid-perf", version)]
#[command(group(ArgGroup::new("closed").args(["concurrency_range", "concurrency_list"]).multiple(true)))]
#[command(group(ArgGroup::new("open").args(["request_rate_range"]).conflicts_with("closed")))]
pub struct PerfArgs {
    /// Server address, host:port (default 127.0.0.1:8000 for HTTP, :8001 for gRPC).
    #[arg(short = 'u', long)]
    pub url: Option<String>,

    /// Model name.
    #[arg(short = 'm', long)]
    pub model: String,

    /// Model version (empty: the server's choice).
    #[arg(long, default_value = "")]
    pub model_version: String,

    /// Wire protocol.
    #[arg(short = 'i', long, value_enum, default_value = "http")]
    pub protocol: Protocol,

    /// HTTP: send and request JSON `data` instead of Triton's binary tensor extension.
    #[arg(long)]
    pub http_json: bool,

    /// gRPC: use the bidirectional ModelStreamInfer RPC, one stream per worker.
    #[arg(long)]
    pub streaming: bool,

    /// gRPC: every worker shares one HTTP/2 connection, as one application
    /// with one client does (what a per-request balancer must spread).
    #[arg(long, conflicts_with = "streaming")]
    pub one_connection: bool,

    /// Batch size: replaces a variable first dimension of metadata shapes.
    #[arg(short = 'b', long, default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..))]
    pub batch_size: i64,

    /// An input's shape, NAME:d1,d2,... (repeatable); overrides the metadata.
    #[arg(long = "shape", value_parser = flags::parse_shape_flag)]
    pub shapes: Vec<ShapeFlag>,

    /// An input's datatype, NAME:FP32 (repeatable); overrides the metadata.
    #[arg(long = "datatype", value_parser = flags::parse_datatype_flag)]
    pub datatypes: Vec<DatatypeFlag>,

    /// An output to request and expect (repeatable; default: the metadata's outputs).
    #[arg(long = "output")]
    pub outputs: Vec<String>,

    /// Inputs from a KServe-style JSON file {"inputs":[{"name","shape","datatype","data"}]}.
    #[arg(long)]
    pub input_data: Option<PathBuf>,

    /// Generated input values (fixed seed).
    #[arg(long, value_enum, default_value = "random")]
    pub data: DataMode,

    /// Closed loop: concurrent workers, start:end:step (default 1).
    #[arg(long, value_parser = concurrency_range)]
    pub concurrency_range: Option<Range>,

    /// Closed loop: explicit concurrency levels, e.g. 1,8,32,64 (takes precedence over --concurrency-range).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..))]
    pub concurrency_list: Vec<u32>,

    /// Open loop: requests per second, start:end:step.
    #[arg(long, value_parser = rate_range)]
    pub request_rate_range: Option<Range>,

    /// Open loop: most requests (and connections) in flight at once.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub max_inflight: u32,

    /// Measurement window, in milliseconds.
    #[arg(short = 'p', long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(10..))]
    pub measurement_interval: u64,

    /// Load applied before each level's first window, in milliseconds.
    #[arg(long, default_value_t = 500)]
    pub warmup: u64,

    /// Stable when the last 3 windows' throughputs are within this percentage.
    #[arg(short = 's', long, default_value_t = 10.0)]
    pub stability_percentage: f64,

    /// Most windows per level.
    #[arg(short = 'r', long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub max_trials: u64,

    /// Timeout of every request (and connect), in milliseconds.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub request_timeout_ms: u64,

    /// Write the results as a JSON array here.
    #[arg(long)]
    pub json: Option<PathBuf>,

    /// The server's process id (same machine): report its CPU time per
    /// successful request, its child processes' included (a Python model's
    /// stubs), read from `/proc/*/stat` around each window.
    #[arg(long)]
    pub server_pid: Option<u32>,

    /// Write the results as CSV here.
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

impl PerfArgs {
    /// The server address, defaulted by protocol.
    pub fn url(&self) -> String {
        self.url.clone().unwrap_or_else(|| match self.protocol {
            Protocol::Http => "127.0.0.1:8000".into(),
            Protocol::Grpc => "127.0.0.1:8001".into(),
        })
    }

    /// The closed-loop levels: the list, else the range, else 1.
    pub fn concurrency_levels(&self) -> Vec<usize> {
        if !self.concurrency_list.is_empty() {
            return self.concurrency_list.iter().map(|&c| c as usize).collect();
        }
        match &self.concurrency_range {
            Some(range) => range.levels().into_iter().map(|c| c as usize).collect(),
            None => vec![1],
        }
    }

    /// Flag combinations clap cannot express.
    pub fn validate(&self) -> Result<(), String> {
        if self.streaming && self.protocol != Protocol::Grpc {
            return Err("--streaming needs --protocol grpc".into());
        }
        if self.http_json && self.protocol != Protocol::Http {
            return Err("--http-json needs --protocol http".into());
        }
        if self.stability_percentage.is_nan() || self.stability_percentage <= 0.0 {
            return Err("--stability-percentage must be positive".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[test]
    fn defaults_and_flags() {
        let a = PerfArgs::try_parse_from(["nereid-perf", "-m", "simple"]).unwrap();
        assert_eq!(a.url(), "127.0.0.1:8000");
        assert_eq!(a.batch_size, 1);
        assert_eq!(a.measurement_interval, 2000);
        assert_eq!(a.max_trials, 10);
        assert_eq!(a.request_timeout_ms, 10_000);
        assert_eq!(a.data, DataMode::Random);
        a.validate().unwrap();

        let a = PerfArgs::try_parse_from([
            "nereid-perf",
            "-m",
            "m",
            "--protocol",
            "grpc",
            "--streaming",
            "--shape",
            "X:2,3",
            "--shape",
            "Y:1",
            "--datatype",
            "X:INT64",
            "--concurrency-range",
            "1:8:2",
        ])
        .unwrap();
        assert_eq!(a.url(), "127.0.0.1:8001");
        assert_eq!(a.shapes.len(), 2);
        assert_eq!(a.concurrency_levels(), vec![1, 3, 5, 7]);
        a.validate().unwrap();
    }

    #[test]
    fn concurrency_list_wins_over_range() {
        let a = PerfArgs::try_parse_from([
            "nereid-perf",
            "-m",
            "m",
            "--concurrency-range",
            "1:64:1",
            "--concurrency-list",
            "1,8,32,64",
        ])
        .unwrap();
        assert_eq!(a.concurrency_levels(), vec![1, 8, 32, 64]);
        let a = PerfArgs::try_parse_from(["nereid-perf", "-m", "m"]).unwrap();
        assert_eq!(a.concurrency_levels(), vec![1]);
    }

    #[test]
    fn rejects_conflicts() {
        assert!(
            PerfArgs::try_parse_from([
                "nereid-perf",
                "-m",
                "m",
                "--concurrency-range",
                "1",
                "--request-rate-range",
                "10",
            ])
            .is_err()
        );
        assert!(
            PerfArgs::try_parse_from([
                "nereid-perf",
                "-m",
                "m",
                "--concurrency-list",
                "1,2",
                "--request-rate-range",
                "10"
            ])
            .is_err()
        );
        let a = PerfArgs::try_parse_from(["nereid-perf", "-m", "m", "--streaming"]).unwrap();
        assert!(a.validate().is_err());
        assert!(PerfArgs::try_parse_from(["nereid-perf", "-m", "m", "-b", "0"]).is_err());
        assert!(PerfArgs::try_parse_from(["nereid-perf", "-m", "m", "--concurrency-range", "1.5"]).is_err());
    }
}
