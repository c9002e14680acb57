//! The HTTP/REST infer body: KServe v2 JSON plus Triton's binary tensor
//! data extension, in both directions.
//!
//! With `Inference-Header-Content-Length: n`, the first `n` bytes of the body
//! are the JSON header and the rest is the binary data of the inputs that
//! carry `binary_data_size`, in order. Binary inputs are zero-copy slices of
//! the body.

use std::borrow::Cow;
use std::collections::BTreeMap;

use bytes::{BufMut, Bytes, BytesMut};
use serde::Serialize;

use super::compression::{self, Encoding};
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
    /// The outputs the request listed, each with its choice; a handful, so
    /// a list, searched in order.
    pub listed: Vec<(String, bool)>,
}

impl BinaryOutputs {
    fn is_binary(&self, name: &str) -> bool {
        self.listed
            .iter()
            .find(|(listed, _)| listed == name)
            .map_or(self.default, |(_, binary)| *binary)
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
        listed: Vec::new(),
    };

    let mut inputs = Vec::with_capacity(parsed.inputs.0.len());
    let mut shared_memory_inputs = BTreeMap::new();
    for input in parsed.inputs.0 {
        let name = input.name;
        let datatype = DataType::from_wire(&input.datatype)
            .ok_or_else(|| Error::invalid(format!("invalid datatype for input {name}")))?;
        let parameters = input.parameters;
        let shape = input.shape.0;
        let binary_size = match parameters.binary_data_size {
            None => None,
            Some(p) => Some(p.as_i64().and_then(|v| usize::try_from(v).ok()).ok_or_else(|| {
                Error::invalid(format!(
                    "unable to parse 'binary_data_size' of input '{name}': expected a non-negative integer"
                ))
            })?),
        };
        if shape.iter().any(|d| *d < 0) {
            return Err(Error::invalid(format!(
                "invalid shape {shape:?} for input '{name}': dimensions must be non-negative"
            )));
        }
        let region = TensorRegion::from_parameters(&name, &parameters.shared_memory)?;
        if let Some(region) = region {
            if binary_size.is_some() || input.data.is_some() {
                return Err(Error::invalid(format!(
                    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But set 'shared_memory_region' and another for input '{name}'"
                )));
            }
            // The server reads the data from the region.
            shared_memory_inputs.insert(name.to_string(), region);
            inputs.push(Tensor::new(name, datatype, shape, Bytes::new()));
            continue;
        }
        let data = match (binary_size, input.data) {
            (Some(_), Some(_)) => {
                return Err(Error::invalid(format!(
                    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But set 'data' 'binary_data_size' for input '{name}'"
                )));
            }
            (None, None) => {
                return Err(Error::invalid(format!(
                    "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', 'shared_memory_region' in 'parameters'. But no field is set for input '{name}'"
                )));
            }
            (Some(size), None) => {
                if binary.len() < size {
                    return Err(Error::invalid(format!(
                        "unexpected size for input '{name}', expecting {} additional bytes for model '{model}'",
                        size - binary.len()
                    )));
                }
                binary.split_to(size)
            }
            (None, Some(data)) => {
                let count = element_count(&shape).map_err(|e| e.context(format!("input '{name}'")))?;
                json_tensor::decode(&name, datatype, data, count, &mut reservation)?
            }
        };
        inputs.push(Tensor::new(name, datatype, shape, data));
    }
    if !binary.is_empty() {
        return Err(Error::invalid(format!(
            "unexpected additional input data for model '{model}'"
        )));
    }

    let requested = parsed.outputs.map(|o| o.0).unwrap_or_default();
    let mut outputs = Vec::with_capacity(requested.len());
    binary_outputs.listed.reserve_exact(requested.len());
    for output in requested {
        let name = output.name;
        let parameters = output.parameters;
        let binary = match parameters.binary_data {
            None => false,
            Some(binary) => binary
                .as_bool()
                .ok_or_else(|| Error::invalid(format!("'binary_data' of output '{name}' must be a boolean")))?,
        };
        let classification = match parameters.classification {
            None => None,
            Some(p) => Some(
                p.as_i64()
                    .and_then(|k| usize::try_from(k).ok())
                    .filter(|k| *k > 0)
                    .ok_or_else(|| {
                        Error::invalid(format!(
                            "'classification' of output '{name}' must be a positive integer"
                        ))
                    })?,
            ),
        };
        let shared_memory = TensorRegion::from_parameters(&name, &parameters.shared_memory)?;
        let name = name.into_owned();
        binary_outputs.listed.push((name.clone(), binary));
        outputs.push(RequestedOutput {
            name,
            classification,
            shared_memory,
        });
    }

