//! Built-in backends that need no model file: `identity` and `add_sub`.
//!
//! They exist for tests and for measuring the server's own overhead: with
//! compute this cheap, whatever latency remains is ours. [`repeat`] is a
//! decoupled model and [`accumulate`] a stateful one, for the same reason.

pub mod accumulate;
pub mod repeat;

use std::path::Path;

use bytes::Bytes;
use half::{bf16, f16};
use nereid_proto::inference::ModelConfig;

use std::time::{Duration, Instant};

use super::{Backend, BatchInput, BatchedInstance, Execution, InstanceSpec, ModelInstance};
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::model_config::autocomplete::ModelSignature;
use crate::statistics::ComputeTiming;
use crate::tensor::Tensor;

/// Triton's identity backend: input `i` comes back as output `i`.
pub struct IdentityBackend;

impl Backend for IdentityBackend {
    fn signature(&self, _: &ModelConfig, _: &Path) -> Result<Option<ModelSignature>> {
        Ok(None)
    }

    /// Its execution hands the input buffers back as outputs (reference
    /// counts); only a delay, which sleeps, must not hold an I/O thread.
    fn runs_inline(&self, config: &ModelConfig) -> bool {
        crate::model_config::parameter(config, "execute_delay_ms").is_none_or(|ms| ms.trim() == "0")
    }

    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
        let config = spec.config;
        if config.input.len() != config.output.len() {
            return Err(Error::invalid(format!(
                "identity model needs as many outputs as inputs, has {} inputs and {} outputs",
                config.input.len(),
                config.output.len()
            )));
        }
        for (i, o) in config.input.iter().zip(&config.output) {
            if i.data_type != o.data_type {
                return Err(Error::invalid(format!(
                    "identity model: input '{}' and output '{}' must have the same data_type",
                    i.name, o.name
                )));
            }
        }
        let pairs = config
            .input
            .iter()
            .zip(&config.output)
            .map(|(i, o)| (i.name.clone(), o.name.clone()))
            .collect();
        // Triton's identity backend takes the same parameter; tests use it
        // to hold a request in flight.
        let delay = match crate::model_config::parameter(config, "execute_delay_ms") {
            None => None,
            Some(ms) => Some(std::time::Duration::from_millis(ms.parse().map_err(|_| {
                Error::invalid(format!(
                    "parameter 'execute_delay_ms' must be a whole number of milliseconds, got '{ms}'"
                ))
            })?)),
        };
        Ok(Box::new(Identity { pairs, delay }))
    }
}

struct Identity {
    /// (input name, output name) by position.
    pairs: Vec<(String, String)>,
    delay: Option<std::time::Duration>,
}

impl BatchedInstance for Identity {
    fn run(&mut self, inputs: Vec<BatchInput>) -> Result<Execution> {
        let started = Instant::now();
        let mut outputs = Vec::with_capacity(self.pairs.len());
        for (input_name, output_name) in &self.pairs {
            // An optional input that was not sent yields no output.
            if let Some(t) = inputs.iter().find(|t| &t.name == input_name) {
                outputs.push(Tensor::new(
                    output_name.clone(),
                    t.datatype,
                    t.shape.clone(),
                    t.contiguous(),
                ));
            }
        }
        let input = started.elapsed();
        // The copy is the input phase; only a delay takes time to infer
        // (and only then is the clock read again).
        let infer = match self.delay {
            Some(delay) => {
                std::thread::sleep(delay);
                started.elapsed() - input
            }
            None => Duration::ZERO,
        };
        Ok(Execution {
            outputs,
            timing: ComputeTiming {
                input,
                infer,
                output: Duration::ZERO,
            },
        })
    }
}

/// The input named `name` of a builtin `model`'s execution.
fn input<'a>(inputs: &'a [BatchInput], model: &str, name: &str) -> Result<&'a BatchInput> {
    inputs
        .iter()
        .find(|t| t.name == name)
        .ok_or_else(|| Error::invalid(format!("{model}: missing input '{name}'")))
}

