//! nereid-compute-limit: the compute baseline. Runs an ONNX model
//! in-process through ONNX Runtime, back to back on one thread (with the
//! given intra-op threads), for each batch size; no network, no
//! serialisation, no queueing. With `--sessions N` it runs N sessions side
//! by side, each on its own thread, as a server model with N instances
//! runs. A server can at best approach these numbers, so the gap to
//! nereid-perf's shows what serving costs.
//!
//! The model must take one FP32 input shaped `[batch, features...]`; the
//! batch dimension must be variable (or equal the batch size asked for).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use clap::Parser;
use ort::environment::Environment;
use ort::session::Session;
use ort::session::builder::GraphOptimizationLevel;
use ort::value::{Tensor, TensorElementType};
use serde::Serialize;

use crate::input_data::SplitMix64;
use crate::latency::LatencySummary;

fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Measures an ONNX model's throughput in-process, per batch size.
#[derive(Debug, Clone, Parser)]
#[command(name = "nereid-compute-limit", version)]
pub struct ComputeArgs {
    /// The ONNX model file.
    #[arg(long)]
    pub model: PathBuf,

    /// ONNX Runtime shared library (libonnxruntime.so.1.3x).
    #[arg(long, env = "ORT_DYLIB_PATH")]
    pub onnxruntime_library: Option<PathBuf>,

    /// Batch sizes to measure.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64",
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    pub batch_sizes: Vec<u32>,

    /// ONNX Runtime intra-op threads (default: number of cores).
    #[arg(long, default_value_t = default_threads())]
    pub intra_op_threads: usize,

    /// Independent sessions run side by side, each on its own thread with
    /// `--intra-op-threads` threads: the in-process form of a model served by
    /// that many instances. Throughput is their sum.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub sessions: u32,

    /// Let the intra-op threads spin between operators. nereid-server keeps
    /// this off unless a model's `intra_op_spinning` parameter turns it on,
    /// so it is off here too for a like-for-like baseline.
    #[arg(long)]
    pub intra_op_spinning: bool,

    /// Features per row, when the model's own shape leaves them variable.
    #[arg(long)]
    pub features: Option<usize>,

    /// Measured time per batch size, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub duration_ms: u64,

    /// Unmeasured runs before each batch size's measurement, in milliseconds.
    #[arg(long, default_value_t = 300)]
    pub warmup_ms: u64,

    /// Write the results as a JSON array here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// One batch size's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BatchResult {
    pub batch_size: usize,
    pub sessions: usize,
    pub intra_op_threads: usize,
    pub executions: usize,
    pub executions_per_s: f64,
    /// batch_size × executions_per_s.
    pub inferences_per_s: f64,
    pub p50_us: u64,
    pub p99_us: u64,
    pub avg_us: f64,
}

/// The model's input: name and per-row feature count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInput {
    pub name: String,
    /// The first dimension, `None` when variable.
    pub fixed_batch: Option<i64>,
    /// Row shape (all dimensions after the batch).
    pub row: Vec<i64>,
}

/// Resolves an input shape `[batch, d1, ...]` into a row shape; a variable
/// row dimension needs `features` (and there may be only one).
pub fn model_input(name: &str, dims: &[i64], features: Option<usize>) -> anyhow::Result<ModelInput> {
    let Some((&batch, rest)) = dims.split_first() else {
        bail!("input '{name}' is a scalar; a [batch, features] input is needed");
    };
    let variable = rest.iter().filter(|&&d| d < 0).count();
    let row: Vec<i64> = match (variable, features) {
        (0, None) => rest.to_vec(),
        (0, Some(f)) if rest.iter().product::<i64>() == f as i64 => rest.to_vec(),
        (0, Some(f)) => bail!("--features {f} does not match input '{name}' shape {dims:?}"),
        (1, Some(f)) => rest.iter().map(|&d| if d < 0 { f as i64 } else { d }).collect(),
        (1, None) => bail!("input '{name}' shape {dims:?} has a variable feature dimension: give --features"),
        _ => bail!("input '{name}' shape {dims:?} has several variable dimensions"),
    };
    Ok(ModelInput {
        name: name.to_string(),
        fixed_batch: (batch >= 0).then_some(batch),
        row,
    })
}

