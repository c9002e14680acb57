//! The HTTP/REST infer body: KServe v2 JSON plus Triton's binary tensor
//! data extension, in both directions.
//!
//! With `Inference-Header-Content-Length: n`, the first `n` bytes of the body
//! are the JSON header and the rest is the binary data of the inputs that
//! carry `binary_data_size`, in order. Binary inputs are zero-copy slices of
//! the body.

use std::collections::HashMap;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Deserialize;
use serde_json::{Map, Value};

use super::json_tensor;
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::parameter::{Parameter, Parameters};
use crate::request::{InferRequest, RequestedOutput};
use crate::response::InferResponse;
use crate::tensor::{Tensor, element_count};

pub const HEADER_LENGTH: &str = "inference-header-content-length";

#[derive(Deserialize)]
struct RequestJson {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    inputs: Vec<InputJson>,
    #[serde(default)]
    outputs: Option<Vec<OutputJson>>,
}

#[derive(Deserialize)]
struct InputJson {
    name: String,
    shape: Vec<i64>,
    datatype: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
    #[serde(default)]
    data: Option<Value>,
}

#[derive(Deserialize)]
struct OutputJson {
    name: String,
    #[serde(default)]
    parameters: Option<Map<String, Value>>,
}

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
pub fn decode(model: &str, version: Option<i64>, body: Bytes, header_length: Option<usize>) -> Result<DecodedRequest> {
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
    let parsed: RequestJson = serde_json::from_slice(&json)
        .map_err(|e| Error::invalid(format!("failed to parse the request JSON buffer: {e}")))?;

    let request_parameters = parameters(parsed.parameters.as_ref())?;
    let mut binary_outputs = BinaryOutputs {
        default: request_parameters
            .get("binary_data_output")
            .and_then(Parameter::as_bool)
            .unwrap_or(false),
        listed: HashMap::new(),
    };

    let mut inputs = Vec::with_capacity(parsed.inputs.len());
    for input in parsed.inputs {
        let datatype = DataType::from_wire(&input.datatype)
            .ok_or_else(|| Error::invalid(format!("invalid datatype for input {}", input.name)))?;
        let input_parameters = parameters(input.parameters.as_ref())?;
        let binary_size = match input_parameters.get("binary_data_size") {
            None => None,
            Some(p) => Some(p.as_i64().and_then(|v| usize::try_from(v).ok()).ok_or_else(|| {
                Error::invalid(format!(
                    "unable to parse 'binary_data_size' of input '{}': expected a non-negative integer",
                    input.name
                ))
            })?),
        };
        if input.shape.iter().any(|d| *d < 0) {
            return Err(Error::invalid(format!(
                "invalid shape {:?} for input '{}': dimensions must be non-negative",
                input.shape, input.name
            )));
        }
        let data = match (binary_size, &input.data) {
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
                let count = element_count(&input.shape).map_err(|e| e.context(format!("input '{}'", input.name)))?;
                json_tensor::decode(&input.name, datatype, data, count)?
            }
        };
        inputs.push(Tensor::new(input.name, datatype, input.shape, data));
    }
    if !binary.is_empty() {
        return Err(Error::invalid(format!(
            "unexpected additional input data for model '{model}'"
        )));
    }

    let mut outputs = Vec::new();
    for output in parsed.outputs.unwrap_or_default() {
        let output_parameters = parameters(output.parameters.as_ref())?;
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
        outputs.push(RequestedOutput {
            name: output.name,
            classification,
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
        },
        binary_outputs,
    })
}

/// Converts a JSON `parameters` object.
pub fn parameters(map: Option<&Map<String, Value>>) -> Result<Parameters> {
    let mut out = Parameters::new();
    for (key, value) in map.into_iter().flatten() {
        let parameter = match value {
            Value::Bool(b) => Parameter::Bool(*b),
            Value::String(s) => Parameter::String(s.clone()),
            Value::Number(n) => {
                if let Some(i) = n.as_i64() {
                    Parameter::Int(i)
                } else if let Some(u) = n.as_u64() {
                    Parameter::Uint(u)
                } else {
                    Parameter::Double(n.as_f64().unwrap_or_default())
                }
            }
            other => {
                return Err(Error::invalid(format!(
                    "parameter '{key}' must be a boolean, number or string, got {other}"
                )));
            }
        };
        out.insert(key.clone(), parameter);
    }
    Ok(out)
}

/// An encoded infer response: the body and, when binary data follows the
/// JSON, the JSON's length for `Inference-Header-Content-Length`.
pub struct EncodedResponse {
    pub body: Bytes,
    pub header_length: Option<usize>,
}

pub fn encode(response: &InferResponse, binary_outputs: &BinaryOutputs) -> EncodedResponse {
    let mut outputs = Vec::with_capacity(response.outputs.len());
    let mut blobs: Vec<&Bytes> = Vec::new();
    for tensor in &response.outputs {
        let mut entry = Map::new();
        entry.insert("name".into(), Value::String(tensor.name.clone()));
        entry.insert("datatype".into(), Value::String(tensor.datatype.as_wire().into()));
        entry.insert("shape".into(), Value::from(tensor.shape.clone()));
        if binary_outputs.is_binary(&tensor.name) {
            let mut parameters = Map::new();
            parameters.insert("binary_data_size".into(), Value::from(tensor.data.len()));
            entry.insert("parameters".into(), Value::Object(parameters));
            if !tensor.data.is_empty() {
                blobs.push(&tensor.data);
            }
        } else {
            entry.insert("data".into(), json_tensor::encode(tensor.datatype, &tensor.data));
        }
        outputs.push(Value::Object(entry));
    }
    let mut root = Map::new();
    if !response.id.is_empty() {
        root.insert("id".into(), Value::String(response.id.clone()));
    }
    root.insert("model_name".into(), Value::String(response.model_name.clone()));
    root.insert(
        "model_version".into(),
        Value::String(response.model_version.to_string()),
    );
    root.insert("outputs".into(), Value::Array(outputs));
    let json = serde_json::to_vec(&Value::Object(root)).expect("a JSON value serializes");
    if blobs.is_empty() {
        return EncodedResponse {
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
        body: body.freeze(),
        header_length: Some(header_length),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binary_body(json: &str, data: &[u8]) -> (Bytes, Option<usize>) {
        let mut body = json.as_bytes().to_vec();
        body.extend_from_slice(data);
        (Bytes::from(body), Some(json.len()))
    }

    #[test]
    fn decodes_binary_inputs_as_body_slices() {
        let json = r#"{"inputs":[{"name":"A","shape":[2],"datatype":"INT32","parameters":{"binary_data_size":8}},{"name":"B","shape":[1],"datatype":"INT32","data":[7]}],"outputs":[{"name":"C","parameters":{"binary_data":true}}]}"#;
        let (body, len) = binary_body(json, &[1, 0, 0, 0, 2, 0, 0, 0]);
        let decoded = decode("m", None, body, len).unwrap();
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
        let e = decode("m", None, body, len).unwrap_err();
        assert!(e.message().contains("expecting 4 additional bytes"), "{e}");
        let (body, len) = binary_body(json, &[0; 12]);
        let e = decode("m", None, body, len).unwrap_err();
        assert!(e.message().contains("unexpected additional input data"), "{e}");
    }

    #[test]
    fn rejects_malformed_requests() {
        let e = decode("m", None, Bytes::from_static(b"{not json"), None).unwrap_err();
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
            let e = decode("m", None, Bytes::from_static(body), None).unwrap_err();
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
            parameters: Default::default(),
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