/// `OUTPUT0 = INPUT0 + INPUT1`, `OUTPUT1 = INPUT0 - INPUT1`, element-wise,
/// for any numeric datatype (integers wrap, as they do in C).
pub struct AddSubBackend;

impl Backend for AddSubBackend {
    fn signature(&self, _: &ModelConfig, _: &Path) -> Result<Option<ModelSignature>> {
        Ok(None)
    }

    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
        let config = spec.config;
        if config.input.len() != 2 || config.output.len() != 2 {
            return Err(Error::invalid("add_sub model needs exactly two inputs and two outputs"));
        }
        let datatype = DataType::from_config(config.input[0].data_type)
            .filter(|t| t.byte_size().is_some() && *t != DataType::Bool)
            .ok_or_else(|| Error::invalid("add_sub model needs a numeric data_type"))?;
        let same = config
            .input
            .iter()
            .map(|i| i.data_type)
            .chain(config.output.iter().map(|o| o.data_type));
        if same.clone().any(|t| t != datatype.to_config()) {
            return Err(Error::invalid(
                "add_sub model: all inputs and outputs must share one data_type",
            ));
        }
        Ok(Box::new(AddSub {
            inputs: [config.input[0].name.clone(), config.input[1].name.clone()],
            outputs: [config.output[0].name.clone(), config.output[1].name.clone()],
            datatype,
        }))
    }
}

struct AddSub {
    inputs: [String; 2],
    outputs: [String; 2],
    datatype: DataType,
}

impl BatchedInstance for AddSub {
    fn run(&mut self, inputs: Vec<BatchInput>) -> Result<Execution> {
        let started = Instant::now();
        let a = input(&inputs, "add_sub", &self.inputs[0])?;
        let b = input(&inputs, "add_sub", &self.inputs[1])?;
        if a.shape != b.shape {
            return Err(Error::invalid(format!(
                "add_sub: inputs '{}' {:?} and '{}' {:?} must have the same shape",
                a.name, a.shape, b.name, b.shape
            )));
        }
        let (a_data, b_data) = (a.contiguous(), b.contiguous());
        let input = started.elapsed();
        let (sum, difference) = add_sub(self.datatype, &a_data, &b_data)?;
        Ok(Execution {
            outputs: vec![
                Tensor::new(self.outputs[0].clone(), self.datatype, a.shape.clone(), sum),
                Tensor::new(self.outputs[1].clone(), self.datatype, a.shape.clone(), difference),
            ],
            timing: ComputeTiming {
                input,
                infer: started.elapsed() - input,
                output: Duration::ZERO,
            },
        })
    }
}