    Ok(DecodedRequest {
        request: InferRequest {
            model_name: model.to_string(),
            model_version: version,
            id: parsed.id.map(Cow::into_owned).unwrap_or_default(),
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
    /// Bytes of memory the body holds: what was written of its allocation
    /// (sized for the worst case, the rest never touched).
    pub allocated: usize,
}

/// The response header in Triton's key order (name, datatype, shape, data).
#[derive(Serialize)]
struct ResponseJson<'a> {
    #[serde(skip_serializing_if = "str::is_empty")]
    id: &'a str,
    model_name: &'a str,
    /// A string, as Triton sends it.
    #[serde(serialize_with = "as_text")]
    model_version: i64,
    /// What the model set on the response (a Python model's
    /// `InferenceResponse(parameters=...)`), as KServe v2 places it.
    #[serde(skip_serializing_if = "no_parameters")]
    parameters: &'a Parameters,
    outputs: OutputsJson<'a>,
}

fn no_parameters(parameters: &&Parameters) -> bool {
    parameters.is_empty()
}

fn as_text<S: serde::Serializer>(version: &i64, serializer: S) -> std::result::Result<S::Ok, S::Error> {
    serializer.collect_str(version)
}

/// The outputs, serialized as they are visited: no list of them is built.
struct OutputsJson<'a> {
    response: &'a InferResponse,
    binary_outputs: &'a BinaryOutputs,
}

impl Serialize for OutputsJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        serializer.collect_seq(self.response.outputs.iter().map(|t| self.output(t)))
    }
}

impl<'a> OutputsJson<'a> {
    /// Whether `tensor`'s data follows the JSON (and not in it).
    fn is_binary(&self, tensor: &Tensor) -> bool {
        !self.response.in_shared_memory(&tensor.name) && self.binary_outputs.is_binary(&tensor.name)
    }

