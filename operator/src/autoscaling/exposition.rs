//! Reading a serving pod's /metrics (Prometheus' text format, version
//! 0.0.4) into the few totals autoscaling needs.
//!
//! Only sample lines are read, and only the families below are kept; their
//! series (one per model and version) are summed, since a pod serves one
//! InferenceModel's repository and its whole load counts. A line that is
//! not a valid sample makes the whole scrape invalid: a pod that answers
//! garbage is skipped rather than half-read.

use std::collections::BTreeSet;

use nereid_proto::contract::metrics::{
    EXECUTING_REQUEST_COUNT, GPU_UTILIZATION, INFERENCE_COUNT, PENDING_REQUEST_COUNT, QUEUE_LATENCY, REQUEST_SUCCESS,
};
use thiserror::Error;

/// Cumulative queue time of successful requests, microseconds (Triton's name).
const QUEUE_DURATION: &str = QUEUE_LATENCY.duration;

/// Every family [`parse`] reads, each named in the server's contract
/// (`nereid_proto::contract::metrics`): successful requests, inferences (a
/// batch of 8 counts 8), requests waiting in the queue (Triton's) and in an
/// execution now (Nereid's), GPU utilisation (0 to 1, per GPU, Triton's).
pub const FAMILIES: [&str; 6] = [
    QUEUE_DURATION,
    REQUEST_SUCCESS,
    INFERENCE_COUNT,
    PENDING_REQUEST_COUNT,
    EXECUTING_REQUEST_COUNT,
    GPU_UTILIZATION,
];

/// What one scrape of one pod says.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Counters: they only grow while the server runs.
    pub queue_us: f64,
    pub requests: f64,
    pub inferences: f64,
    /// Gauges: the value now.
    pub pending: f64,
    /// Mean over the pod's GPUs, 0 to 100; `None` when it reports none.
    pub gpu_percent: Option<f64>,
}

#[derive(Debug, Error, PartialEq)]
pub enum ParseError {
    #[error("line {line}: {problem}")]
    Line { line: usize, problem: &'static str },
    #[error("no nv_inference_* metrics: not a Nereid or Triton server's /metrics")]
    NotAServer,
}

/// Sums the families autoscaling reads out of a /metrics body.
pub fn parse(text: &str) -> Result<Sample, ParseError> {
    let mut sample = Sample::default();
    let (mut gpu_sum, mut gpus) = (0.0, 0u32);
    let mut seen_server = false;
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            // A server with no model loaded yet still describes its families.
            seen_server |= line.starts_with("# TYPE nv_inference_");
            continue;
        }
        let (name, value) = sample_line(line).map_err(|problem| ParseError::Line {
            line: index + 1,
            problem,
        })?;
        seen_server |= name.starts_with("nv_inference_");
        // A NaN or infinite counter would poison every figure it enters.
        let value = if value.is_finite() { value } else { 0.0 };
        match name {
            QUEUE_DURATION => sample.queue_us += value,
            REQUEST_SUCCESS => sample.requests += value,
            INFERENCE_COUNT => sample.inferences += value,
            PENDING_REQUEST_COUNT | EXECUTING_REQUEST_COUNT => sample.pending += value,
            GPU_UTILIZATION => {
                gpu_sum += value;
                gpus += 1;
            }
            _ => {}
        }
    }
    if !seen_server {
        return Err(ParseError::NotAServer);
    }
    sample.gpu_percent = (gpus > 0).then(|| 100.0 * gpu_sum / f64::from(gpus));
    Ok(sample)
}

/// The names of the samples a /metrics body holds (a histogram's show as
/// its `_bucket`, `_sum` and `_count`), read as [`parse`] reads them: for
/// checking that a server exports what [`parse`] looks for.
pub fn sample_names(text: &str) -> Result<BTreeSet<&str>, ParseError> {
    let mut names = BTreeSet::new();
    for (index, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, _) = sample_line(line).map_err(|problem| ParseError::Line {
            line: index + 1,
            problem,
        })?;
        names.insert(name);
    }
    Ok(names)
}

