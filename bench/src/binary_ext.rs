//! KServe v2 JSON over HTTP with Triton's binary tensor extension.
//!
//! A binary request or response body is a JSON header followed by the raw
//! tensor bytes, one after another in header order; the header's length is
//! given by the `Inference-Header-Content-Length` HTTP header and each
//! tensor's byte count by its `"parameters":{"binary_data_size":N}`. Without
//! that HTTP header the whole body is plain KServe JSON (`"data":[...]`).
//!
//! Both sides live here: the client's request encoding and response check
//! (nereid-perf), and the request decoding and echo response (nereid-echo).
//! The client builds its body once per run; the per-response check parses
//! only output names and sizes and skips any JSON data unread.

use bytes::{BufMut, Bytes, BytesMut};
use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::tensor::InputTensor;

/// The HTTP header carrying the JSON header's length.
pub const HEADER_LENGTH: &str = "inference-header-content-length";

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TensorParams {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_data_size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binary_data: Option<bool>,
}

/// An input (request) or output (response) entry of the JSON header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TensorHeader {
    pub name: String,
    #[serde(default)]
    pub shape: Vec<i64>,
    pub datatype: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<TensorParams>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl TensorHeader {
    fn binary_size(&self) -> Option<u64> {
        self.parameters.as_ref().and_then(|p| p.binary_data_size)
    }
}

#[derive(Serialize)]
struct RequestedOutput<'a> {
    name: &'a str,
    parameters: TensorParams,
}

#[derive(Serialize)]
struct RequestParams {
    binary_data_output: bool,
}

#[derive(Serialize)]
struct RequestHeader<'a> {
    inputs: Vec<TensorHeader>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    outputs: Vec<RequestedOutput<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<RequestParams>,
}

/// A request body ready to send any number of times.
#[derive(Debug, Clone)]
pub struct EncodedRequest {
    pub body: Bytes,
    /// `Some` for a binary-extension body, `None` for plain JSON.
    pub header_len: Option<usize>,
}

/// Encodes an infer request. With `binary`, inputs travel as raw bytes and
/// outputs are asked for as binary (all of them via `binary_data_output`
/// when `outputs` is empty); otherwise everything is JSON `data`.
pub fn encode_request(inputs: &[InputTensor], outputs: &[String], binary: bool) -> Result<EncodedRequest> {
    let mut headers = Vec::with_capacity(inputs.len());
    for t in inputs {
        let (parameters, data) = if binary {
            let size = TensorParams {
                binary_data_size: Some(t.raw.len() as u64),
                binary_data: None,
            };
            (Some(size), None)
        } else {
            (None, Some(t.to_json()?))
        };
        headers.push(TensorHeader {
            name: t.name.clone(),
            shape: t.shape.clone(),
            datatype: t.datatype.as_wire().to_string(),
            parameters,
            data,
        });
    }
    let header = RequestHeader {
        inputs: headers,
        outputs: outputs
            .iter()
            .map(|name| RequestedOutput {
                name,
                parameters: TensorParams {
                    binary_data_size: None,
                    binary_data: Some(binary),
                },
            })
            .collect(),
        parameters: (binary && outputs.is_empty()).then_some(RequestParams {
            binary_data_output: true,
        }),
    };
    let json = serde_json::to_vec(&header).map_err(|e| Error::Invalid(e.to_string()))?;
    if !binary {
        return Ok(EncodedRequest {
            body: json.into(),
            header_len: None,
        });
    }
    let header_len = json.len();
    let mut body = BytesMut::with_capacity(header_len + inputs.iter().map(|t| t.raw.len()).sum::<usize>());
    body.put_slice(&json);
    for t in inputs {
        body.put_slice(&t.raw);
    }
    Ok(EncodedRequest {
        body: body.freeze(),
        header_len: Some(header_len),
    })
}

/// Splits a body into JSON header and binary tail.
pub fn split_body(body: &Bytes, header_len: Option<usize>) -> Result<(Bytes, Bytes)> {
    match header_len {
        None => Ok((body.clone(), Bytes::new())),
        Some(n) if n <= body.len() => Ok((body.slice(..n), body.slice(n..))),
        Some(n) => Err(Error::Protocol(format!(
            "inference header length {n} exceeds the body ({} bytes)",
            body.len()
        ))),
    }
}

/// Parses the `Inference-Header-Content-Length` value.
pub fn parse_header_len(value: Option<&[u8]>) -> Result<Option<usize>> {
    value
        .map(|v| {
            std::str::from_utf8(v)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .ok_or_else(|| Error::Protocol("invalid Inference-Header-Content-Length".into()))
        })
        .transpose()
}

