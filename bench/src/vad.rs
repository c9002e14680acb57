//! nereid-vad: many voice-activity streams at real-time pace against a
//! stateful model in the server, and the same model run directly, in one
//! run on one machine.
//!
//! Each stream is one sequence of the server's Silero VAD model (wrapped by
//! `examples/silero_vad_model.py`): a 32 ms chunk of 16 kHz audio every 32
//! ms, as a microphone delivers it, the server carrying the model's state
//! between chunks and batching the chunks of all streams. Streams start
//! spread over one chunk period, as independent callers would. What is
//! measured is what running it costs: the server's CPU time (user + system
//! from `/proc/<pid>/stat` around the paced run) per second of audio, and
//! whether it keeps up (chunk latency, chunks answered after the next one
//! was due).
//!
//! The baselines run the shipped model in this process with ONNX Runtime
//! on one thread, chunk by chunk with the state and context carried by
//! hand as the silero-vad package does: once a stream at a time (batch 1,
//! what a program without a server does) and once all streams per step
//! (batch = streams, the best a batching server could reach). Their CPU
//! time per second of audio comes from `/proc/self/stat` around each; each
//! runs before the load and after it, and the lower figure counts.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use bytes::Bytes;
use clap::Parser;
use nereid_proto::inference::infer_parameter::ParameterChoice;
use nereid_proto::inference::model_infer_request::InferInputTensor;
use nereid_proto::inference::{InferParameter, ModelInferRequest};
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::Tensor;
use serde::Serialize;

use crate::grpc_client::{self, GrpcClient};
use crate::input_data::SplitMix64;
use crate::latency::LatencySummary;
use crate::process_cpu::ProcessCpu;

const RATE: usize = 16_000;
const CHUNK: usize = 512;
const CONTEXT: usize = 64;
const PERIOD: Duration = Duration::from_millis(32);

#[derive(Debug, Parser)]
#[command(
    name = "nereid-vad",
    about = "Real-time VAD streams against a stateful model in the server, and the model run directly."
)]
pub struct VadArgs {
    /// The server's gRPC address (host:port).
    #[arg(short = 'u', long)]
    pub url: String,
    /// The server's stateful VAD model.
    #[arg(long, default_value = "silero_vad")]
    pub model: String,
    /// The server's process id, whose CPU time is measured.
    #[arg(long)]
    pub server_pid: u32,
    /// Concurrent streams.
    #[arg(long, default_value_t = 256)]
    pub streams: usize,
    /// Audio per stream, in seconds.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// gRPC connections the streams share.
    #[arg(long, default_value_t = 16)]
    pub connections: usize,
    /// The shipped Silero VAD model (silero_vad.onnx), for the baselines.
    #[arg(long)]
    pub direct_model: PathBuf,
    /// ONNX Runtime shared library (libonnxruntime.so.1.3x).
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub onnxruntime_library: PathBuf,
    /// Audio seconds each baseline runs.
    #[arg(long, default_value_t = 60)]
    pub baseline_seconds: u64,
    /// Write the result as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The whole run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct VadResult {
    pub streams: usize,
    pub audio_seconds: f64,
    pub wall_seconds: f64,
    pub chunks: u64,
    pub failed: u64,
    /// Chunks answered after the stream's next chunk was due.
    pub late: u64,
    pub latency: Latency,
    pub server_cpu_seconds: f64,
    pub client_cpu_seconds: f64,
    /// Server CPU milliseconds per second of audio.
    pub server_cpu_ms_per_audio_s: f64,
    pub direct_batch1_cpu_ms_per_audio_s: f64,
    pub direct_batched_cpu_ms_per_audio_s: f64,
    /// server / direct batch 1: below 1, serving costs less than running
    /// the model stream by stream.
    pub ratio_to_direct_batch1: f64,
    pub ratio_to_direct_batched: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Latency {
    pub p50_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
}

/// CPU seconds (user + system) of a process so far.
fn cpu_seconds(process: &ProcessCpu) -> anyhow::Result<f64> {
    Ok(process.used().context("reading a process's CPU time")?.as_secs_f64())
}

/// One stream's audio: noise in 512-sample chunks (the model's cost does
/// not depend on what it hears).
fn chunks(seed: u64, count: usize) -> Vec<Bytes> {
    let mut rng = SplitMix64::new(seed);
    (0..count)
        .map(|_| {
            let samples: Vec<u8> = (0..CHUNK)
                .flat_map(|_| ((rng.next_f64() as f32 - 0.5) * 0.2).to_le_bytes())
                .collect();
            Bytes::from(samples)
        })
        .collect()
}

fn parameter(choice: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(choice),
    }
}

/// What one stream saw.
#[derive(Default)]
struct StreamOutcome {
    latencies: Vec<u64>,
    failed: u64,
    late: u64,
    first_error: Option<String>,
}

