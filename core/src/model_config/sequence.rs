//! `sequence_batching` turned into what the sequence batcher needs: the
//! strategy, the control tensors it feeds the model, and the implicit
//! states it carries between the requests of a sequence.
//!
//! Control and state tensors are inputs (and, for states, outputs) of the
//! model file that the config does not list under `input` / `output`:
//! clients never send them, the server does. [`implicit_inputs`] and
//! [`implicit_outputs`] name them for auto-complete and for checking the
//! config against the file.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use nereid_proto::inference::model_config::SchedulingChoice;
use nereid_proto::inference::model_sequence_batching::control::Kind;
use nereid_proto::inference::model_sequence_batching::initial_state::StateData;
use nereid_proto::inference::model_sequence_batching::{Control, StrategyChoice};
use nereid_proto::inference::{ModelConfig, ModelSequenceBatching};

use super::{file_names, parameter};
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::tensor::element_count;

/// Triton's default `max_sequence_idle_microseconds`: one second.
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// The model parameter that bounds how many new sequences may wait for a
/// free slot; beyond it a new sequence is refused at once. Unbounded, as in
/// Triton, when absent.
pub const BACKLOG_PARAMETER: &str = "max_sequence_backlog";

/// How the batcher forms batches from live sequences.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    /// Each sequence holds one batch slot of one instance for its life;
    /// an execution takes one request from every slot that has one.
    Direct {
        max_queue_delay: Duration,
        /// Wait (up to the delay) until this share of the slots have a request.
        minimum_slot_utilization: f32,
    },
    /// Sequences are bound to an instance but hold no slot: an execution
    /// takes one request from each of the oldest sequences that have one.
    Oldest {
        /// Live sequences per instance; more wait in the backlog.
        max_candidate_sequences: Option<usize>,
        preferred_batch_size: Vec<usize>,
        max_queue_delay: Duration,
    },
}

/// What a control input carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    Start,
    End,
    Ready,
    CorrelationId,
}

/// One control input of the model.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlTensor {
    pub input: String,
    pub kind: ControlKind,
    pub datatype: DataType,
    /// The element for false and for true (START, END, READY).
    pub values: [Bytes; 2],
}

/// One implicit state: `output` of a request becomes `input` of the next.
#[derive(Debug, Clone, PartialEq)]
pub struct StateTensor {
    pub input: String,
    pub output: String,
    pub datatype: DataType,
    /// Without the batch dimension.
    pub dims: Vec<i64>,
    /// What a sequence starts with.
    pub initial: Bytes,
}

/// A sequence model's batching settings.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceConfig {
    pub strategy: Strategy,
    pub idle: Duration,
    pub controls: Vec<ControlTensor>,
    pub states: Vec<StateTensor>,
    /// Whether the model takes a batch dimension.
    pub batching: bool,
    /// Batch rows per execution: `max_batch_size`, or 1.
    pub slots: usize,
    pub max_backlog: Option<usize>,
}

/// The config's `sequence_batching`, if it has one.
pub fn of(config: &ModelConfig) -> Option<&ModelSequenceBatching> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::SequenceBatching(sequence)) => Some(sequence),
        _ => None,
    }
}

/// The model inputs the server feeds: control inputs and state inputs.
pub fn implicit_inputs(config: &ModelConfig) -> Vec<&str> {
    of(config).map_or_else(Vec::new, |s| {
        s.control_input
            .iter()
            .map(|c| c.name.as_str())
            .chain(s.state.iter().map(|s| s.input_name.as_str()))
            .collect()
    })
}

/// The model outputs the server keeps: state outputs.
pub fn implicit_outputs(config: &ModelConfig) -> Vec<&str> {
    of(config).map_or_else(Vec::new, |s| s.state.iter().map(|s| s.output_name.as_str()).collect())
}

/// Triton's defaults, written into the config so that `/config` shows what
/// is in force: the direct strategy and a one-second idle limit.
pub fn fill_defaults(sequence: &mut ModelSequenceBatching) {
    if sequence.strategy_choice.is_none() {
        sequence.strategy_choice = Some(StrategyChoice::Direct(Default::default()));
    }
    if sequence.max_sequence_idle_microseconds == 0 {
        sequence.max_sequence_idle_microseconds = DEFAULT_IDLE.as_micros() as u64;
    }
}

