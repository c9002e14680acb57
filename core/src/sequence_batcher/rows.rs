//! The tensors the server adds to a sequence request, and the states it
//! takes back from the answer.
//!
//! Each row gets its control inputs (START, END, READY as the config's
//! false/true values, CORRID as the id) and its state inputs (the initial
//! state when it starts the sequence, else what the last request left),
//! each with one row of batch when the model batches. From the answer the
//! state outputs are taken out and kept; the client never sees them.

use bytes::Bytes;

use super::correlation::CorrelationId;
use crate::error::{Error, Result};
use crate::model_config::sequence::{ControlKind, SequenceConfig};
use crate::response::Produced;
use crate::tensor::Tensor;

/// The row's full inputs: the client's, then controls, then states.
pub fn inputs(
    settings: &SequenceConfig,
    mut client: Vec<Tensor>,
    id: &CorrelationId,
    start: bool,
    end: bool,
    state: Option<&[Tensor]>,
) -> Vec<Tensor> {
    let batch: &[i64] = if settings.batching { &[1] } else { &[] };
    let shape = |dims: &[i64]| batch.iter().chain(dims).copied().collect::<Vec<i64>>();
    client.reserve(settings.controls.len() + settings.states.len());
    for control in &settings.controls {
        let data = match control.kind {
            ControlKind::Start => control.values[usize::from(start)].clone(),
            ControlKind::End => control.values[usize::from(end)].clone(),
            // Every row of a batch holds a request.
            ControlKind::Ready => control.values[1].clone(),
            ControlKind::CorrelationId => id.element(control.datatype),
        };
        client.push(Tensor::new(control.input.clone(), control.datatype, shape(&[1]), data));
    }
    for (i, spec) in settings.states.iter().enumerate() {
        let (dims, data) = match state.and_then(|s| s.get(i)) {
            Some(kept) => (kept.shape.as_slice(), kept.data.clone()),
            None => (spec.dims.as_slice(), spec.initial.clone()),
        };
        client.push(Tensor::new(spec.input.clone(), spec.datatype, shape(dims), data));
    }
    client
}

/// Whether a response carries the sequence's states (a decoupled model
/// may update them in only some of its responses).
pub fn carries_states(settings: &SequenceConfig, outputs: &[Tensor]) -> bool {
    settings
        .states
        .iter()
        .any(|spec| outputs.iter().any(|t| t.name == spec.output))
}

/// Splits an answer into what the client gets and the states to keep
/// (`None` when the request failed or a state output is missing: the
/// sequence keeps its old states).
pub fn take_states(
    settings: &SequenceConfig,
    model: &str,
    outcome: Result<Produced>,
) -> (Result<Produced>, Option<Vec<Tensor>>) {
    let Ok(Produced {
        mut outputs,
        parameters,
    }) = outcome
    else {
        return (outcome, None);
    };
    let mut states = Vec::with_capacity(settings.states.len());
    for spec in &settings.states {
        let Some(at) = outputs.iter().position(|t| t.name == spec.output) else {
            let error = Error::internal(format!("model '{model}' produced no state output '{}'", spec.output));
            return (Err(error), None);
        };
        let tensor = outputs.swap_remove(at);
        let shape = if settings.batching {
            tensor.shape.get(1..).unwrap_or_default().to_vec()
        } else {
            tensor.shape
        };
        // A copy, so the state does not keep the whole batch's buffer alive.
        states.push(Tensor::new(
            tensor.name,
            tensor.datatype,
            shape,
            Bytes::copy_from_slice(&tensor.data),
        ));
    }
    (Ok(Produced { outputs, parameters }), Some(states))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::DataType;
    use crate::model_config::text::parse;
    use std::path::Path;

    fn settings() -> SequenceConfig {
        let config = parse(
            r#"name: "m" max_batch_size: 4
               input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
               output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
               sequence_batching {
                 control_input [
                   { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
                   { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
                   { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
                   { name: "ID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]
                 state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_INT32 dims: [ 2 ] } ] }"#,
        )
        .unwrap();
        SequenceConfig::from_config(&config, Path::new(".")).unwrap()
    }

    #[test]
    fn rows_carry_their_controls_and_states() {
        let s = settings();
        let client = vec![Tensor::new(
            "IN",
            DataType::Int32,
            vec![1, 1],
            Bytes::from_static(&[5, 0, 0, 0]),
        )];
        let row = inputs(&s, client, &CorrelationId::Number(7), true, false, None);
        let names: Vec<(&str, &[i64])> = row.iter().map(|t| (t.name.as_str(), t.shape.as_slice())).collect();
        assert_eq!(
            names,
            [
                ("IN", &[1, 1][..]),
                ("START", &[1, 1]),
                ("END", &[1, 1]),
                ("READY", &[1, 1]),
                ("ID", &[1, 1]),
                ("S_IN", &[1, 2])
            ]
        );
        assert_eq!(row[1].data.as_ref(), 1i32.to_le_bytes());
        assert_eq!(row[2].data.as_ref(), [0]);
        assert_eq!(row[3].data.as_ref(), 1f32.to_le_bytes());
        assert_eq!(row[4].data.as_ref(), 7u64.to_le_bytes());
        assert_eq!(row[5].data.as_ref(), [0; 8]);
        // Later rows carry the state kept from the last answer.
        let kept = [Tensor::new(
            "S_OUT",
            DataType::Int32,
            vec![2],
            Bytes::from_static(&[1, 0, 0, 0, 2, 0, 0, 0]),
        )];
        let row = inputs(&s, Vec::new(), &CorrelationId::Number(7), false, true, Some(&kept));
        assert_eq!(row[0].data.as_ref(), 0i32.to_le_bytes());
        assert_eq!(row[1].data.as_ref(), [1]);
        assert_eq!(row[4].data, kept[0].data);
    }

    #[test]
    fn states_are_taken_out_of_the_answer() {
        let s = settings();
        let answer = vec![
            Tensor::new("OUT", DataType::Int32, vec![1, 1], Bytes::from_static(&[3, 0, 0, 0])),
            Tensor::new(
                "S_OUT",
                DataType::Int32,
                vec![1, 2],
                Bytes::from_static(&[1, 0, 0, 0, 2, 0, 0, 0]),
            ),
        ];
        let (client, states) = take_states(&s, "m", Ok(answer.into()));
        let client = client.unwrap().outputs;
        assert_eq!(client.len(), 1);
        assert_eq!(client[0].name, "OUT");
        assert_eq!(states.unwrap()[0].shape, [2]);
        let (client, states) = take_states(&s, "m", Ok(vec![].into()));
        assert!(client.unwrap_err().message().contains("no state output 'S_OUT'"));
        assert!(states.is_none());
    }
}
