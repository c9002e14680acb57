//! nereid-perf: measure a KServe v2 server under closed- or open-loop load.
//!
//! The run, in order: resolve the inputs (server metadata refined by
//! flags, or an input-data file), encode the request once, send one probe
//! request so a misconfigured run fails in a second with the server's own
//! message rather than after a full sweep, then measure each level of the
//! sweep and write the results.
//!
//! # Layout
//!
//! - [`args`] — the command line.
//! - [`range`] — `start:end:step` sweeps.
//! - [`recorder`] — where workers record outcomes.
//! - [`sender`] — one bounded, recorded request on a worker's connection.
//! - [`closed_loop`] / [`open_loop`] — the two load modes.
//! - [`measure`] and [`stability`] — windows until stable.
//! - [`report`] — table, JSON and CSV.

pub mod args;
pub mod closed_loop;
pub mod measure;
pub mod open_loop;
pub mod range;
pub mod recorder;
pub mod report;
pub mod sender;
pub mod stability;

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};

use crate::connection::{Connection, Endpoint};
use crate::error::Error;
use crate::input_data;
use crate::metadata::{self, ModelMeta};
use crate::request::{PreparedRequest, Protocol, RequestTarget};
use crate::tensor::InputTensor;
use args::PerfArgs;
use measure::MeasureConfig;
use recorder::Recorder;
use report::{Level, LevelResult};
use sender::Sender;

/// Runs the whole sweep; prints progress to stderr and the table to stdout.
pub async fn run(args: PerfArgs) -> anyhow::Result<Vec<LevelResult>> {
    args.validate().map_err(anyhow::Error::msg)?;
    let url = args.url();
    let timeout = Duration::from_millis(args.request_timeout_ms);

    let meta = fetch_metadata(&args, &url, timeout).await?;
    let inputs = build_inputs(&args, meta.as_ref())?;
    let outputs = if args.outputs.is_empty() {
        meta.as_ref()
            .map(|m| m.outputs.iter().map(|t| t.name.clone()).collect())
            .unwrap_or_default()
    } else {
        args.outputs.clone()
    };
    let target = RequestTarget {
        protocol: args.protocol,
        model: &args.model,
        version: &args.model_version,
        http_json: args.http_json,
    };
    let request = Arc::new(PreparedRequest::new(&target, &inputs, outputs)?);
    let endpoint = Arc::new(Endpoint {
        url: url.clone(),
        protocol: args.protocol,
        streaming: args.streaming,
        shared: match (args.one_connection, args.protocol) {
            (true, Protocol::Grpc) => Some(crate::grpc_client::Infer::connect(&url).await?),
            _ => None,
        },
    });
    probe(&endpoint, &request, timeout).await?;

    let config = MeasureConfig {
        interval: Duration::from_millis(args.measurement_interval),
        warmup: Duration::from_millis(args.warmup),
        stability_pct: args.stability_percentage,
        max_trials: args.max_trials as usize,
        server_cpu: args
            .server_pid
            .map(|pid| {
                crate::process_cpu::ProcessCpu::tree_of(pid).with_context(|| format!("reading /proc/{pid}/stat"))
            })
            .transpose()?,
    };
    let levels: Vec<Level> = match &args.request_rate_range {
        Some(rates) => rates.levels().into_iter().map(Level::RequestRate).collect(),
        None => args.concurrency_levels().into_iter().map(Level::Concurrency).collect(),
    };
    let protocol = if args.streaming {
        "grpc-stream"
    } else {
        args.protocol.as_str()
    };
    eprintln!(
        "nereid-perf: {protocol} {url} model '{}' inputs {}",
        args.model,
        describe(&inputs)
    );

    let mut rows = Vec::with_capacity(levels.len());
    for level in levels {
        let sender = Sender {
            endpoint: endpoint.clone(),
            request: request.clone(),
            recorder: Arc::new(Recorder::new()),
            timeout,
        };
        let m = match level {
            Level::Concurrency(c) => closed_loop::run_level(&sender, c, &config).await,
            Level::RequestRate(r) => open_loop::run_level(&sender, r, args.max_inflight as usize, &config).await,
        };
        let row = LevelResult::new(protocol, level, &m);
        eprintln!(
            "  {}: {:.1} infer/s, p50 {} us, p99 {} us, {} errors{}{}",
            level,
            row.throughput,
            row.p50_us,
            row.p99_us,
            row.errors,
            row.server_cpu_us_per_request
                .map(|us| format!(", server CPU {us:.1} us/request"))
                .unwrap_or_default(),
            if row.stable { "" } else { " (unstable)" }
        );
        rows.push(row);
    }

    print!("{}", report::table(&rows));
    if let Some(path) = &args.json {
        std::fs::write(path, report::json(&rows)).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.csv {
        std::fs::write(path, report::csv(&rows)).with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(rows)
}

/// Model metadata, or `None` when the server gives none but the flags or
/// input file describe every input anyway.
async fn fetch_metadata(args: &PerfArgs, url: &str, timeout: Duration) -> anyhow::Result<Option<ModelMeta>> {
    let fetch = async {
        match args.protocol {
            Protocol::Http => metadata::fetch_http(url, &args.model, &args.model_version).await,
            Protocol::Grpc => metadata::fetch_grpc(url, &args.model, &args.model_version).await,
        }
    };
    let result = tokio::time::timeout(timeout, fetch)
        .await
        .unwrap_or(Err(Error::Timeout(args.request_timeout_ms)));
    match result {
        Ok(meta) => Ok(Some(meta)),
        Err(e) if args.input_data.is_some() || !args.shapes.is_empty() => {
            eprintln!("nereid-perf: no model metadata ({e}); using the flags alone");
            Ok(None)
        }
        Err(e) => bail!("cannot read the metadata of model '{}' at {url}: {e}", args.model),
    }
}

fn build_inputs(args: &PerfArgs, meta: Option<&ModelMeta>) -> anyhow::Result<Vec<InputTensor>> {
    if let Some(path) = &args.input_data {
        return Ok(input_data::load_input_file(path)?);
    }
    let specs = metadata::resolve_inputs(meta, &args.shapes, &args.datatypes, args.batch_size)?;
    specs
        .iter()
        .map(|s| input_data::generate(&s.name, s.datatype, &s.shape, args.data).map_err(Into::into))
        .collect()
}

/// One request before any load: fail fast and clearly.
async fn probe(endpoint: &Endpoint, request: &PreparedRequest, timeout: Duration) -> anyhow::Result<()> {
    let attempt = async {
        let mut conn = Connection::open(endpoint).await?;
        conn.infer(request).await
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => bail!("the first request failed: {e}"),
        Err(_) => bail!("the first request got no answer within {} ms", timeout.as_millis()),
    }
}

fn describe(inputs: &[InputTensor]) -> String {
    inputs
        .iter()
        .map(|t| format!("{}:{}{:?}", t.name, t.datatype, t.shape))
        .collect::<Vec<_>>()
        .join(" ")
}