/// Element-wise sum and difference of two little-endian buffers.
fn add_sub(datatype: DataType, a: &[u8], b: &[u8]) -> Result<(Bytes, Bytes)> {
    macro_rules! apply {
        ($t:ty, $n:expr, $add:expr, $sub:expr) => {{
            let mut sum = Vec::with_capacity(a.len());
            let mut difference = Vec::with_capacity(a.len());
            for (x, y) in a.chunks_exact($n).zip(b.chunks_exact($n)) {
                let x = <$t>::from_le_bytes(x.try_into().expect("chunk has the element size"));
                let y = <$t>::from_le_bytes(y.try_into().expect("chunk has the element size"));
                sum.extend_from_slice(&$add(x, y).to_le_bytes());
                difference.extend_from_slice(&$sub(x, y).to_le_bytes());
            }
            (Bytes::from(sum), Bytes::from(difference))
        }};
    }
    macro_rules! int {
        ($t:ty) => {
            apply!($t, size_of::<$t>(), <$t>::wrapping_add, <$t>::wrapping_sub)
        };
    }
    macro_rules! float {
        ($t:ty) => {
            apply!($t, size_of::<$t>(), |x: $t, y: $t| x + y, |x: $t, y: $t| x - y)
        };
    }
    Ok(match datatype {
        DataType::Uint8 => int!(u8),
        DataType::Uint16 => int!(u16),
        DataType::Uint32 => int!(u32),
        DataType::Uint64 => int!(u64),
        DataType::Int8 => int!(i8),
        DataType::Int16 => int!(i16),
        DataType::Int32 => int!(i32),
        DataType::Int64 => int!(i64),
        DataType::Fp16 => float!(f16),
        DataType::Bf16 => float!(bf16),
        DataType::Fp32 => float!(f32),
        DataType::Fp64 => float!(f64),
        DataType::Bool | DataType::Bytes => {
            return Err(Error::unsupported(format!("add_sub does not support {datatype}")));
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Device;
    use crate::backend::execute_one;
    use crate::model_config::text::parse;

    fn spec(config: &ModelConfig) -> InstanceSpec<'_> {
        static NO_MEMBERS: std::sync::LazyLock<crate::model_repository_manager::Members> =
            std::sync::LazyLock::new(Default::default);
        InstanceSpec {
            config,
            version_dir: Path::new("."),
            device: Device::Cpu,
            intra_op_threads: 1,
            members: &NO_MEMBERS,
        }
    }

    fn ints(values: &[i32]) -> Bytes {
        Bytes::from(values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>())
    }

    #[test]
    fn add_sub_int32() {
        let config = parse(
            r#"backend: "add_sub" max_batch_size: 8
               input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 3 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 3 ] } ]
               output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 3 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 3 ] } ]"#,
        )
        .unwrap();
        let mut instance = AddSubBackend.create_instance(spec(&config)).unwrap();
        let inputs = vec![
            Tensor::new("INPUT0", DataType::Int32, vec![1, 3], ints(&[1, 2, i32::MAX])),
            Tensor::new("INPUT1", DataType::Int32, vec![1, 3], ints(&[10, 20, 1])),
        ];
        let out = execute_one(instance.as_mut(), inputs, 1).unwrap().0.outputs;
        assert_eq!(out[0].name, "OUTPUT0");
        assert_eq!(out[0].data, ints(&[11, 22, i32::MIN]));
        assert_eq!(out[1].data, ints(&[-9, -18, i32::MAX - 1]));
    }

    #[test]
    fn add_sub_fp16() {
        let (sum, diff) = add_sub(
            DataType::Fp16,
            &f16::from_f32(1.5).to_le_bytes(),
            &f16::from_f32(0.5).to_le_bytes(),
        )
        .unwrap();
        assert_eq!(&sum[..], &f16::from_f32(2.0).to_le_bytes());
        assert_eq!(&diff[..], &f16::from_f32(1.0).to_le_bytes());
    }

    #[test]
    fn identity_renames_by_position() {
        let config = parse(
            r#"backend: "identity"
               input [ { name: "IN" data_type: TYPE_STRING dims: [ -1 ] } ]
               output [ { name: "OUT" data_type: TYPE_STRING dims: [ -1 ] } ]"#,
        )
        .unwrap();
        let mut instance = IdentityBackend.create_instance(spec(&config)).unwrap();
        let data = Bytes::from_static(&[1, 0, 0, 0, b'x']);
        let input = Tensor::new("IN", DataType::Bytes, vec![1], data.clone());
        let out = execute_one(instance.as_mut(), vec![input], 1).unwrap().0.outputs;
        assert_eq!(out, vec![Tensor::new("OUT", DataType::Bytes, vec![1], data)]);
    }

    #[test]
    fn mismatched_configs_fail_to_load() {
        let config = parse(
            r#"backend: "identity"
               input [ { name: "IN" data_type: TYPE_FP32 dims: [ -1 ] } ]
               output [ { name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]"#,
        )
        .unwrap();
        assert!(IdentityBackend.create_instance(spec(&config)).is_err());
    }
}
