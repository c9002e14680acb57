//! `ModelInferRequest` / `ModelInferResponse` to and from the core's types.
//!
//! Tensor payloads arrive as `raw_input_contents` (what tritonclient sends;
//! taken as `Bytes` without a copy) or as typed `contents`, which are
//! serialised once into the raw layout. Outputs always go back in
//! `raw_output_contents`, as Triton sends them. The same messages the other
//! way round serve a remote model's calls to another server.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use nereid_proto::inference::{
    InferBatchStatistics, InferParameter, InferStatistics, InferTensorContents, ModelInferRequest, ModelInferResponse,
    ModelStatistics, StatisticDuration, infer_parameter::ParameterChoice, model_infer_request,
    model_infer_response::InferOutputTensor,
};

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::parameter::{Parameter, Parameters};
use crate::request::{InferRequest, Protocol, RequestedOutput};
use crate::response::{InferResponse, Produced};
use crate::server::{VersionStatistics, parse_version};
use crate::shared_memory::TensorRegion;
use crate::statistics::StatDuration;
use crate::tensor::{Tensor, push_bytes_element};

/// The request-shape limits a JSON request is held to (its parser checks
/// them as it reads; here the message is decoded already, within its
/// admitted decoded size, so they bound what is converted and kept).
fn check_limits(message: &ModelInferRequest) -> Result<()> {
    use crate::request_limits::{MAX_DIMS, MAX_PARAMETERS, MAX_TENSORS, check};
    check("inputs of a request", message.inputs.len(), MAX_TENSORS)?;
    check("outputs of a request", message.outputs.len(), MAX_TENSORS)?;
    check("parameters of a request", message.parameters.len(), MAX_PARAMETERS)?;
    for input in &message.inputs {
        check(
            format_args!("dimensions of input '{}'", input.name),
            input.shape.len(),
            MAX_DIMS,
        )?;
        check(
            format_args!("parameters of input '{}'", input.name),
            input.parameters.len(),
            MAX_PARAMETERS,
        )?;
    }
    for output in &message.outputs {
        check(
            format_args!("parameters of output '{}'", output.name),
            output.parameters.len(),
            MAX_PARAMETERS,
        )?;
    }
    Ok(())
}

pub fn request(message: ModelInferRequest) -> Result<InferRequest> {
    check_limits(&message)?;
    let model = message.model_name;
    let mut raw = message.raw_input_contents.into_iter();
    let use_raw = raw.len() > 0;
    // Inputs in shared memory carry no data of their own.
    let mut shared_memory_inputs = BTreeMap::new();
    for input in &message.inputs {
        if let Some(region) = TensorRegion::from_parameters(&input.name, &parameters(&input.parameters))? {
            shared_memory_inputs.insert(input.name.clone(), region);
        }
    }
    let with_data = message.inputs.len() - shared_memory_inputs.len();
    // Triton's words for mixing the two ways of sending data, before any
    // count could mismatch because of it.
    if use_raw && let Some(mixed) = message.inputs.iter().find(|i| i.contents.is_some()) {
        return Err(Error::invalid(format!(
            "contents field must not be specified when using raw_input_contents for '{}' for model '{model}'",
            mixed.name
        )));
    }
    if use_raw && raw.len() != with_data {
        return Err(Error::invalid(format!(
            "expected {with_data} raw_input_contents (one per input not in shared memory) for model '{model}', got {}",
            raw.len()
        )));
    }
    let mut inputs = Vec::with_capacity(message.inputs.len());
    for input in message.inputs {
        if shared_memory_inputs.contains_key(&input.name) {
            if input.contents.is_some() {
                return Err(Error::invalid(format!(
                    "input '{}' for model '{model}' sets contents and a shared memory region",
                    input.name
                )));
            }
            let datatype = DataType::from_wire(&input.datatype)
                .ok_or_else(|| Error::invalid(format!("invalid datatype for input {}", input.name)))?;
            inputs.push(Tensor::new(input.name, datatype, input.shape, Bytes::new()));
            continue;
        }
        let datatype = DataType::from_wire(&input.datatype)
            .ok_or_else(|| Error::invalid(format!("invalid datatype for input {}", input.name)))?;
        if input.shape.iter().any(|d| *d < 0) {
            return Err(Error::invalid(format!(
                "invalid shape {:?} for input '{}': dimensions must be non-negative",
                input.shape, input.name
            )));
        }
        let data = match (use_raw, input.contents) {
            // Mixing was refused above.
            (true, _) => raw.next().expect("raw count was checked"),
            (false, Some(contents)) => from_contents(&input.name, &model, datatype, contents)?,
            (false, None) => {
                return Err(Error::invalid(format!(
                    "unable to find data for input tensor '{}' for model '{model}' in request.",
                    input.name
                )));
            }
        };
        inputs.push(Tensor::new(input.name, datatype, input.shape, data));
    }
    let mut outputs = Vec::with_capacity(message.outputs.len());
    for output in message.outputs {
        let classification = match output
            .parameters
            .get("classification")
            .and_then(|p| p.parameter_choice.as_ref())
        {
            None => None,
            Some(ParameterChoice::Int64Param(k)) if *k > 0 => Some(*k as usize),
            Some(_) => {
                return Err(Error::invalid(
                    "invalid value type for 'classification' parameter, expected a positive int64_param",
                ));
            }
        };
        let shared_memory = TensorRegion::from_parameters(&output.name, &parameters(&output.parameters))?;
        outputs.push(RequestedOutput {
            name: output.name,
            classification,
            shared_memory,
        });
    }
    Ok(InferRequest {
        model_version: parse_version(&message.model_version)?,
        model_name: model,
        id: message.id,
        inputs,
        outputs,
        parameters: parameters(&message.parameters),
        shared_memory_inputs,
        protocol: Protocol::Grpc,
        ..Default::default()
    })
}

