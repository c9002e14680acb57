//! The HTTP/REST infer body: KServe v2 JSON plus Triton's binary tensor
//! data extension, in both directions.
//!
//! With `Inference-Header-Content-Length: n`, the first `n` bytes of the body
//! are the JSON header and the rest is the binary data of the inputs that
//! carry `binary_data_size`, in order. Binary inputs are zero-copy slices of
//! the body.

use std::collections::{BTreeMap, HashMap};

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

use super::json_tensor;
use super::request_json::RequestJson;
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::memory_budget::Reservation;
use crate::parameter::{Parameter, Parameters};
use crate::request::{InferRequest, RequestedOutput};
use crate::response::InferResponse;
use crate::shared_memory::TensorRegion;
use crate::tensor::{Tensor, element_count};

pub const HEADER_LENGTH: &str = "inference-header-content-length";

/// A decoded infer request and how the client wants each output encoded.
#[derive(Debug)]
pub struct DecodedRequest {
    pub request: InferRequest,
    pub binary_outputs: BinaryOutputs,
}

/// Which outputs go back as binary data.
#[derive(Debug, Default)]
pub struct BinaryOutputs {
    /// For outputs the request did not list (`binary_data_output`).
    pub default: bool,
    pub listed: HashMap<String, bool>,
}

impl BinaryOutputs {
    fn is_binary(&self, name: &str) -> bool {
        self.listed.get(name).copied().unwrap_or(self.default)
    }
}

/// Parses an infer body. `header_length` is the parsed
/// `Inference-Header-Content-Length`, if the header was present.
/// `reservation` holds the body's bytes in the memory budget; it grows by
/// every buffer decoded from JSON and travels on with the request.
pub fn decode(
    model: &str,
    version: Option<i64>,
    body: Bytes,
    header_length: Option<usize>,
    mut reservation: Reservation,
) -> Result<DecodedRequest> {
    let (json, mut binary) = match header_length {
        None => (body, Bytes::new()),
        Some(0) => {
            return Err(Error::unsupported(
                "raw binary requests (Inference-Header-Content-Length: 0) are not supported",
            ));
        }
        Some(n) => {
            let mut json = body;
            let binary = json.split_off(n);
            (json, binary)
        }
    };
    let parsed: RequestJson<'_> = serde_json::from_slice(&json)
        .map_err(|e| Error::invalid(format!("failed to parse the request JSON buffer: {e}")))?;

    let request_parameters = parsed.parameters.0;
    let mut binary_outputs = BinaryOutputs {
        default: request_parameters
            .get("binary_data_output")
            .and_then(Parameter::as_bool)
            .unwrap_or(false),
        listed: HashMap::new(),
    };

    let mut inputs = Vec::with_capacity(parsed.inputs.0.len());
    let mut shared_memory_inputs = BTreeMap::new();
    for input in parsed.inputs.0 {
        let datatype = DataType::from_wire(&input.datatype)
            .ok_or_else(|| Error::invalid(format!("invalid datatype for input {}", input.name)))?;
        let input_parameters = input.parameters.0;
        let shape = input.shape.0;
        let binary_size = match input_parameters.get("binary_data_size") {
            None => None,
            Some(p) => Some(p.as_i64().and_then(|v| usize::try_from(v).ok()).ok_or_else(|| {
                Error::invalid(format!(
                    "unable to parse 'binary_data_size' of input '{}': expected a non-negative integer",
                    input.name
                ))
            })?),
        };
        if shape.iter().any(|d| *d < 0) {
            return Err(Error::invalid(format!(
                "invalid shape {shape:?} for input '{}': dimensions must be non-negative",
                input.name
            )));
        }
        let region = TensorRegion::from_parameters(&input.name, &input_parameters)?;
        if let Some(region) = region {
            if binary_size.is_some() || input.data.is_some() {
                return Err(Error::invalid(format!(
                    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But set 'shared_memory_region' and another for input '{}'",
                    input.name
                )));
            }
            // The server reads the data from the region.
            shared_memory_inputs.insert(input.name.clone(), region);
            inputs.push(Tensor::new(input.name, datatype, shape, Bytes::new()));
            continue;
        }
        let data = match (binary_size, input.data) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(format!(
                    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size' for input '{}'",
                    input.name
                )));
            }
            (None, None) => {
                return Err(Error::invalid(format!(
                    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no field is set for input '{}'",
                    input.name
                )));
            }
            (Some(size), None) => {
                if binary.len() < size {
                    return Err(Error::invalid(format!(
                        "unexpected size for input '{}', expecting {} additional bytes for model '{model}'",
                        input.name,
                        size - binary.len()
                    )));
                }
                binary.split_to(size)
            }
            (None, Some(data)) => {
                let count = element_count(&shape).map_err(|e| e.context(format!("input '{}'", input.name)))?;
                json_tensor::decode(&input.name, datatype, data, count, &mut reservation)?
            }
        };
        inputs.push(Tensor::new(input.name, datatype, shape, data));
    }
    if !binary.is_empty() {
        return Err(Error::invalid(format!(
            "unexpected additional input data for model '{model}'"
        )));
    }

    let mut outputs = Vec::new();
    for output in parsed.outputs.map(|o| o.0).unwrap_or_default() {
        let output_parameters = output.parameters.0;
        if let Some(binary) = output_parameters.get("binary_data") {
            let binary = binary.as_bool().ok_or_else(|| {
                Error::invalid(format!("'binary_data' of output '{}' must be a boolean", output.name))
            })?;
            binary_outputs.listed.insert(output.name.clone(), binary);
        } else {
            binary_outputs.listed.insert(output.name.clone(), false);
        }
        let classification = match output_parameters.get("classification") {
            None => None,
            Some(p) => Some(
                p.as_i64()
                    .and_then(|k| usize::try_from(k).ok())
                    .filter(|k| *k > 0)
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "'classification' of output '{}' must be a positive integer",
                            output.name
                        ))
                    })?,
            ),
        };
        let shared_memory = TensorRegion::from_parameters(&output.name, &output_parameters)?;
        outputs.push(RequestedOutput {
            name: output.name,
            classification,
            shared_memory,
        });
    }

    Ok(DecodedRequest {
        request: InferRequest {
            model_name: model.to_string(),
            model_version: version,
            id: parsed.id.unwrap_or_default(),
            inputs,
            outputs,
            parameters: request_parameters,
            reservation,
            shared_memory_inputs,
            ..Default::default()
        },
        binary_outputs,
    })
}