fn environment(args: &ComputeArgs) -> anyhow::Result<Environment> {
    let library = args.onnxruntime_library.as_deref().ok_or_else(|| {
        anyhow!("the ONNX Runtime library is not configured: pass --onnxruntime-library or set ORT_DYLIB_PATH")
    })?;
    if !library.is_file() {
        bail!("the ONNX Runtime library '{}' does not exist", library.display());
    }
    ort::init_from(library)
        .map_err(|e| anyhow!("failed to load ONNX Runtime from '{}': {e}", library.display()))?
        .with_name("nereid-compute-limit")
        .build()
        .map_err(|e| anyhow!("failed to create the ONNX Runtime environment: {e}"))
}

fn load(environment: &Environment, args: &ComputeArgs) -> anyhow::Result<Session> {
    let builder_error = |e: ort::Error<ort::session::builder::SessionBuilder>| anyhow!("ONNX Runtime: {e}");
    Session::builder(environment)
        .map_err(|e| anyhow!("ONNX Runtime: {e}"))?
        .with_intra_threads(args.intra_op_threads.max(1))
        .map_err(builder_error)?
        .with_inter_threads(1)
        .map_err(builder_error)?
        .with_intra_op_spinning(args.intra_op_spinning)
        .map_err(builder_error)?
        .with_optimization_level(GraphOptimizationLevel::All)
        .map_err(builder_error)?
        .commit_from_file(&args.model)
        .map_err(|e| anyhow!("failed to load '{}': {e}", args.model.display()))
}

fn input_of(session: &Session, features: Option<usize>) -> anyhow::Result<ModelInput> {
    let [input] = session.inputs() else {
        bail!(
            "the model has {} inputs; exactly one FP32 input is supported",
            session.inputs().len()
        );
    };
    let dtype = input.dtype();
    if dtype.tensor_type() != Some(TensorElementType::Float32) {
        bail!("input '{}' is {dtype:?}; an FP32 input is needed", input.name());
    }
    let dims = dtype
        .tensor_shape()
        .ok_or_else(|| anyhow!("input '{}' is not a tensor", input.name()))?;
    model_input(input.name(), dims, features)
}

/// Runs every session back to back, each on its own thread, for
/// `duration` (after `warmup`) at `batch`.
fn measure(
    sessions: &mut [Session],
    input: &ModelInput,
    batch: usize,
    args: &ComputeArgs,
) -> anyhow::Result<BatchResult> {
    if let Some(fixed) = input.fixed_batch
        && fixed != batch as i64
    {
        bail!("the model's batch dimension is fixed at {fixed}; batch size {batch} is impossible");
    }
    let runs: Vec<anyhow::Result<Drive>> = std::thread::scope(|scope| {
        let handles: Vec<_> = sessions
            .iter_mut()
            .map(|session| scope.spawn(move || drive(session, input, batch, args)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow!("a session's thread panicked"))))
            .collect()
    });
    let mut latencies = Vec::new();
    let mut executions_per_s = 0.0;
    for run in runs {
        let run = run?;
        executions_per_s += run.latencies.len() as f64 / run.elapsed_s;
        latencies.extend(run.latencies);
    }
    let executions = latencies.len();
    let summary = LatencySummary::from_samples(&mut latencies);
    Ok(BatchResult {
        batch_size: batch,
        sessions: sessions.len(),
        intra_op_threads: args.intra_op_threads,
        executions,
        executions_per_s,
        inferences_per_s: executions_per_s * batch as f64,
        p50_us: summary.p50_us,
        p99_us: summary.p99_us,
        avg_us: summary.avg_us,
    })
}

/// One session's measured executions.
struct Drive {
    latencies: Vec<u64>,
    elapsed_s: f64,
}