impl SequenceConfig {
    /// Checks `sequence_batching` and reads initial states (`data_file`s
    /// live in the model folder's `initial_state/`).
    pub fn from_config(config: &ModelConfig, model_dir: &Path) -> Result<Self> {
        let Some(sequence) = of(config) else {
            return Err(Error::internal("the sequence batcher needs sequence_batching"));
        };
        let bad = |why: String| Error::invalid(format!("sequence_batching of model '{}': {why}", config.name));
        let max_batch = usize::try_from(config.max_batch_size).unwrap_or(0);
        let slots = max_batch.max(1);
        let strategy = match &sequence.strategy_choice {
            None => Strategy::Direct {
                max_queue_delay: Duration::ZERO,
                minimum_slot_utilization: 0.0,
            },
            Some(StrategyChoice::Direct(d)) => {
                if !(0.0..=1.0).contains(&d.minimum_slot_utilization) {
                    return Err(bad(format!(
                        "direct.minimum_slot_utilization must be between 0 and 1, got {}",
                        d.minimum_slot_utilization
                    )));
                }
                Strategy::Direct {
                    max_queue_delay: Duration::from_micros(d.max_queue_delay_microseconds),
                    minimum_slot_utilization: d.minimum_slot_utilization,
                }
            }
            Some(StrategyChoice::Oldest(o)) => {
                let mut preferred = Vec::with_capacity(o.preferred_batch_size.len());
                for &size in &o.preferred_batch_size {
                    match usize::try_from(size) {
                        Ok(s) if (1..=slots).contains(&s) => preferred.push(s),
                        _ => {
                            return Err(bad(format!(
                                "oldest.preferred_batch_size {size} must be between 1 and max_batch_size {slots}"
                            )));
                        }
                    }
                }
                preferred.sort_unstable();
                preferred.dedup();
                let candidates = match o.max_candidate_sequences {
                    0 => None,
                    n if n > 0 => Some(n as usize),
                    n => return Err(bad(format!("oldest.max_candidate_sequences must be positive, got {n}"))),
                };
                Strategy::Oldest {
                    max_candidate_sequences: candidates,
                    preferred_batch_size: preferred,
                    max_queue_delay: Duration::from_micros(o.max_queue_delay_microseconds),
                }
            }
        };
        let idle = match sequence.max_sequence_idle_microseconds {
            0 => DEFAULT_IDLE,
            us => Duration::from_micros(us),
        };

        let listed = |name: &str| config.input.iter().any(|i| i.name == name);
        let mut controls: Vec<ControlTensor> = Vec::new();
        for input in &sequence.control_input {
            if input.name.is_empty() {
                return Err(bad("a control_input has no name".into()));
            }
            if listed(&input.name) {
                return Err(bad(format!(
                    "control input '{}' is also listed under input; the server feeds it, clients do not",
                    input.name
                )));
            }
            let [control] = input.control.as_slice() else {
                return Err(bad(format!(
                    "control input '{}' must have exactly one control",
                    input.name
                )));
            };
            let control = control_tensor(&input.name, control).map_err(bad)?;
            if controls.iter().any(|c| c.kind == control.kind) {
                return Err(bad(format!("more than one control input is {:?}", control.kind)));
            }
            if controls.iter().any(|c| c.input == control.input) {
                return Err(bad(format!("control input '{}' appears more than once", input.name)));
            }
            controls.push(control);
        }

        let mut states: Vec<StateTensor> = Vec::new();
        for state in &sequence.state {
            let name = &state.input_name;
            if name.is_empty() || state.output_name.is_empty() {
                return Err(bad("a state needs input_name and output_name".into()));
            }
            if listed(name) || controls.iter().any(|c| &c.input == name) {
                return Err(bad(format!("state input '{name}' is also an input or a control input")));
            }
            if config.output.iter().any(|o| o.name == state.output_name) {
                return Err(bad(format!(
                    "state output '{}' is also listed under output; the server keeps it",
                    state.output_name
                )));
            }
            if states.iter().any(|s| &s.input == name || s.output == state.output_name) {
                return Err(bad(format!("state '{name}' appears more than once")));
            }
            let datatype = DataType::from_config(state.data_type)
                .filter(|t| t.byte_size().is_some())
                .ok_or_else(|| bad(format!("state '{name}' needs a fixed-size data_type")))?;
            let initial = match state.initial_state.as_slice() {
                [] => {
                    if state.dims.iter().any(|d| *d < 0) {
                        return Err(bad(format!(
                            "state '{name}' has variable dims {:?}: give it an initial_state with fixed dims",
                            state.dims
                        )));
                    }
                    zeros(datatype, &state.dims)?
                }
                [initial] => {
                    if DataType::from_config(initial.data_type) != Some(datatype) {
                        return Err(bad(format!(
                            "initial_state of state '{name}' must have the state's data_type"
                        )));
                    }
                    if initial.dims.iter().any(|d| *d < 0) {
                        return Err(bad(format!("initial_state of state '{name}' needs fixed dims")));
                    }
                    match &initial.state_data {
                        Some(StateData::ZeroData(true)) => zeros(datatype, &initial.dims)?,
                        Some(StateData::DataFile(file)) => {
                            let folder = model_dir.join("initial_state");
                            let what = format!("initial_state data_file of state '{name}'");
                            let path = file_names::resolve(model_dir, &folder, file, &what)?;
                            let data = std::fs::read(&path)
                                .map_err(|e| bad(format!("{what} '{file}' could not be read: {e}")))?;
                            let want = byte_size(datatype, &initial.dims)?;
                            if data.len() != want {
                                return Err(bad(format!(
                                    "{what} '{file}' has {} bytes; dims {:?} of {datatype} need {want}",
                                    data.len(),
                                    initial.dims
                                )));
                            }
                            Bytes::from(data)
                        }
                        _ => {
                            return Err(bad(format!(
                                "initial_state of state '{name}' needs zero_data: true or a data_file"
                            )));
                        }
                    }
                }
                _ => return Err(bad(format!("state '{name}' may have one initial_state"))),
            };
            let dims = match state.initial_state.first() {
                Some(initial) => initial.dims.clone(),
                None => state.dims.clone(),
            };
            states.push(StateTensor {
                input: name.clone(),
                output: state.output_name.clone(),
                datatype,
                dims,
                initial,
            });
        }

        let max_backlog = match parameter(config, BACKLOG_PARAMETER) {
            None => None,
            Some(n) => Some(n.parse::<usize>().map_err(|_| {
                Error::invalid(format!(
                    "parameter '{BACKLOG_PARAMETER}' must be a non-negative integer, got '{n}'"
                ))
            })?),
        };
        Ok(SequenceConfig {
            strategy,
            idle,
            controls,
            states,
            batching: max_batch > 0,
            slots,
            max_backlog,
        })
    }