/// The request parameter asking for an empty response that carries the
/// final flag of a decoupled request.
pub const EMPTY_FINAL: &str = "triton_enable_empty_final_response";

/// The response parameter that marks a request's last response.
pub const FINAL: &str = "triton_final_response";

/// Whether a streamed response is its request's last.
pub fn is_final(response: &ModelInferResponse) -> bool {
    response
        .parameters
        .get(FINAL)
        .is_some_and(|p| p.parameter_choice == Some(ParameterChoice::BoolParam(true)))
}

/// A request this server sends to another (a remote model's call): raw
/// contents, every output asked for by name.
pub fn outgoing_request(
    model: &str,
    version: &str,
    id: &str,
    inputs: Vec<Tensor>,
    outputs: &[String],
    parameters: &Parameters,
) -> ModelInferRequest {
    let mut raw = Vec::with_capacity(inputs.len());
    let inputs = inputs
        .into_iter()
        .map(|tensor| {
            raw.push(tensor.data);
            model_infer_request::InferInputTensor {
                name: tensor.name,
                datatype: tensor.datatype.as_wire().to_string(),
                shape: tensor.shape,
                ..Default::default()
            }
        })
        .collect();
    ModelInferRequest {
        model_name: model.to_string(),
        model_version: version.to_string(),
        id: id.to_string(),
        parameters: wire_parameters(parameters),
        inputs,
        outputs: outputs
            .iter()
            .map(|name| model_infer_request::InferRequestedOutputTensor {
                name: name.clone(),
                ..Default::default()
            })
            .collect(),
        raw_input_contents: raw,
    }
}

/// Another server's answer as this one's: its outputs as tensors (their
/// raw contents taken without a copy) and its parameters, less the final
/// flag a stream's responses carry (the stream's end says that here).
pub fn incoming_response(message: ModelInferResponse) -> Result<Produced> {
    let mut parameters = parameters(&message.parameters);
    parameters.remove(FINAL);
    Ok(Produced {
        outputs: incoming_outputs(message)?,
        parameters,
    })
}

fn incoming_outputs(message: ModelInferResponse) -> Result<Vec<Tensor>> {
    if message.raw_output_contents.len() != message.outputs.len() {
        return Err(Error::internal(format!(
            "the answer has {} outputs but {} raw_output_contents",
            message.outputs.len(),
            message.raw_output_contents.len()
        )));
    }
    message
        .outputs
        .into_iter()
        .zip(message.raw_output_contents)
        .map(|(output, data)| {
            let datatype = DataType::from_wire(&output.datatype).ok_or_else(|| {
                Error::internal(format!(
                    "output '{}' has an unknown datatype '{}'",
                    output.name, output.datatype
                ))
            })?;
            let tensor = Tensor::new(output.name, datatype, output.shape, data);
            tensor.check_data_size().map(|()| tensor)
        })
        .collect()
}