    fn output(&self, tensor: &'a Tensor) -> OutputJson<'a> {
        let (parameters, data) = if self.response.in_shared_memory(&tensor.name) {
            let parameters = self.response.output_parameters.get(&tensor.name);
            (parameters.map(OutputParameters::Listed), None)
        } else if self.binary_outputs.is_binary(&tensor.name) {
            let size = tensor.data.len();
            (Some(OutputParameters::Binary { binary_data_size: size }), None)
        } else {
            let data = json_tensor::Data {
                datatype: tensor.datatype,
                data: &tensor.data,
            };
            (None, Some(data))
        };
        OutputJson {
            name: &tensor.name,
            datatype: tensor.datatype.as_wire(),
            shape: &tensor.shape,
            parameters,
            data,
        }
    }
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

/// Room for the JSON header besides its names and shapes, and per output.
const HEADER_ROOM: usize = 64;
const OUTPUT_ROOM: usize = 96;

/// Characters a client's text may take in JSON, per byte (`\u0001`).
const ESCAPED: usize = 6;

/// The most bytes [`encode`] can write for `response`: the answer's memory,
/// reserved in the budget before it is written (a JSON answer is up to 12.5
/// times its tensors; counted only once written, four concurrent 15 MiB
/// answers overran a 64 MiB budget by 300 MiB).
pub fn max_encoded_len(response: &InferResponse, binary_outputs: &BinaryOutputs) -> usize {
    let outputs = OutputsJson {
        response,
        binary_outputs,
    };
    let mut total = (HEADER_ROOM + text(&response.id) + text(&response.model_name))
        .saturating_add(parameters_len(&response.parameters));
    for tensor in &response.outputs {
        total = total
            .saturating_add(OUTPUT_ROOM + text(&tensor.name))
            .saturating_add(21 * tensor.shape.len());
        total = total.saturating_add(if let Some(parameters) = response.output_parameters.get(&tensor.name) {
            parameters_len(parameters)
        } else if outputs.is_binary(tensor) {
            tensor.data.len() + 64
        } else {
            json_tensor::max_json_len(tensor.datatype, tensor.data.len())
        });
    }
    total
}

/// The most bytes `s` takes as a JSON string.
fn text(s: &str) -> usize {
    ESCAPED.saturating_mul(s.len()).saturating_add(2)
}

/// The most bytes `parameters` take as a JSON object's members.
fn parameters_len(parameters: &Parameters) -> usize {
    parameters
        .iter()
        .map(|(key, value)| {
            text(key)
                .saturating_add(match value {
                    Parameter::String(s) => text(s),
                    _ => 24,
                })
                .saturating_add(2)
        })
        .fold(16, usize::saturating_add)
}

/// The most bytes [`encode`] holds for `response`, compressed or not (see
/// [`max_encoded_len`]): what is reserved before it is written.
pub fn max_encoded_size(response: &InferResponse, binary_outputs: &BinaryOutputs, compress: Option<Encoding>) -> usize {
    let text = max_encoded_len(response, binary_outputs);
    match compress {
        Some(_) => compression::max_compressed_len(text),
        None => text,
    }
}

/// The JSON header and the binary outputs after it, written into one
/// buffer of [`max_encoded_size`]: it never grows (and pages it does not
/// write are never touched). When compressed, the text goes through the
/// compressor as it is written and is never whole in memory.
pub fn encode(response: &InferResponse, binary_outputs: &BinaryOutputs, compress: Option<Encoding>) -> EncodedResponse {
    let header = ResponseJson {
        id: &response.id,
        model_name: &response.model_name,
        model_version: response.model_version,
        parameters: &response.parameters,
        outputs: OutputsJson {
            response,
            binary_outputs,
        },
    };
    let binary: Vec<&Tensor> = response
        .outputs
        .iter()
        .filter(|t| header.outputs.is_binary(t))
        .collect();
    let mut header_length = 0;
    let mut write = |out: &mut dyn std::io::Write| -> std::io::Result<()> {
        let mut counted = Counted { inner: out, written: 0 };
        serde_json::to_writer(&mut counted, &header)?;
        header_length = counted.written;
        for tensor in &binary {
            counted.inner.write_all(&tensor.data)?;
        }
        Ok(())
    };
    let capacity = max_encoded_size(response, binary_outputs, compress);
    let body = match compress {
        Some(encoding) => {
            Bytes::from(compression::compress_with(encoding, capacity, write).expect("writing into memory cannot fail"))
        }
        None => {
            let mut body = BytesMut::with_capacity(capacity).writer();
            write(&mut body).expect("writing into memory cannot fail");
            body.into_inner().freeze()
        }
    };
    EncodedResponse {
        allocated: body.len(),
        body,
        header_length: (!binary.is_empty()).then_some(header_length),
    }
}

/// A writer that counts what goes through it (the JSON header's length).
struct Counted<'a> {
    inner: &'a mut dyn std::io::Write,
    written: usize,
}

impl std::io::Write for Counted<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.written += n;
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
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
        let binary = BinaryOutputs {
            default: false,
            listed: vec![("A".into(), true)],
        };
        let encoded = encode(&response, &binary, None);
        let n = encoded.header_length.unwrap();
        let json: Value = serde_json::from_slice(&encoded.body[..n]).unwrap();
        assert_eq!(json["outputs"][0]["parameters"]["binary_data_size"], 4);
        assert_eq!(json["outputs"][1]["data"], serde_json::json!([6]));
        assert_eq!(json["model_version"], "1");
        assert_eq!(&encoded.body[n..], &[5, 0, 0, 0]);
        assert!(encoded.body.len() <= max_encoded_size(&response, &binary, None));

        // Compressed as it is written: the same bytes once inflated, and
        // the same JSON length.
        let packed = encode(&response, &binary, Some(Encoding::Gzip));
        assert_eq!(packed.header_length, Some(n));
        let mut inflated = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&packed.body[..]), &mut inflated).unwrap();
        assert_eq!(inflated, encoded.body);
    }
}