/// Runs one session back to back at `batch` on the calling thread.
fn drive(session: &mut Session, input: &ModelInput, batch: usize, args: &ComputeArgs) -> anyhow::Result<Drive> {
    let mut shape = vec![batch as i64];
    shape.extend(&input.row);
    let count = shape.iter().product::<i64>() as usize;
    let mut rng = SplitMix64::new(7);
    let data: Vec<f32> = (0..count).map(|_| rng.next_f64() as f32).collect();
    let tensor = Tensor::from_array((shape, data)).context("building the input tensor")?;
    let mut run = || -> anyhow::Result<Duration> {
        let start = Instant::now();
        let outputs = session
            .run(ort::inputs![input.name.as_str() => &tensor])
            .map_err(|e| anyhow!("ONNX Runtime failed to run at batch {batch}: {e}"))?;
        drop(outputs);
        Ok(start.elapsed())
    };
    let warmup = Instant::now();
    loop {
        run()?;
        if warmup.elapsed() >= Duration::from_millis(args.warmup_ms) {
            break;
        }
    }
    let mut latencies = Vec::new();
    let start = Instant::now();
    let duration = Duration::from_millis(args.duration_ms);
    while latencies.is_empty() || start.elapsed() < duration {
        latencies.push(u64::try_from(run()?.as_micros()).unwrap_or(u64::MAX));
    }
    Ok(Drive {
        latencies,
        elapsed_s: start.elapsed().as_secs_f64(),
    })
}

pub fn table(rows: &[BatchResult]) -> String {
    let mut out = format!(
        "{:>6} {:>8} {:>8} {:>12} {:>12} {:>10} {:>10}\n",
        "batch", "sessions", "threads", "exec/s", "infer/s", "p50 us", "p99 us"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "{:>6} {:>8} {:>8} {:>12.1} {:>12.1} {:>10} {:>10}",
            r.batch_size, r.sessions, r.intra_op_threads, r.executions_per_s, r.inferences_per_s, r.p50_us, r.p99_us
        );
    }
    out
}

/// Loads the model and measures every batch size; prints the table.
pub fn run(args: &ComputeArgs) -> anyhow::Result<Vec<BatchResult>> {
    let environment = environment(args)?;
    let mut sessions = (0..args.sessions)
        .map(|_| load(&environment, args))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let input = input_of(&sessions[0], args.features)?;
    eprintln!(
        "nereid-compute-limit: {} input '{}' row {:?}, {} session(s) of {} intra-op threads",
        args.model.display(),
        input.name,
        input.row,
        args.sessions,
        args.intra_op_threads
    );
    let mut rows = Vec::new();
    for &batch in &args.batch_sizes {
        rows.push(measure(&mut sessions, &input, batch as usize, args)?);
    }
    print!("{}", table(&rows));
    if let Some(path) = &args.json {
        write_json(path, &rows)?;
    }
    Ok(rows)
}

fn write_json(path: &Path, rows: &[BatchResult]) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(rows)?;
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_shapes() {
        let m = model_input("x", &[-1, 16], None).unwrap();
        assert_eq!(m.row, vec![16]);
        assert_eq!(m.fixed_batch, None);
        let m = model_input("x", &[4, 3, 2], Some(6)).unwrap();
        assert_eq!(m.fixed_batch, Some(4));
        assert_eq!(m.row, vec![3, 2]);
        assert_eq!(model_input("x", &[-1, -1], Some(8)).unwrap().row, vec![8]);
        assert!(model_input("x", &[-1, -1], None).is_err());
        assert!(model_input("x", &[-1, -1, -1], Some(2)).is_err());
        assert!(model_input("x", &[-1, 16], Some(8)).is_err());
        assert!(model_input("x", &[], None).is_err());
    }

    #[test]
    fn args_defaults() {
        let a = ComputeArgs::try_parse_from(["nereid-compute-limit", "--model", "m.onnx"]).unwrap();
        assert_eq!(a.batch_sizes, vec![1, 2, 4, 8, 16, 32, 64]);
        assert_eq!(a.duration_ms, 2000);
        assert_eq!(a.sessions, 1);
        let a = ComputeArgs::try_parse_from(["nereid-compute-limit", "--model", "m", "--batch-sizes", "3,5"]).unwrap();
        assert_eq!(a.batch_sizes, vec![3, 5]);
        assert!(ComputeArgs::try_parse_from(["nereid-compute-limit", "--model", "m", "--batch-sizes", "1,0"]).is_err());
        assert!(ComputeArgs::try_parse_from(["nereid-compute-limit", "--model", "m", "--sessions", "0"]).is_err());
        assert!(a.intra_op_threads >= 1);
    }
}
