//! Triton's `model_warmup`: requests each instance runs before its version
//! is READY.
//!
//! A model's first inferences are slow (ONNX Runtime allocates its arenas
//! and picks kernels, a Python model imports lazily); readiness that comes
//! before them lies to the load balancer, which then sends real traffic
//! into those slow requests. With warmup samples in the config, every
//! instance runs each sample `count` times right after it is created, on
//! its own thread, and the version becomes READY only when all did. A
//! sample that fails fails the load, with the sample and the reason.
//!
//! As in Triton, a sample of `batch_size` N is N requests of one row each,
//! executed as one batch (a model that does not batch takes
//! `batch_size` 1); `dims` leave out the batch dimension; `count` 0 means
//! once; `zero_data` is zeros (empty strings for BYTES), `random_data` is
//! pseudo-random (values in [0, 1) for floating types, 0 or 1 for BOOL,
//! random bits for integers; for BYTES, as Triton does, the same as
//! zero_data), and `input_data_file` names a file in the model's `warmup/`
//! folder holding the raw row-major data of one request (BYTES elements
//! each a 4-byte little-endian length and its bytes).
//!
//! Each sample is checked and its data made once per load, before any
//! instance is created, through the same checks a client's request passes
//! ([`normalize`]). Warmup runs are not counted in the model's statistics:
//! no client sent them.

use std::path::Path;

use bytes::Bytes;
use half::{bf16, f16};
use nereid_proto::inference::ModelConfig;
use nereid_proto::inference::model_warmup::input::InputDataType;

use crate::backend::{Backend, Batch, ModelInstance, RequestInfo, ResponseSink};
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::model::normalize::normalize;
use crate::model_config::file_names;
use crate::request::InferRequest;
use crate::response::Produced;
use crate::tensor::{Tensor, element_count};

/// The most data one sample's inputs may hold (one request's worth; the
/// requests of its batch share it). Checked before anything is allocated
/// or read: a config can come from the repository API.
pub const WARMUP_MAX_SAMPLE_BYTES: usize = 256 << 20;

/// The most executions the samples of one model may ask of each instance
/// (the sum of their counts).
pub const WARMUP_MAX_EXECUTIONS: u64 = 1_000;

/// The folder under the model's that holds `input_data_file`s.
const WARMUP_FOLDER: &str = "warmup";

/// One checked warmup sample with its data.
#[derive(Debug)]
pub struct Sample {
    name: String,
    /// One request's inputs, in the shapes the model sees.
    inputs: Vec<Tensor>,
    /// Requests in its batch.
    requests: usize,
    /// Rows per request.
    rows: usize,
    /// Executions.
    count: u32,
}

/// The config's warmup samples, checked and with their data, for a model
/// whose folder is `model_dir`.
pub fn prepare(config: &ModelConfig, model: &str, model_dir: &Path) -> Result<Vec<Sample>> {
    let executions: u64 = config.model_warmup.iter().map(|w| u64::from(w.count.max(1))).sum();
    if executions > WARMUP_MAX_EXECUTIONS {
        return Err(Error::invalid(format!(
            "model_warmup of model '{model}' asks for {executions} executions per instance; at most {WARMUP_MAX_EXECUTIONS} are allowed"
        )));
    }
    config
        .model_warmup
        .iter()
        .enumerate()
        .map(|(index, warmup)| {
            let name = if warmup.name.is_empty() {
                format!("#{index}")
            } else {
                warmup.name.clone()
            };
            sample(config, model, model_dir, &name, warmup)
                .map_err(|e| Error::invalid(format!("model_warmup '{name}' of model '{model}': {}", e.message())))
        })
        .collect()
}