/// An encoded infer response: the body and, when binary data follows the
/// JSON, the JSON's length for `Inference-Header-Content-Length`.
pub struct EncodedResponse {
    pub body: Bytes,
    pub header_length: Option<usize>,
    /// Bytes of memory the body holds: its allocation, which JSON's growing
    /// buffer can leave larger than its length.
    pub allocated: usize,
}

/// The response header in Triton's key order (name, datatype, shape, data).
#[derive(Serialize)]
struct ResponseJson<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    model_name: &'a str,
    model_version: String,
    outputs: Vec<OutputJson<'a>>,
}

#[derive(Serialize)]
struct OutputJson<'a> {
    name: &'a str,
    datatype: &'static str,
    shape: &'a [i64],
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<OutputParameters<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<json_tensor::Data<'a>>,
}

/// An output's parameters: its binary size, or where in shared memory it is.
#[derive(Serialize)]
#[serde(untagged)]
enum OutputParameters<'a> {
    Binary { binary_data_size: usize },
    Listed(&'a Parameters),
}

pub fn encode(response: &InferResponse, binary_outputs: &BinaryOutputs) -> EncodedResponse {
    let mut blobs: Vec<&Bytes> = Vec::new();
    let outputs = response
        .outputs
        .iter()
        .map(|tensor| {
            if response.in_shared_memory(&tensor.name) {
                return OutputJson {
                    name: &tensor.name,
                    datatype: tensor.datatype.as_wire(),
                    shape: &tensor.shape,
                    parameters: response
                        .output_parameters
                        .get(&tensor.name)
                        .map(OutputParameters::Listed),
                    data: None,
                };
            }
            let binary = binary_outputs.is_binary(&tensor.name);
            if binary && !tensor.data.is_empty() {
                blobs.push(&tensor.data);
            }
            OutputJson {
                name: &tensor.name,
                datatype: tensor.datatype.as_wire(),
                shape: &tensor.shape,
                parameters: binary.then(|| OutputParameters::Binary {
                    binary_data_size: tensor.data.len(),
                }),
                data: (!binary).then_some(json_tensor::Data {
                    datatype: tensor.datatype,
                    data: &tensor.data,
                }),
            }
        })
        .collect();
    let header = ResponseJson {
        id: &response.id,
        model_name: &response.model_name,
        model_version: response.model_version.to_string(),
        outputs,
    };
    let json = serde_json::to_vec(&header).expect("the response header serializes");
    if blobs.is_empty() {
        return EncodedResponse {
            allocated: json.capacity(),
            body: Bytes::from(json),
            header_length: None,
        };
    }
    let total = json.len() + blobs.iter().map(|b| b.len()).sum::<usize>();
    let mut body = BytesMut::with_capacity(total);
    let header_length = json.len();
    body.put_slice(&json);
    for blob in blobs {
        body.put_slice(blob);
    }
    EncodedResponse {
        allocated: body.capacity(),
        body: body.freeze(),
        header_length: Some(header_length),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn binary_body(json: &str, data: &[u8]) -> (Bytes, Option<usize>) {
        let mut body = json.as_bytes().to_vec();
        body.extend_from_slice(data);
        (Bytes::from(body), Some(json.len()))
    }

    #[test]
    fn decodes_binary_inputs_as_body_slices() {
        let json = r#"{"inputs":[{"name":"A","shape":[2],"datatype":"INT32","parameters":{"binary_data_size":8}},{"name":"B","shape":[1],"datatype":"INT32","data":[7]}],"outputs":[{"name":"C","parameters":{"binary_data":true}}]}"#;
        let (body, len) = binary_body(json, &[1, 0, 0, 0, 2, 0, 0, 0]);
        let decoded = decode("m", None, body, len, Reservation::default()).unwrap();
        let r = decoded.request;
        assert_eq!(r.inputs[0].data.as_ref(), &[1, 0, 0, 0, 2, 0, 0, 0]);
        assert_eq!(r.inputs[1].data.as_ref(), &7i32.to_le_bytes());
        assert!(decoded.binary_outputs.is_binary("C"));
        assert!(!decoded.binary_outputs.is_binary("D"));
    }

    #[test]
    fn rejects_mismatched_binary_sizes() {
        let json = r#"{"inputs":[{"name":"A","shape":[2],"datatype":"INT32","parameters":{"binary_data_size":8}}]}"#;
        let (body, len) = binary_body(json, &[0; 4]);
        let e = decode("m", None, body, len, Reservation::default()).unwrap_err();
        assert!(e.message().contains("expecting 4 additional bytes"), "{e}");
        let (body, len) = binary_body(json, &[0; 12]);
        let e = decode("m", None, body, len, Reservation::default()).unwrap_err();
        assert!(e.message().contains("unexpected additional input data"), "{e}");
    }

    #[test]
    fn rejects_malformed_requests() {
        let e = decode(
            "m",
            None,
            Bytes::from_static(b"{not json"),
            None,
            Reservation::default(),
        )
        .unwrap_err();
        assert!(
            e.message().starts_with("failed to parse the request JSON buffer"),
            "{e}"
        );
        for (body, expected) in [
            (
                br#"{"inputs":[{"name":"A","shape":[1],"datatype":"INT33","data":[1]}]}"#.as_slice(),
                "invalid datatype for input A",
            ),
            (
                br#"{"inputs":[{"name":"A","shape":[1],"datatype":"INT32"}]}"#,
                "no field is set",
            ),
            (
                br#"{"inputs":[{"name":"A","shape":[-2],"datatype":"INT32","data":[]}]}"#,
                "'A'",
            ),
        ] {
            let e = decode("m", None, Bytes::from_static(body), None, Reservation::default()).unwrap_err();
            assert!(e.message().contains(expected), "{e}");
        }
    }

    #[test]
    fn encodes_binary_after_json() {
        let response = InferResponse {
            model_name: "m".into(),
            model_version: 1,
            id: "x".into(),
            outputs: vec![
                Tensor::new("A", DataType::Int32, vec![1], Bytes::from_static(&[5, 0, 0, 0])),
                Tensor::new("B", DataType::Int32, vec![1], Bytes::from_static(&[6, 0, 0, 0])),
            ],
            ..InferResponse::default()
        };
        let mut binary = BinaryOutputs::default();
        binary.listed.insert("A".into(), true);
        let encoded = encode(&response, &binary);
        let n = encoded.header_length.unwrap();
        let json: Value = serde_json::from_slice(&encoded.body[..n]).unwrap();
        assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], 4);
        assert_eq!(json["outputs"][1]["data"], serde_json::json!([6]));
        assert_eq!(json["model_version"], "1");
        assert_eq!(&encoded.body[n..], &[5, 0, 0, 0]);
    }
}