#[derive(Deserialize)]
struct OutputSummary {
    name: String,
    #[serde(default)]
    parameters: Option<TensorParams>,
    #[serde(default, rename = "data")]
    _data: Option<IgnoredAny>,
}

#[derive(Deserialize)]
struct ResponseSummary {
    #[serde(default)]
    outputs: Vec<OutputSummary>,
}

/// Checks an infer response body: it parses, names every `expected` output
/// (at least one output when none is expected), and its binary sizes add up.
pub fn check_response(body: &Bytes, header_len: Option<usize>, expected: &[String]) -> Result<()> {
    let (header, tail) = split_body(body, header_len)?;
    let summary: ResponseSummary =
        serde_json::from_slice(&header).map_err(|e| Error::Protocol(format!("response is not KServe v2 JSON: {e}")))?;
    if summary.outputs.is_empty() {
        return Err(Error::Protocol("response has no outputs".into()));
    }
    for name in expected {
        if !summary.outputs.iter().any(|o| &o.name == name) {
            return Err(Error::Protocol(format!("response lacks output '{name}'")));
        }
    }
    let binary: u64 = summary
        .outputs
        .iter()
        .filter_map(|o| o.parameters.as_ref().and_then(|p| p.binary_data_size))
        .sum();
    if binary != tail.len() as u64 {
        return Err(Error::Protocol(format!(
            "outputs declare {binary} binary bytes, body carries {}",
            tail.len()
        )));
    }
    Ok(())
}

/// A decoded infer request (nereid-echo's view).
#[derive(Debug, Clone)]
pub struct DecodedRequest {
    pub id: Option<String>,
    pub inputs: Vec<TensorHeader>,
    /// All binary input bytes, in input order.
    pub tail: Bytes,
}

#[derive(Deserialize)]
struct IncomingHeader {
    #[serde(default)]
    id: Option<String>,
    inputs: Vec<TensorHeader>,
}

/// Decodes a request body; checks that binary sizes match the tail.
pub fn decode_request(body: &Bytes, header_len: Option<usize>) -> Result<DecodedRequest> {
    let (header, tail) = split_body(body, header_len)?;
    let h: IncomingHeader =
        serde_json::from_slice(&header).map_err(|e| Error::Invalid(format!("malformed inference request: {e}")))?;
    let declared: u64 = h.inputs.iter().filter_map(TensorHeader::binary_size).sum();
    if declared != tail.len() as u64 {
        return Err(Error::Invalid(format!(
            "inputs declare {declared} binary bytes, body carries {}",
            tail.len()
        )));
    }
    if let Some(t) = h.inputs.iter().find(|t| t.binary_size().is_none() && t.data.is_none()) {
        return Err(Error::Invalid(format!(
            "input '{}' has neither data nor binary_data_size",
            t.name
        )));
    }
    Ok(DecodedRequest {
        id: h.id,
        inputs: h.inputs,
        tail,
    })
}

#[derive(Serialize)]
struct EchoHeader<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<String>,
    model_name: &'a str,
    model_version: &'a str,
    outputs: Vec<TensorHeader>,
}