fn sample(
    config: &ModelConfig,
    model: &str,
    model_dir: &Path,
    name: &str,
    warmup: &nereid_proto::inference::ModelWarmup,
) -> Result<Sample> {
    let batching = config.max_batch_size > 0;
    let requests = usize::try_from(warmup.batch_size).unwrap_or(usize::MAX);
    if requests < 1 {
        return Err(Error::invalid("batch_size must be at least 1"));
    }
    if !batching && requests != 1 {
        return Err(Error::invalid(format!(
            "batch_size is {requests}, but the model does not batch (max_batch_size 0): it must be 1"
        )));
    }
    if batching && requests > usize::try_from(config.max_batch_size).unwrap_or(0) {
        return Err(Error::invalid(format!(
            "batch_size {requests} exceeds the model's max_batch_size {}",
            config.max_batch_size
        )));
    }
    let mut seed = 0x6e65_7265_6964_u64 ^ name.len() as u64;
    let mut inputs = Vec::with_capacity(warmup.inputs.len());
    let mut total = 0usize;
    // Sorted, so that a sample's data does not depend on map order.
    let mut names: Vec<&String> = warmup.inputs.keys().collect();
    names.sort();
    for input_name in names {
        let input = &warmup.inputs[input_name];
        let datatype = DataType::from_config(input.data_type)
            .ok_or_else(|| Error::invalid(format!("input '{input_name}' has no valid data_type")))?;
        if let Some(bad) = input.dims.iter().find(|d| **d < 0) {
            return Err(Error::invalid(format!(
                "input '{input_name}' has dimension {bad}: warmup dims must be fully specified"
            )));
        }
        let mut shape = Vec::with_capacity(input.dims.len() + 1);
        if batching {
            shape.push(1);
        }
        shape.extend_from_slice(&input.dims);
        let elements = element_count(&shape).map_err(|e| e.context(format!("input '{input_name}'")))?;
        let data = match &input.input_data_type {
            None => {
                return Err(Error::invalid(format!(
                    "input '{input_name}' sets none of zero_data, random_data or input_data_file"
                )));
            }
            Some(InputDataType::ZeroData(_)) => zeros(datatype, elements, input_name)?,
            Some(InputDataType::RandomData(_)) => match datatype {
                DataType::Bytes => zeros(datatype, elements, input_name)?,
                _ => random(datatype, elements, &mut seed, input_name)?,
            },
            Some(InputDataType::InputDataFile(file)) => read_file(model_dir, file, input_name)?,
        };
        total = total.saturating_add(data.len());
        if total > WARMUP_MAX_SAMPLE_BYTES {
            return Err(too_large(input_name));
        }
        inputs.push(Tensor::new(input_name.clone(), datatype, shape, data));
    }
    // The checks, reshapes and order a client's request gets.
    let request = InferRequest {
        model_name: model.to_string(),
        id: "warmup".into(),
        inputs,
        ..Default::default()
    };
    let normalized = normalize(config, model, "warmup", request)?;
    Ok(Sample {
        name: name.to_string(),
        inputs: normalized.inputs,
        requests,
        rows: normalized.batch_size,
        count: warmup.count.max(1),
    })
}

fn too_large(input: &str) -> Error {
    Error::invalid(format!(
        "input '{input}' takes the sample past {WARMUP_MAX_SAMPLE_BYTES} bytes of data"
    ))
}

/// The byte size of `elements` of a fixed-size `datatype`, refused above
/// the limit before it is allocated.
fn fixed_size(datatype: DataType, elements: usize, input: &str) -> Result<usize> {
    let size = datatype.byte_size().unwrap_or(4);
    elements
        .checked_mul(size)
        .filter(|bytes| *bytes <= WARMUP_MAX_SAMPLE_BYTES)
        .ok_or_else(|| too_large(input))
}

fn zeros(datatype: DataType, elements: usize, input: &str) -> Result<Bytes> {
    // A BYTES element of length 0 is its 4-byte length, zero: the same.
    Ok(Bytes::from(vec![0u8; fixed_size(datatype, elements, input)?]))
}

fn random(datatype: DataType, elements: usize, seed: &mut u64, input: &str) -> Result<Bytes> {
    let mut out = Vec::with_capacity(fixed_size(datatype, elements, input)?);
    for _ in 0..elements {
        let bits = split_mix(seed);
        let unit = || (bits >> 11) as f64 / (1u64 << 53) as f64;
        match datatype {
            DataType::Fp64 => out.extend_from_slice(&unit().to_le_bytes()),
            DataType::Fp32 => out.extend_from_slice(&(unit() as f32).to_le_bytes()),
            DataType::Fp16 => out.extend_from_slice(&f16::from_f64(unit()).to_le_bytes()),
            DataType::Bf16 => out.extend_from_slice(&bf16::from_f64(unit()).to_le_bytes()),
            DataType::Bool => out.push(u8::from(unit() < 0.5)),
            other => {
                let size = other.byte_size().unwrap_or(1);
                out.extend_from_slice(&bits.to_le_bytes()[..size]);
            }
        }
    }
    Ok(Bytes::from(out))
}