fn wire_parameters(parameters: &Parameters) -> HashMap<String, InferParameter> {
    parameters
        .iter()
        .map(|(k, v)| {
            let choice = match v {
                Parameter::Bool(b) => ParameterChoice::BoolParam(*b),
                Parameter::Int(i) => ParameterChoice::Int64Param(*i),
                Parameter::Uint(u) => ParameterChoice::Uint64Param(*u),
                Parameter::Double(d) => ParameterChoice::DoubleParam(*d),
                Parameter::String(s) => ParameterChoice::StringParam(s.clone()),
            };
            let value = InferParameter {
                parameter_choice: Some(choice),
            };
            (k.clone(), value)
        })
        .collect()
}

fn parameters(map: &HashMap<String, InferParameter>) -> Parameters {
    map.iter()
        .filter_map(|(k, v)| {
            let value = match v.parameter_choice.as_ref()? {
                ParameterChoice::BoolParam(b) => Parameter::Bool(*b),
                ParameterChoice::Int64Param(i) => Parameter::Int(*i),
                ParameterChoice::StringParam(s) => Parameter::String(s.clone()),
                ParameterChoice::DoubleParam(d) => Parameter::Double(*d),
                ParameterChoice::Uint64Param(u) => Parameter::Uint(*u),
            };
            Some((k.clone(), value))
        })
        .collect()
}

/// Serialises typed `contents` into the raw little-endian layout.
fn from_contents(name: &str, model: &str, datatype: DataType, c: InferTensorContents) -> Result<Bytes> {
    let mut out = Vec::new();
    let narrow = |what: &str| {
        Error::invalid(format!(
            "input '{name}' for model '{model}': a value does not fit in {what}"
        ))
    };
    macro_rules! narrow {
        ($src:expr, $ty:ty) => {
            for v in $src {
                out.extend_from_slice(
                    &<$ty>::try_from(v)
                        .map_err(|_| narrow(stringify!($ty)))?
                        .to_le_bytes(),
                );
            }
        };
    }
    match datatype {
        DataType::Bool => out.extend(c.bool_contents.iter().map(|b| u8::from(*b))),
        DataType::Int8 => narrow!(c.int_contents, i8),
        DataType::Int16 => narrow!(c.int_contents, i16),
        DataType::Int32 => c
            .int_contents
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DataType::Int64 => c
            .int64_contents
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DataType::Uint8 => narrow!(c.uint_contents, u8),
        DataType::Uint16 => narrow!(c.uint_contents, u16),
        DataType::Uint32 => c
            .uint_contents
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DataType::Uint64 => c
            .uint64_contents
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DataType::Fp32 => c
            .fp32_contents
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DataType::Fp64 => c
            .fp64_contents
            .iter()
            .for_each(|v| out.extend_from_slice(&v.to_le_bytes())),
        DataType::Bytes => {
            for element in &c.bytes_contents {
                push_bytes_element(&mut out, element)?;
            }
        }
        DataType::Fp16 | DataType::Bf16 => {
            return Err(Error::invalid(format!(
                "unexpected explicit tensor data for input tensor '{name}' for model '{model}' of type '{datatype}': send it in raw_input_contents"
            )));
        }
    }
    Ok(Bytes::from(out))
}

pub fn response(response: InferResponse) -> ModelInferResponse {
    let mut outputs = Vec::with_capacity(response.outputs.len());
    let mut raw = Vec::with_capacity(response.outputs.len());
    for tensor in response.outputs {
        // An output written into shared memory says where, and its raw
        // entry stays (empty) so that the others keep their positions.
        let parameters = response
            .output_parameters
            .get(&tensor.name)
            .map(wire_parameters)
            .unwrap_or_default();
        outputs.push(InferOutputTensor {
            name: tensor.name,
            datatype: tensor.datatype.as_wire().to_string(),
            shape: tensor.shape,
            parameters,
            ..Default::default()
        });
        raw.push(tensor.data);
    }
    ModelInferResponse {
        model_name: response.model_name,
        model_version: response.model_version.to_string(),
        id: response.id,
        parameters: wire_parameters(&response.parameters),
        outputs,
        raw_output_contents: raw,
    }
}