/// Answers a request with its inputs as outputs (input i becomes output
/// `output_name(i)`): binary inputs come back binary, sharing the request's
/// bytes, JSON inputs come back as JSON.
pub fn encode_echo_response(
    model: &str,
    version: &str,
    request: DecodedRequest,
    output_name: impl Fn(usize) -> String,
) -> Result<EncodedRequest> {
    let outputs = request
        .inputs
        .into_iter()
        .enumerate()
        .map(|(i, t)| TensorHeader {
            name: output_name(i),
            ..t
        })
        .collect();
    let header = EchoHeader {
        id: request.id,
        model_name: model,
        model_version: version,
        outputs,
    };
    let json = serde_json::to_vec(&header).map_err(|e| Error::Invalid(e.to_string()))?;
    if request.tail.is_empty() {
        return Ok(EncodedRequest {
            body: json.into(),
            header_len: None,
        });
    }
    let header_len = json.len();
    let mut body = BytesMut::with_capacity(header_len + request.tail.len());
    body.put_slice(&json);
    body.put_slice(&request.tail);
    Ok(EncodedRequest {
        body: body.freeze(),
        header_len: Some(header_len),
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::datatype::DataType;

    fn inputs() -> Vec<InputTensor> {
        vec![
            InputTensor::from_json("INPUT0", DataType::Fp32, vec![1, 2], &json!([1.0, 2.0])).unwrap(),
            InputTensor::from_json("INPUT1", DataType::Bytes, vec![1], &json!(["ab"])).unwrap(),
        ]
    }

    #[test]
    fn binary_request_layout() {
        let enc = encode_request(&inputs(), &["OUTPUT0".to_string()], true).unwrap();
        let n = enc.header_len.unwrap();
        let header: Value = serde_json::from_slice(&enc.body[..n]).unwrap();
        assert_eq!(header["inputs"][0]["parameters"]["binary_data_size"], 8);
        assert_eq!(header["inputs"][1]["parameters"]["binary_data_size"], 6);
        assert_eq!(header["inputs"][0]["shape"], json!([1, 2]));
        assert!(header["inputs"][0].get("data").is_none());
        assert_eq!(header["outputs"][0]["parameters"]["binary_data"], true);
        assert_eq!(enc.body.len(), n + 14);
        assert_eq!(&enc.body[n + 8..], &[2, 0, 0, 0, b'a', b'b']);
    }

    #[test]
    fn binary_request_without_outputs_asks_for_all_binary() {
        let enc = encode_request(&inputs(), &[], true).unwrap();
        let header: Value = serde_json::from_slice(&enc.body[..enc.header_len.unwrap()]).unwrap();
        assert_eq!(header["parameters"]["binary_data_output"], true);
        assert!(header.get("outputs").is_none());
    }

    #[test]
    fn json_request_carries_data() {
        let enc = encode_request(&inputs(), &["OUTPUT0".to_string()], false).unwrap();
        assert_eq!(enc.header_len, None);
        let body: Value = serde_json::from_slice(&enc.body).unwrap();
        assert_eq!(body["inputs"][0]["data"], json!([1.0, 2.0]));
        assert_eq!(body["inputs"][1]["data"], json!(["ab"]));
        assert_eq!(body["outputs"][0]["parameters"]["binary_data"], false);
    }

    #[test]
    fn echo_round_trip_binary_and_json() {
        for binary in [true, false] {
            let req = encode_request(&inputs(), &[], binary).unwrap();
            let decoded = decode_request(&req.body, req.header_len).unwrap();
            assert_eq!(decoded.inputs.len(), 2);
            let resp = encode_echo_response("m", "1", decoded, |i| format!("OUTPUT{i}")).unwrap();
            let expected = ["OUTPUT0".to_string(), "OUTPUT1".to_string()];
            check_response(&resp.body, resp.header_len, &expected).unwrap();
            if binary {
                let n = resp.header_len.unwrap();
                assert_eq!(resp.body.slice(n..), req.body.slice(req.header_len.unwrap()..));
            }
        }
    }

    #[test]
    fn response_check_catches_problems() {
        let body = Bytes::from_static(
            br#"{"outputs":[{"name":"A","datatype":"FP32","shape":[1],"parameters":{"binary_data_size":4}}]}"#,
        );
        let n = body.len();
        let mut full = BytesMut::from(&body[..]);
        full.put_slice(&[0, 0, 0, 0]);
        let full = full.freeze();
        check_response(&full, Some(n), &["A".to_string()]).unwrap();
        assert!(check_response(&full, Some(n), &["B".to_string()]).is_err());
        assert!(check_response(&full.slice(..n + 2), Some(n), &[]).is_err());
        assert!(check_response(&full, Some(n + 100), &[]).is_err());
        assert!(check_response(&Bytes::from_static(b"{\"outputs\":[]}"), None, &[]).is_err());
        assert!(check_response(&Bytes::from_static(b"not json"), None, &[]).is_err());
        // JSON data is skipped, not required to be anything in particular.
        let json = Bytes::from_static(br#"{"outputs":[{"name":"A","datatype":"FP32","shape":[2],"data":[1,2]}]}"#);
        check_response(&json, None, &["A".to_string()]).unwrap();
    }

    #[test]
    fn decode_rejects_size_mismatch() {
        let req = encode_request(&inputs(), &[], true).unwrap();
        let short = req.body.slice(..req.body.len() - 1);
        assert!(decode_request(&short, req.header_len).is_err());
        assert_eq!(parse_header_len(Some(b"12")).unwrap(), Some(12));
        assert_eq!(parse_header_len(None).unwrap(), None);
        assert!(parse_header_len(Some(b"x")).is_err());
    }
}