/// SplitMix64: enough randomness for warmup data, with no dependency.
fn split_mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn read_file(model_dir: &Path, file: &str, input: &str) -> Result<Bytes> {
    let folder = model_dir.join(WARMUP_FOLDER);
    let path = file_names::resolve(&folder, &folder, file, &format!("input_data_file of input '{input}'"))?;
    let length = std::fs::metadata(&path)
        .map_err(|e| Error::invalid(format!("input_data_file '{file}' of input '{input}': {e}")))?
        .len();
    if length > WARMUP_MAX_SAMPLE_BYTES as u64 {
        return Err(too_large(input));
    }
    std::fs::read(&path)
        .map(Bytes::from)
        .map_err(|e| Error::invalid(format!("input_data_file '{file}' of input '{input}': {e}")))
}

/// Runs every sample on `instance`, as many times as each asks, and fails
/// at the first sample that fails.
pub fn run(
    samples: &[Sample],
    instance: &mut dyn ModelInstance,
    backend: &dyn Backend,
    config: &ModelConfig,
) -> Result<()> {
    let requested: Vec<String> = if backend.reads_requested_outputs() {
        config.output.iter().map(|o| o.name.clone()).collect()
    } else {
        Vec::new()
    };
    for sample in samples {
        for _ in 0..sample.count {
            let batch = Batch {
                requests: vec![sample.inputs.clone(); sample.requests],
                sizes: vec![sample.rows; sample.requests],
                info: (0..sample.requests)
                    .map(|_| RequestInfo {
                        id: format!("warmup:{}", sample.name),
                        requested: requested.clone(),
                        ..Default::default()
                    })
                    .collect(),
            };
            let mut sink = WarmupSink {
                responded: vec![false; sample.requests],
                error: None,
            };
            let executed =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| instance.execute(batch, &mut sink)))
                    .unwrap_or_else(|_| Err(Error::internal("the model instance panicked")));
            let failure = executed.err().or(sink.error).or_else(|| {
                let decoupled = config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled);
                (!decoupled && sink.responded.contains(&false))
                    .then(|| Error::internal("the model instance sent no response"))
            });
            if let Some(error) = failure {
                return Err(Error::unavailable(format!(
                    "model_warmup '{}' failed: {}",
                    sample.name,
                    error.message()
                )));
            }
        }
    }
    Ok(())
}

/// Takes a warmup execution's responses: only whether each request had one,
/// and the first error.
struct WarmupSink {
    responded: Vec<bool>,
    error: Option<Error>,
}

impl ResponseSink for WarmupSink {
    fn send(&mut self, request: usize, _: Produced) -> bool {
        match self.responded.get_mut(request) {
            Some(responded) => {
                *responded = true;
                true
            }
            None => false,
        }
    }

    fn fail(&mut self, request: usize, error: Error) -> bool {
        if let Some(responded) = self.responded.get_mut(request) {
            *responded = true;
        }
        self.error.get_or_insert(error);
        true
    }

    fn is_cancelled(&self, _: usize) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_config::text::parse;

