//! An ensemble against the same models called one after another by the
//! client: the benchmark that shows what running the DAG in the server saves.
//!
//! Both modes run the same closed loop over gRPC at each concurrency, every
//! worker on its own connection, for the same window after a warm-up:
//!
//! - `ensemble`: one call to the ensemble per request;
//! - `chain`: one call to each step model in turn, the client feeding each
//!   answer's output into the next call's input, as a client without
//!   ensembles must.
//!
//! The step models' tensor names come from their metadata (first input,
//! first output), so any chain of one-input, one-output models works.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use nereid_proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use nereid_proto::inference::{ModelInferRequest, ModelMetadataRequest};
use serde::Serialize;
use tokio::sync::Barrier;

use crate::error::{Error, Result};
use crate::grpc_client::{self, GrpcClient};
use crate::latency::LatencySummary;

#[derive(Debug, Parser)]
#[command(
    name = "nereid-chain",
    about = "An ensemble against its steps called one after another by the client, same run."
)]
pub struct ChainArgs {
    /// The server's gRPC address (host:port).
    #[arg(short = 'u', long)]
    pub url: String,
    /// The ensemble model.
    #[arg(long)]
    pub ensemble: String,
    /// Its steps, in order, comma-separated (one input and one output each).
    #[arg(long, value_delimiter = ',', required = true)]
    pub steps: Vec<String>,
    /// Elements of the FP32 [1, N] input.
    #[arg(long, default_value_t = 256)]
    pub elements: usize,
    #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
    pub concurrency_list: Vec<usize>,
    /// The measured window per mode and concurrency, in milliseconds.
    #[arg(long, default_value_t = 3000)]
    pub duration_ms: u64,
    /// Where to write the results as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
}

/// One mode at one concurrency.
#[derive(Debug, Clone, Serialize)]
pub struct ChainResult {
    pub mode: &'static str,
    pub concurrency: usize,
    pub requests: u64,
    pub throughput: f64,
    pub p50_us: u64,
    pub p99_us: u64,
}

/// A model call: its name and its tensor names.
#[derive(Debug, Clone)]
struct Call {
    model: String,
    input: String,
    output: String,
}

pub async fn run(args: &ChainArgs) -> Result<Vec<ChainResult>> {
    let mut probe = grpc_client::connect(&args.url).await?;
    let ensemble = call_of(&mut probe, &args.ensemble).await?;
    let mut steps = Vec::new();
    for step in &args.steps {
        steps.push(call_of(&mut probe, step).await?);
    }
    let data: Bytes = (0..args.elements)
        .flat_map(|i| ((i % 17) as f32 / 17.0).to_le_bytes())
        .collect::<Vec<u8>>()
        .into();
    let window = Duration::from_millis(args.duration_ms);
    let mut results = Vec::new();
    for &concurrency in &args.concurrency_list {
        for (mode, calls) in [("ensemble", vec![ensemble.clone()]), ("chain", steps.clone())] {
            let result = measure(args, mode, &calls, concurrency, &data, window).await?;
            println!(
                "{mode:>8} c={concurrency:<3} {:>9.1} req/s  p50 {:>6} us  p99 {:>6} us  ({} requests)",
                result.throughput, result.p50_us, result.p99_us, result.requests
            );
            results.push(result);
        }
    }
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&results).map_err(|e| Error::Invalid(e.to_string()))?;
        std::fs::write(path, text).map_err(|e| Error::Invalid(format!("{}: {e}", path.display())))?;
    }
    Ok(results)
}

/// The first input and output of `model`, from its metadata.
async fn call_of(client: &mut GrpcClient, model: &str) -> Result<Call> {
    let metadata = client
        .model_metadata(ModelMetadataRequest {
            name: model.to_string(),
            version: String::new(),
        })
        .await
        .map_err(|s| grpc_client::status_error(&s))?
        .into_inner();
    let (Some(input), Some(output)) = (metadata.inputs.first(), metadata.outputs.first()) else {
        return Err(Error::Invalid(format!("model '{model}' has no input or no output")));
    };
    Ok(Call {
        model: model.to_string(),
        input: input.name.clone(),
        output: output.name.clone(),
    })
}

/// A closed loop of `concurrency` workers making `calls` per request:
/// warmed up for a tenth of the window, then measured for the window.
async fn measure(
    args: &ChainArgs,
    mode: &'static str,
    calls: &[Call],
    concurrency: usize,
    data: &Bytes,
    window: Duration,
) -> Result<ChainResult> {
    let barrier = Arc::new(Barrier::new(concurrency));
    let mut workers = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        let client = grpc_client::connect(&args.url).await?;
        let (calls, data, barrier, elements) = (calls.to_vec(), data.clone(), barrier.clone(), args.elements);
        workers.push(tokio::spawn(async move {
            worker(client, &calls, data, elements, barrier, window).await
        }));
    }
    let mut latencies = Vec::new();
    for worker in workers {
        latencies.extend(worker.await.map_err(|e| Error::Invalid(e.to_string()))??);
    }
    let requests = latencies.len() as u64;
    let summary = LatencySummary::from_samples(&mut latencies);
    Ok(ChainResult {
        mode,
        concurrency,
        requests,
        throughput: requests as f64 / window.as_secs_f64(),
        p50_us: summary.p50_us,
        p99_us: summary.p99_us,
    })
}

async fn worker(
    mut client: GrpcClient,
    calls: &[Call],
    data: Bytes,
    elements: usize,
    barrier: Arc<Barrier>,
    window: Duration,
) -> Result<Vec<u64>> {
    barrier.wait().await;
    let warm_until = Instant::now() + window / 10;
    let stop = warm_until + window;
    let mut latencies = Vec::new();
    loop {
        let started = Instant::now();
        if started >= stop {
            return Ok(latencies);
        }
        let mut tensor = data.clone();
        for call in calls {
            tensor = infer(&mut client, call, tensor, elements).await?;
        }
        if started >= warm_until && Instant::now() <= stop {
            latencies.push(started.elapsed().as_micros() as u64);
        }
    }
}

/// One call with an FP32 [1, elements] input; its first output's bytes.
async fn infer(client: &mut GrpcClient, call: &Call, data: Bytes, elements: usize) -> Result<Bytes> {
    let request = ModelInferRequest {
        model_name: call.model.clone(),
        inputs: vec![InferInputTensor {
            name: call.input.clone(),
            datatype: "FP32".into(),
            shape: vec![1, elements as i64],
            ..Default::default()
        }],
        outputs: vec![InferRequestedOutputTensor {
            name: call.output.clone(),
            ..Default::default()
        }],
        raw_input_contents: vec![data],
        ..Default::default()
    };
    let answer = client
        .model_infer(request)
        .await
        .map_err(|s| grpc_client::status_error(&s))?
        .into_inner();
    answer
        .raw_output_contents
        .into_iter()
        .next()
        .ok_or_else(|| Error::Invalid(format!("model '{}' answered no output", call.model)))
}