/// One version's statistics as `inference.ModelStatistics`.
pub fn statistics(v: VersionStatistics) -> ModelStatistics {
    let d = |d: StatDuration| {
        Some(StatisticDuration {
            count: d.count,
            ns: d.ns,
        })
    };
    let i = v.stats.inference_stats;
    ModelStatistics {
        name: v.name,
        version: v.version.to_string(),
        last_inference: v.stats.last_inference,
        inference_count: v.stats.inference_count,
        execution_count: v.stats.execution_count,
        inference_stats: Some(InferStatistics {
            success: d(i.success),
            fail: d(i.fail),
            queue: d(i.queue),
            compute_input: d(i.compute_input),
            compute_infer: d(i.compute_infer),
            compute_output: d(i.compute_output),
            cache_hit: d(StatDuration::default()),
            cache_miss: d(StatDuration::default()),
        }),
        batch_stats: v
            .stats
            .batch_stats
            .into_iter()
            .map(|(batch_size, b)| InferBatchStatistics {
                batch_size,
                compute_input: d(b.compute_input),
                compute_infer: d(b.compute_infer),
                compute_output: d(b.compute_output),
            })
            .collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::inference::model_infer_request::InferInputTensor;

    fn input(name: &str, datatype: &str, shape: Vec<i64>, contents: Option<InferTensorContents>) -> InferInputTensor {
        InferInputTensor {
            name: name.into(),
            datatype: datatype.into(),
            shape,
            contents,
            ..Default::default()
        }
    }

    #[test]
    fn typed_contents_become_raw_bytes() {
        let message = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![
                input(
                    "A",
                    "INT16",
                    vec![2],
                    Some(InferTensorContents {
                        int_contents: vec![1, -2],
                        ..Default::default()
                    }),
                ),
                input(
                    "S",
                    "BYTES",
                    vec![1],
                    Some(InferTensorContents {
                        bytes_contents: vec![b"hi".to_vec()],
                        ..Default::default()
                    }),
                ),
            ],
            ..Default::default()
        };
        let r = request(message).unwrap();
        assert_eq!(r.inputs[0].data.as_ref(), &[1, 0, 0xfe, 0xff]);
        assert_eq!(r.inputs[1].data.as_ref(), &[2, 0, 0, 0, b'h', b'i']);
        assert_eq!(r.model_version, None);
    }

    #[test]
    fn rejects_mixed_or_missing_data() {
        let mut message = ModelInferRequest {
            model_name: "m".into(),
            inputs: vec![input("A", "INT32", vec![1], Some(InferTensorContents::default()))],
            raw_input_contents: vec![Bytes::from_static(&[0; 4])],
            ..Default::default()
        };
        assert!(
            request(message.clone())
                .unwrap_err()
                .message()
                .contains("contents field must not be specified")
        );
        message.raw_input_contents.clear();
        message.inputs[0].contents = None;
        assert!(
            request(message.clone())
                .unwrap_err()
                .message()
                .contains("unable to find data")
        );
        message.inputs[0].contents = Some(InferTensorContents {
            int_contents: vec![300],
            ..Default::default()
        });
        message.inputs[0].datatype = "INT8".into();
        assert!(request(message).unwrap_err().message().contains("'A'"));
    }

    #[test]
    fn another_servers_answer_keeps_its_parameters_but_not_its_final_flag() {
        let param = |choice| InferParameter {
            parameter_choice: Some(choice),
        };
        let message = ModelInferResponse {
            outputs: vec![InferOutputTensor {
                name: "OUT".into(),
                datatype: "INT32".into(),
                shape: vec![1],
                ..Default::default()
            }],
            raw_output_contents: vec![Bytes::from_static(&[7, 0, 0, 0])],
            parameters: HashMap::from([
                ("tokens".to_string(), param(ParameterChoice::Int64Param(3))),
                (FINAL.to_string(), param(ParameterChoice::BoolParam(true))),
            ]),
            ..Default::default()
        };
        let produced = incoming_response(message).unwrap();
        assert_eq!(produced.outputs[0].data.as_ref(), &[7, 0, 0, 0]);
        assert_eq!(produced.parameters.len(), 1);
        assert_eq!(produced.parameters.get("tokens").and_then(|p| p.as_i64()), Some(3));
    }
}