async fn stream(
    mut client: GrpcClient,
    model: Arc<String>,
    id: u64,
    start: tokio::time::Instant,
    audio: Vec<Bytes>,
) -> StreamOutcome {
    let mut outcome = StreamOutcome::default();
    let last = audio.len().saturating_sub(1);
    for (i, chunk) in audio.into_iter().enumerate() {
        let due = start + PERIOD * i as u32;
        tokio::time::sleep_until(due).await;
        let mut parameters = std::collections::HashMap::new();
        parameters.insert("sequence_id".to_string(), parameter(ParameterChoice::Uint64Param(id)));
        parameters.insert(
            "sequence_start".to_string(),
            parameter(ParameterChoice::BoolParam(i == 0)),
        );
        parameters.insert(
            "sequence_end".to_string(),
            parameter(ParameterChoice::BoolParam(i == last)),
        );
        let request = ModelInferRequest {
            model_name: model.to_string(),
            inputs: vec![InferInputTensor {
                name: "audio".into(),
                datatype: "FP32".into(),
                shape: vec![1, CHUNK as i64],
                ..Default::default()
            }],
            raw_input_contents: vec![chunk],
            parameters,
            ..Default::default()
        };
        match client.model_infer(request).await {
            Ok(response) if !response.get_ref().raw_output_contents.is_empty() => {
                let took = due.elapsed();
                outcome
                    .latencies
                    .push(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
                if took > PERIOD {
                    outcome.late += 1;
                }
            }
            Ok(_) => {
                outcome.failed += 1;
                outcome
                    .first_error
                    .get_or_insert_with(|| "an answer without output".into());
            }
            Err(status) => {
                outcome.failed += 1;
                outcome
                    .first_error
                    .get_or_insert_with(|| grpc_client::status_error(&status).to_string());
            }
        }
    }
    outcome
}

fn session(args: &VadArgs) -> anyhow::Result<Session> {
    let environment = ort::init_from(&args.onnxruntime_library)
        .map_err(|e| {
            anyhow!(
                "failed to load ONNX Runtime from '{}': {e}",
                args.onnxruntime_library.display()
            )
        })?
        .with_name("nereid-vad")
        .build()
        .map_err(|e| anyhow!("failed to create the ONNX Runtime environment: {e}"))?;
    let builder_error = |e: ort::Error<ort::session::builder::SessionBuilder>| anyhow!("ONNX Runtime: {e}");
    Session::builder(&environment)
        .map_err(|e| anyhow!("ONNX Runtime: {e}"))?
        .with_intra_threads(1)
        .map_err(builder_error)?
        .with_inter_threads(1)
        .map_err(builder_error)?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(builder_error)?
        .commit_from_file(&args.direct_model)
        .map_err(|e| anyhow!("failed to load '{}': {e}", args.direct_model.display()))
}

/// Runs the shipped model directly on `batch` streams at once, chunk step
/// by chunk step, for `seconds` of audio in all; CPU ms per audio second.
fn direct(session: &mut Session, batch: usize, seconds: u64) -> anyhow::Result<f64> {
    let steps = ((seconds as usize * RATE / CHUNK) / batch).max(1);
    let mut rng = SplitMix64::new(99);
    let audio: Vec<f32> = (0..batch * CHUNK)
        .map(|_| (rng.next_f64() as f32 - 0.5) * 0.2)
        .collect();
    let mut state = vec![0f32; 2 * batch * 128];
    let mut context = vec![0f32; batch * CONTEXT];
    let sr = Tensor::from_array(((), vec![RATE as i64])).context("the sample rate tensor")?;
    let me = ProcessCpu::current()?;
    let before = cpu_seconds(&me)?;
    for _ in 0..steps {
        let mut x = Vec::with_capacity(batch * (CONTEXT + CHUNK));
        for b in 0..batch {
            x.extend_from_slice(&context[b * CONTEXT..(b + 1) * CONTEXT]);
            x.extend_from_slice(&audio[b * CHUNK..(b + 1) * CHUNK]);
        }
        for b in 0..batch {
            let row = &x[b * (CONTEXT + CHUNK)..(b + 1) * (CONTEXT + CHUNK)];
            context[b * CONTEXT..(b + 1) * CONTEXT].copy_from_slice(&row[CHUNK..]);
        }
        let input = Tensor::from_array(([batch, CONTEXT + CHUNK], x))?;
        let state_in = Tensor::from_array(([2, batch, 128], std::mem::take(&mut state)))?;
        let outputs = session
            .run(ort::inputs!["input" => input, "state" => state_in, "sr" => &sr])
            .map_err(|e| anyhow!("ONNX Runtime failed to run the VAD model: {e}"))?;
        let (_, next) = outputs["stateN"]
            .try_extract_tensor::<f32>()
            .map_err(|e| anyhow!("stateN: {e}"))?;
        state = next.to_vec();
    }
    let cpu = cpu_seconds(&me)? - before;
    let audio_seconds = (steps * batch * CHUNK) as f64 / RATE as f64;
    Ok(cpu * 1000.0 / audio_seconds)
}

pub async fn run(args: &VadArgs) -> anyhow::Result<VadResult> {
    if args.streams == 0 || args.seconds == 0 {
        bail!("--streams and --seconds must be positive");
    }
    let mut clients = Vec::with_capacity(args.connections.max(1));
    for _ in 0..args.connections.max(1) {
        clients.push(grpc_client::connect(&args.url).await?);
    }
    let per_stream = (args.seconds as usize * RATE) / CHUNK;
    let model = Arc::new(args.model.clone());
    let server = ProcessCpu::of(args.server_pid).with_context(|| format!("reading /proc/{}/stat", args.server_pid))?;
    let client = ProcessCpu::current()?;
    eprintln!(
        "nereid-vad: {} streams x {} chunks ({} s of audio each) at real time",
        args.streams, per_stream, args.seconds
    );
    let audio: Vec<Vec<Bytes>> = (0..args.streams).map(|s| chunks(s as u64 + 1, per_stream)).collect();
    // The baselines run before the load and again after it; the lower of
    // each pair counts, so a noisy moment can only flatter the baseline.
    eprintln!("nereid-vad: baselines, {} s of audio each", args.baseline_seconds);
    let mut session = session(args)?;
    let baseline = |session: &mut Session| -> anyhow::Result<(f64, f64)> {
        Ok((
            direct(session, 1, args.baseline_seconds)?,
            direct(session, args.streams, args.baseline_seconds)?,
        ))
    };
    let (batch1_before, batched_before) = baseline(&mut session)?;
    let server_before = cpu_seconds(&server)?;
    let client_before = cpu_seconds(&client)?;
    let began = Instant::now();
    let start = tokio::time::Instant::now() + Duration::from_millis(100);
    let mut tasks = Vec::with_capacity(args.streams);
    for (s, audio) in audio.into_iter().enumerate() {
        let offset = PERIOD.mul_f64(s as f64 / args.streams as f64);
        let client = clients[s % clients.len()].clone();
        tasks.push(tokio::spawn(stream(
            client,
            Arc::clone(&model),
            s as u64 + 1,
            start + offset,
            audio,
        )));
    }
    let mut latencies = Vec::with_capacity(args.streams * per_stream);
    let (mut failed, mut late) = (0, 0);
    let mut first_error = None;
    for task in tasks {
        let outcome = task.await.context("a stream task")?;
        latencies.extend(outcome.latencies);
        failed += outcome.failed;
        late += outcome.late;
        first_error = first_error.or(outcome.first_error);
    }
    let wall_seconds = began.elapsed().as_secs_f64();
    let server_cpu_seconds = cpu_seconds(&server)? - server_before;
    let client_cpu_seconds = cpu_seconds(&client)? - client_before;
    if let Some(error) = &first_error {
        eprintln!("nereid-vad: {failed} chunks failed; the first: {error}");
    }
    let max_us = latencies.iter().copied().max().unwrap_or(0);
    let summary = LatencySummary::from_samples(&mut latencies);
    let audio_seconds = (args.streams * per_stream * CHUNK) as f64 / RATE as f64;
    let server_cpu_ms_per_audio_s = server_cpu_seconds * 1000.0 / audio_seconds;

    eprintln!("nereid-vad: the baselines again");
    let (batch1_after, batched_after) = baseline(&mut session)?;
    let direct_batch1 = batch1_before.min(batch1_after);
    let direct_batched = batched_before.min(batched_after);
    let result = VadResult {
        streams: args.streams,
        audio_seconds,
        wall_seconds,
        chunks: (args.streams * per_stream) as u64,
        failed,
        late,
        latency: Latency {
            p50_us: summary.p50_us,
            p99_us: summary.p99_us,
            max_us,
        },
        server_cpu_seconds,
        client_cpu_seconds,
        server_cpu_ms_per_audio_s,
        direct_batch1_cpu_ms_per_audio_s: direct_batch1,
        direct_batched_cpu_ms_per_audio_s: direct_batched,
        ratio_to_direct_batch1: server_cpu_ms_per_audio_s / direct_batch1,
        ratio_to_direct_batched: server_cpu_ms_per_audio_s / direct_batched,
    };
    println!("{}", table(&result));
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(result)
}

pub fn table(r: &VadResult) -> String {
    format!(
        "| | CPU ms per audio second | vs direct, batch 1 |\n\
         |---|---|---|\n\
         | nereid-server, {} streams at real time | {:.2} | {:.2}x |\n\
         | ONNX Runtime directly, one stream at a time (batch 1) | {:.2} | 1.00x |\n\
         | ONNX Runtime directly, all streams per step (batch {}) | {:.2} | {:.2}x |\n\n\
         {} chunks, {} failed, {} late (answered after the next chunk was due); latency p50 {} us, p99 {} us, max {} us; \
         client CPU {:.1} s for {:.0} s of wall time",
        r.streams,
        r.server_cpu_ms_per_audio_s,
        r.ratio_to_direct_batch1,
        r.direct_batch1_cpu_ms_per_audio_s,
        r.streams,
        r.direct_batched_cpu_ms_per_audio_s,
        r.direct_batched_cpu_ms_per_audio_s / r.direct_batch1_cpu_ms_per_audio_s,
        r.chunks,
        r.failed,
        r.late,
        r.latency.p50_us,
        r.latency.p99_us,
        r.latency.max_us,
        r.client_cpu_seconds,
        r.wall_seconds,
    )
}