    fn config(warmup: &str) -> ModelConfig {
        parse(&format!(
            r#"name: "m" backend: "identity" max_batch_size: 4
               input [ {{ name: "IN" data_type: TYPE_FP32 dims: [ 2 ] }},
                       {{ name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }} ]
               output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 2 ] }} ]
               {warmup}"#
        ))
        .unwrap()
    }

    const BOTH: &str = r#"inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } }"#;

    fn prepare_one(warmup: &str, dir: &Path) -> Result<Vec<Sample>> {
        prepare(&config(warmup), "m", dir)
    }

    #[test]
    fn makes_zero_and_random_data_of_the_right_size() {
        let dir = tempfile::tempdir().unwrap();
        let samples = prepare_one(
            &format!(
                r#"model_warmup [ {{ name: "z" batch_size: 3 count: 2
                     inputs {{ key: "IN" value: {{ data_type: TYPE_FP32 dims: [ 2 ] random_data: true }} }}
                     {BOTH} }} ]"#
            ),
            dir.path(),
        )
        .unwrap();
        let sample = &samples[0];
        assert_eq!((sample.requests, sample.rows, sample.count), (3, 1, 2));
        let input = &sample.inputs[0];
        assert_eq!((input.name.as_str(), input.shape.as_slice()), ("IN", &[1i64, 2][..]));
        let values: Vec<f32> = input
            .data
            .chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert!(values.iter().all(|v| (0.0..1.0).contains(v)), "{values:?}");
        assert_eq!(sample.inputs[1].data.as_ref(), &[0, 0, 0, 0]);
    }

    #[test]
    fn reads_a_file_from_the_warmup_folder_and_checks_its_size() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("warmup")).unwrap();
        std::fs::write(dir.path().join("warmup/in.bin"), [0u8; 8]).unwrap();
        std::fs::write(dir.path().join("warmup/short.bin"), [0u8; 4]).unwrap();
        let with_file = |file: &str| {
            format!(
                r#"model_warmup [ {{ name: "f" batch_size: 1
                     inputs {{ key: "IN" value: {{ data_type: TYPE_FP32 dims: [ 2 ] input_data_file: "{file}" }} }}
                     {BOTH} }} ]"#
            )
        };
        assert_eq!(
            prepare_one(&with_file("in.bin"), dir.path()).unwrap()[0].inputs[0]
                .data
                .len(),
            8
        );
        let short = prepare_one(&with_file("short.bin"), dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            short.contains("model_warmup 'f'") && short.contains("expected 8 bytes"),
            "{short}"
        );
        let missing = prepare_one(&with_file("gone.bin"), dir.path()).unwrap_err().to_string();
        assert!(
            missing.contains("input_data_file of input 'IN' 'gone.bin' is not a readable file"),
            "{missing}"
        );
        let escape = prepare_one(&with_file("../config.pbtxt"), dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            escape.contains("must be a relative path inside the model folder"),
            "{escape}"
        );
    }

    #[test]
    fn refuses_what_a_request_would_be_refused_for() {
        let dir = tempfile::tempdir().unwrap();
        let sample = |batch: &str, input: &str| {
            format!(r#"model_warmup [ {{ name: "w" {batch} inputs {{ key: "IN" value: {{ {input} }} }} {BOTH} }} ]"#)
        };
        let cases = [
            (
                sample("batch_size: 1", "data_type: TYPE_INT32 dims: [ 2 ] zero_data: true"),
                "data-type is 'INT32'",
            ),
            (
                sample("batch_size: 5", "data_type: TYPE_FP32 dims: [ 2 ] zero_data: true"),
                "exceeds the model's max_batch_size 4",
            ),
            (
                sample("batch_size: 1", "data_type: TYPE_FP32 dims: [ -1 ] zero_data: true"),
                "must be fully specified",
            ),
            (
                sample("batch_size: 1", "data_type: TYPE_FP32 dims: [ 2 ]"),
                "sets none of zero_data",
            ),
            (
                sample(
                    "batch_size: 1",
                    "data_type: TYPE_FP32 dims: [ 100000, 100000 ] zero_data: true",
                ),
                "past 268435456 bytes",
            ),
            (
                sample("batch_size: 1", "data_type: TYPE_FP32 dims: [ 3 ] zero_data: true"),
                "unexpected shape for input 'IN'",
            ),
            (
                r#"model_warmup [ { name: "w" batch_size: 1 count: 1001 }]"#.to_string(),
                "at most 1000 are allowed",
            ),
            (
                r#"model_warmup [ { name: "w" batch_size: 0 }]"#.to_string(),
                "batch_size must be at least 1",
            ),
        ];
        for (warmup, needle) in cases {
            let error = prepare_one(&warmup, dir.path()).unwrap_err().to_string();
            assert!(error.contains(needle), "{warmup}: {error}");
        }
        // A missing input, in a request's words.
        let error = prepare_one(
            r#"model_warmup [ { name: "w" batch_size: 1 inputs { key: "IN" value: { data_type: TYPE_FP32 dims: [ 2 ] zero_data: true } } }]"#,
            dir.path(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("model_warmup 'w' of model 'm'") && error.contains("TEXT"),
            "{error}"
        );
    }
}