    /// The control input carrying the correlation id, if any.
    pub fn correlation_control(&self) -> Option<&ControlTensor> {
        self.controls.iter().find(|c| c.kind == ControlKind::CorrelationId)
    }
}

fn control_tensor(input: &str, control: &Control) -> std::result::Result<ControlTensor, String> {
    let kind = match Kind::try_from(control.kind) {
        Ok(Kind::ControlSequenceStart) => ControlKind::Start,
        Ok(Kind::ControlSequenceEnd) => ControlKind::End,
        Ok(Kind::ControlSequenceReady) => ControlKind::Ready,
        Ok(Kind::ControlSequenceCorrid) => ControlKind::CorrelationId,
        Err(_) => return Err(format!("control input '{input}' has an unknown kind {}", control.kind)),
    };
    let pair = |values: [Vec<u8>; 2]| [Bytes::from(values[0].clone()), Bytes::from(values[1].clone())];
    let given = [
        !control.int32_false_true.is_empty(),
        !control.fp32_false_true.is_empty(),
        !control.bool_false_true.is_empty(),
    ];
    if kind == ControlKind::CorrelationId {
        if given.iter().any(|g| *g) {
            return Err(format!(
                "CORRID control input '{input}' takes a data_type, not false/true values"
            ));
        }
        let datatype = DataType::from_config(control.data_type)
            .filter(|t| {
                matches!(
                    t,
                    DataType::Uint64 | DataType::Int64 | DataType::Uint32 | DataType::Int32 | DataType::Bytes
                )
            })
            .ok_or_else(|| {
                format!("CORRID control input '{input}' needs data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING")
            })?;
        return Ok(ControlTensor {
            input: input.to_string(),
            kind,
            datatype,
            values: [Bytes::new(), Bytes::new()],
        });
    }
    let two = |n: usize| -> std::result::Result<(), String> {
        if n == 2 {
            Ok(())
        } else {
            Err(format!(
                "control input '{input}' needs exactly two false/true values, got {n}"
            ))
        }
    };
    let (datatype, values) = match given {
        [true, false, false] => {
            two(control.int32_false_true.len())?;
            let v = &control.int32_false_true;
            (
                DataType::Int32,
                pair([v[0].to_le_bytes().to_vec(), v[1].to_le_bytes().to_vec()]),
            )
        }
        [false, true, false] => {
            two(control.fp32_false_true.len())?;
            let v = &control.fp32_false_true;
            (
                DataType::Fp32,
                pair([v[0].to_le_bytes().to_vec(), v[1].to_le_bytes().to_vec()]),
            )
        }
        [false, false, true] => {
            two(control.bool_false_true.len())?;
            let v = &control.bool_false_true;
            (DataType::Bool, pair([vec![u8::from(v[0])], vec![u8::from(v[1])]]))
        }
        _ => {
            return Err(format!(
                "control input '{input}' needs one of int32_false_true, fp32_false_true or bool_false_true"
            ));
        }
    };
    Ok(ControlTensor {
        input: input.to_string(),
        kind,
        datatype,
        values,
    })
}