/// The metric name and value of one sample line:
/// `name{label="value",...} value [timestamp]`.
fn sample_line(line: &str) -> Result<(&str, f64), &'static str> {
    let name_end = line
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(line.len());
    let name = &line[..name_end];
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err("a sample must start with a metric name");
    }
    let mut rest = &line[name_end..];
    if rest.starts_with('{') {
        rest = &rest[labels_end(rest)?..];
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next().ok_or("a sample has no value")?;
    let value = parse_value(value).ok_or("the value is not a number")?;
    if let Some(timestamp) = fields.next() {
        timestamp
            .parse::<i64>()
            .map_err(|_| "the timestamp is not an integer")?;
    }
    if fields.next().is_some() {
        return Err("text after the timestamp");
    }
    Ok((name, value))
}

/// The index just past the `}` that closes the label set `rest` starts
/// with, honouring quoted values (which may hold `}` and escaped quotes).
fn labels_end(rest: &str) -> Result<usize, &'static str> {
    let mut in_value = false;
    let mut escaped = false;
    for (index, c) in rest.char_indices().skip(1) {
        match (in_value, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (true, false, '"') => in_value = false,
            (false, _, '"') => in_value = true,
            (false, _, '}') => return Ok(index + 1),
            _ => {}
        }
    }
    Err("a label set is not closed")
}

/// Go's float syntax as Prometheus writes it, including `+Inf`, `-Inf`, `NaN`.
fn parse_value(text: &str) -> Option<f64> {
    match text {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = r#"# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{model="a",version="1"} 10
nv_inference_request_success{model="b",version="1"} 30
nv_inference_request_failure{model="a",reason="BACKEND",version="1"} 4
nv_inference_count{model="a",version="1"} 80
nv_inference_queue_duration_us{model="a",version="1"} 1200
nv_inference_queue_duration_us{model="b",version="1"} 800 1700000000000
nv_inference_pending_request_count{model="a",version="1"} 3
nereid_inference_executing_request_count{model="a",version="1"} 1
nereid_requests_in_flight{protocol="http"} 9
nv_model_load_duration_secs{model="odd } \" name",version="1"} 0.5
"#;

    #[test]
    fn sums_the_families_over_models() {
        let sample = parse(SCRAPE).unwrap();
        assert_eq!(
            sample,
            Sample {
                queue_us: 2000.0,
                requests: 40.0,
                inferences: 80.0,
                pending: 4.0,
                gpu_percent: None,
            }
        );
    }

    #[test]
    fn sample_names_lists_each_name_once() {
        let names = sample_names(SCRAPE).unwrap();
        assert!(names.contains(REQUEST_SUCCESS) && names.contains(EXECUTING_REQUEST_COUNT));
        assert!(!names.contains(GPU_UTILIZATION));
        assert_eq!(names.len(), 8);
        assert!(sample_names("nv_inference_count 1\n<html>\n").is_err());
    }

    #[test]
    fn gpu_utilisation_is_the_mean_percentage() {
        let text = "nv_inference_count{model=\"a\",version=\"1\"} 0\n\
                    nv_gpu_utilization{gpu_uuid=\"GPU-1\"} 0.5\nnv_gpu_utilization{gpu_uuid=\"GPU-2\"} 1\n";
        assert_eq!(parse(text).unwrap().gpu_percent, Some(75.0));
    }

    #[test]
    fn garbage_is_refused_with_its_line() {
        assert_eq!(
            parse("nv_inference_count 1\n<html>oops</html>\n"),
            Err(ParseError::Line {
                line: 2,
                problem: "a sample must start with a metric name"
            })
        );
        assert!(matches!(
            parse("nv_inference_count{model=\"a\" 1"),
            Err(ParseError::Line { .. })
        ));
        assert!(matches!(
            parse("nv_inference_count{} one"),
            Err(ParseError::Line { .. })
        ));
        assert!(matches!(
            parse("nv_inference_count 1 2 3"),
            Err(ParseError::Line { .. })
        ));
        assert!(matches!(parse("nv_inference_count"), Err(ParseError::Line { .. })));
    }

    #[test]
    fn a_body_without_server_metrics_is_not_a_server() {
        assert_eq!(parse("up 1\n"), Err(ParseError::NotAServer));
        assert_eq!(parse(""), Err(ParseError::NotAServer));
        let idle = "# TYPE nv_inference_count counter\n";
        assert_eq!(parse(idle), Ok(Sample::default()));
    }

    #[test]
    fn special_values_do_not_poison_the_sums() {
        let sample =
            parse("nv_inference_count 5\nnv_inference_count NaN\nnv_inference_queue_duration_us +Inf\n").unwrap();
        assert_eq!((sample.inferences, sample.queue_us), (5.0, 0.0));
    }
}
