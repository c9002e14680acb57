//! `accumulate`: a stateful builtin that sums its inputs per sequence, in
//! the spirit of Triton's implicit-state examples. The sequence batcher
//! carries the running sum as implicit state and tells each row whether
//! it starts a sequence:
//!
//! ```text
//! name: "accumulate"
//! backend: "accumulate"
//! max_batch_size: 8
//! input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
//! output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
//! sequence_batching {
//!   control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
//!   state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ]
//!             initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]
//! }
//! ```
//!
//! Each row's output (and next state) is its input plus the state, or its
//! input alone on the row that starts a sequence. INT32 throughout; the
//! START control may be INT32, FP32 or BOOL.

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nereid_proto::inference::model_config::SchedulingChoice;
use nereid_proto::inference::model_sequence_batching::control::Kind as ControlKind;
use nereid_proto::inference::{ModelConfig, ModelSequenceBatching};

use crate::backend::{Backend, BatchInput, BatchedInstance, Execution, InstanceSpec, ModelInstance};
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::model_config::autocomplete::ModelSignature;
use crate::model_config::{input_datatype, output_datatype};
use crate::statistics::ComputeTiming;
use crate::tensor::Tensor;

pub struct AccumulateBackend;

impl Backend for AccumulateBackend {
    fn signature(&self, _: &ModelConfig, _: &Path) -> Result<Option<ModelSignature>> {
        Ok(None)
    }

    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
        let config = spec.config;
        let bad = |why: &str| Error::invalid(format!("accumulate model '{}': {why}", config.name));
        let Some(SchedulingChoice::SequenceBatching(sequence)) = &config.scheduling_choice else {
            return Err(bad(
                "it is stateful: it needs sequence_batching with a START control and a state",
            ));
        };
        if config.input.len() != 1
            || config.output.len() != 1
            || input_datatype(&config.input[0]) != Some(DataType::Int32)
            || output_datatype(&config.output[0]) != Some(DataType::Int32)
        {
            return Err(bad("it needs one INT32 input and one INT32 output"));
        }
        let start = control(sequence, ControlKind::ControlSequenceStart)
            .ok_or_else(|| bad("sequence_batching needs a CONTROL_SEQUENCE_START control input"))?;
        let [state] = sequence.state.as_slice() else {
            return Err(bad("sequence_batching needs exactly one state (the running sum)"));
        };
        if DataType::from_config(state.data_type) != Some(DataType::Int32) {
            return Err(bad("its state is INT32"));
        }
        Ok(Box::new(Accumulate {
            input: config.input[0].name.clone(),
            output: config.output[0].name.clone(),
            start,
            state_in: state.input_name.clone(),
            state_out: state.output_name.clone(),
        }))
    }
}

/// The name of the control input of `kind`.
fn control(sequence: &ModelSequenceBatching, kind: ControlKind) -> Option<String> {
    sequence
        .control_input
        .iter()
        .find(|c| c.control.iter().any(|c| c.kind == kind as i32))
        .map(|c| c.name.clone())
}

struct Accumulate {
    input: String,
    output: String,
    start: String,
    state_in: String,
    state_out: String,
}

impl BatchedInstance for Accumulate {
    fn run(&mut self, inputs: Vec<BatchInput>) -> Result<Execution> {
        let started = Instant::now();
        let find = |name: &str| super::input(&inputs, "accumulate", name);
        let values = ints(&find(&self.input)?.contiguous());
        let sums = ints(&find(&self.state_in)?.contiguous());
        let start = find(&self.start)?;
        let starts = truths(start.datatype, &start.contiguous());
        let rows = values.len();
        if sums.len() != rows || starts.len() != rows {
            return Err(Error::invalid(format!(
                "accumulate: {rows} inputs, {} states and {} starts in one batch",
                sums.len(),
                starts.len()
            )));
        }
        let total: Vec<i32> = (0..rows)
            .map(|i| {
                if starts[i] {
                    values[i]
                } else {
                    sums[i].wrapping_add(values[i])
                }
            })
            .collect();
        let data: Bytes = total.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>().into();
        let shape = vec![rows as i64, 1];
        Ok(Execution {
            outputs: vec![
                Tensor::new(self.output.clone(), DataType::Int32, shape.clone(), data.clone()),
                Tensor::new(self.state_out.clone(), DataType::Int32, shape, data),
            ],
            timing: ComputeTiming {
                infer: started.elapsed(),
                input: Duration::ZERO,
                output: Duration::ZERO,
            },
        })
    }
}

fn ints(data: &[u8]) -> Vec<i32> {
    data.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect()
}

/// A control tensor's rows as booleans (non-zero is true).
fn truths(datatype: DataType, data: &[u8]) -> Vec<bool> {
    match datatype {
        DataType::Bool => data.iter().map(|b| *b != 0).collect(),
        DataType::Fp32 => data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")) != 0.0)
            .collect(),
        _ => ints(data).into_iter().map(|v| v != 0).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Device;
    use crate::model_config::text::parse;

    pub const CONFIG: &str = r#"name: "accumulate" backend: "accumulate" max_batch_size: 8
        input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
        sequence_batching {
          control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
          state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_INT32 dims: [ 1 ]
                    initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true name: "zero" } } ]
        }"#;

    fn column(name: &str, values: &[i32]) -> Tensor {
        let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        Tensor::new(name, DataType::Int32, vec![values.len() as i64, 1], data.into())
    }

    #[test]
    fn each_row_adds_its_input_to_its_state_unless_it_starts() {
        let config = parse(CONFIG).unwrap();
        let mut instance = AccumulateBackend
            .create_instance(InstanceSpec {
                config: &config,
                version_dir: Path::new("."),
                device: Device::Cpu,
                intra_op_threads: 1,
                members: &Default::default(),
            })
            .unwrap();
        let inputs = vec![
            column("INPUT", &[5, 7, 1]),
            column("SUM_IN", &[100, 3, 9]),
            column("START", &[0, 1, 0]),
        ];
        let outputs = crate::backend::execute_one(instance.as_mut(), inputs, 3)
            .unwrap()
            .0
            .outputs;
        assert_eq!(ints(&outputs[0].data), [105, 7, 10]);
        assert_eq!(outputs[1].name, "SUM_OUT");
        assert_eq!(ints(&outputs[1].data), [105, 7, 10]);
    }
}