fn byte_size(datatype: DataType, dims: &[i64]) -> Result<usize> {
    let size = datatype
        .byte_size()
        .ok_or_else(|| Error::internal("a state has a fixed-size datatype"))?;
    element_count(dims)?
        .checked_mul(size)
        .ok_or_else(|| Error::invalid(format!("state dims {dims:?} are too large")))
}

fn zeros(datatype: DataType, dims: &[i64]) -> Result<Bytes> {
    let bytes = byte_size(datatype, dims)?;
    if bytes > 64 << 20 {
        return Err(Error::invalid(format!(
            "a state of dims {dims:?} would take {bytes} bytes per sequence; at most 64 MiB"
        )));
    }
    Ok(Bytes::from(vec![0u8; bytes]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_config::text::parse;

    const IO: &str = r#"name: "m" max_batch_size: 8
        input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
        output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"#;

    fn settings(sequence: &str) -> Result<SequenceConfig> {
        let config = parse(&format!("{IO} sequence_batching {{ {sequence} }}")).unwrap();
        SequenceConfig::from_config(&config, Path::new("/nonexistent"))
    }

    #[test]
    fn controls_and_states_are_read() {
        let s = settings(
            r#"max_sequence_idle_microseconds: 2000000
               oldest { max_candidate_sequences: 4 preferred_batch_size: [ 8, 4 ] max_queue_delay_microseconds: 100 }
               control_input [
                 { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
                 { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
                 { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
                 { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ] } ]
               state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 2, 3 ] } ]"#,
        )
        .unwrap();
        assert_eq!(s.idle, Duration::from_secs(2));
        assert_eq!(
            s.strategy,
            Strategy::Oldest {
                max_candidate_sequences: Some(4),
                preferred_batch_size: vec![4, 8],
                max_queue_delay: Duration::from_micros(100)
            }
        );
        assert_eq!(
            s.controls[0].values,
            [Bytes::from(vec![0, 0, 0, 0]), Bytes::from(vec![1, 0, 0, 0])]
        );
        assert_eq!(s.controls[1].values, [Bytes::from(vec![0]), Bytes::from(vec![1])]);
        assert_eq!(s.controls[2].values[1], Bytes::from(1.0f32.to_le_bytes().to_vec()));
        assert_eq!(s.correlation_control().unwrap().datatype, DataType::Bytes);
        assert_eq!(s.states[0].initial.len(), 24);
        assert_eq!(s.slots, 8);
    }

    #[test]
    fn bad_settings_name_what_is_wrong() {
        for (sequence, needle) in [
            (
                r#"control_input [ { name: "IN" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]"#,
                "also listed under input",
            ),
            (
                r#"control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ]"#,
                "exactly two",
            ),
            (
                r#"control_input [ { name: "S" control [ { kind: CONTROL_SEQUENCE_START } ] } ]"#,
                "one of int32_false_true",
            ),
            (
                r#"control_input [ { name: "C" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ]"#,
                "TYPE_UINT64",
            ),
            (
                r#"control_input [ { name: "A" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] }, { name: "B" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]"#,
                "more than one",
            ),
            (
                r#"state [ { input_name: "S" output_name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]"#,
                "also listed under output",
            ),
            (
                r#"state [ { input_name: "S" output_name: "T" data_type: TYPE_INT32 dims: [ -1 ] } ]"#,
                "variable dims",
            ),
            (
                r#"state [ { input_name: "S" output_name: "T" data_type: TYPE_STRING dims: [ 1 ] } ]"#,
                "fixed-size",
            ),
            (
                r#"state [ { input_name: "S" output_name: "T" data_type: TYPE_INT32 dims: [ 1 ] initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "../x" } } ]"#,
                "data_file",
            ),
            (
                "oldest { preferred_batch_size: [ 9 ] }",
                "between 1 and max_batch_size 8",
            ),
            ("direct { minimum_slot_utilization: 2 }", "between 0 and 1"),
        ] {
            let e = settings(sequence).unwrap_err();
            assert!(e.message().contains(needle), "{sequence}: {e}");
            assert!(
                e.message().contains("model 'm'") || e.message().contains("data_file"),
                "{e}"
            );
        }
    }

    #[test]
    fn implicit_tensors_are_named_and_defaults_filled() {
        let mut config = parse(&format!(
            r#"{IO} sequence_batching {{ control_input [ {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }} ]
               state [ {{ input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ] }}"#
        ))
        .unwrap();
        assert_eq!(implicit_inputs(&config), ["START", "S_IN"]);
        assert_eq!(implicit_outputs(&config), ["S_OUT"]);
        let Some(SchedulingChoice::SequenceBatching(sequence)) = &mut config.scheduling_choice else {
            unreachable!()
        };
        fill_defaults(sequence);
        assert_eq!(sequence.max_sequence_idle_microseconds, 1_000_000);
        assert!(matches!(sequence.strategy_choice, Some(StrategyChoice::Direct(_))));
    }
}
