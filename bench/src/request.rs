//! The infer request, encoded once per run and reused by every send.
//!
//! HTTP: the whole body (JSON header + raw bytes, or plain JSON) is one
//! `Bytes`, cloned by reference count per request, with its header values
//! pre-built. gRPC: the protobuf bytes of one `ModelInferRequest`, for
//! unary calls, and the message itself for streams (whose
//! `raw_input_contents` are `Bytes`, so a clone copies no tensor data).

use std::collections::HashMap;

use bytes::Bytes;
use http::HeaderValue;
use nereid_proto::inference::ModelInferRequest;
use nereid_proto::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};

use crate::binary_ext::{self, EncodedRequest};
use crate::error::{Error, Result};
use crate::tensor::InputTensor;

/// The wire protocol of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    Http,
    Grpc,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Http => "http",
            Protocol::Grpc => "grpc",
        }
    }
}

/// What the request is sent as.
#[derive(Debug, Clone)]
pub enum Payload {
    Http {
        path: String,
        body: EncodedRequest,
        /// `Inference-Header-Content-Length`, for binary bodies.
        header_len: Option<HeaderValue>,
    },
    Grpc {
        message: ModelInferRequest,
        /// `message`, encoded and framed as one gRPC message.
        framed: Bytes,
    },
}

/// A ready-to-send request and what its response must contain.
#[derive(Debug, Clone)]
pub struct PreparedRequest {
    pub payload: Payload,
    /// Outputs the response must name (empty: any output will do).
    pub expected_outputs: Vec<String>,
}

/// Which model and how to ask it.
#[derive(Debug, Clone)]
pub struct RequestTarget<'a> {
    pub protocol: Protocol,
    pub model: &'a str,
    pub version: &'a str,
    /// HTTP only: JSON `data` instead of the binary extension.
    pub http_json: bool,
}

impl PreparedRequest {
    pub fn new(target: &RequestTarget<'_>, inputs: &[InputTensor], outputs: Vec<String>) -> Result<Self> {
        let payload = match target.protocol {
            Protocol::Http => {
                let path = if target.version.is_empty() {
                    format!("/v2/models/{}/infer", target.model)
                } else {
                    format!("/v2/models/{}/versions/{}/infer", target.model, target.version)
                };
                let body = binary_ext::encode_request(inputs, &outputs, !target.http_json)?;
                let header_len = body.header_len.map(HeaderValue::from);
                Payload::Http { path, body, header_len }
            }
            Protocol::Grpc => {
                let message = grpc_request(target, inputs, &outputs);
                let framed = nereid_proto::frame::encode(&message).map_err(|e| Error::Invalid(e.to_string()))?;
                Payload::Grpc { message, framed }
            }
        };
        if let Payload::Http { path, .. } = &payload {
            path.parse::<http::Uri>()
                .map_err(|_| Error::Invalid(format!("model name gives an invalid path '{path}'")))?;
        }
        Ok(PreparedRequest {
            payload,
            expected_outputs: outputs,
        })
    }
}

fn grpc_request(target: &RequestTarget<'_>, inputs: &[InputTensor], outputs: &[String]) -> ModelInferRequest {
    ModelInferRequest {
        model_name: target.model.to_string(),
        model_version: target.version.to_string(),
        id: String::new(),
        parameters: HashMap::new(),
        inputs: inputs
            .iter()
            .map(|t| InferInputTensor {
                name: t.name.clone(),
                datatype: t.datatype.as_wire().to_string(),
                shape: t.shape.clone(),
                parameters: HashMap::new(),
                contents: None,
            })
            .collect(),
        outputs: outputs
            .iter()
            .map(|name| InferRequestedOutputTensor {
                name: name.clone(),
                parameters: HashMap::new(),
            })
            .collect(),
        raw_input_contents: inputs.iter().map(|t| t.raw.clone()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use nereid_proto::frame::{PREFIX_LEN, Prefix};
    use serde_json::json;

    use super::*;
    use crate::datatype::DataType;

    fn input() -> Vec<InputTensor> {
        vec![InputTensor::from_json("INPUT0", DataType::Fp32, vec![1, 2], &json!([1.0, 2.0])).unwrap()]
    }

    fn target(protocol: Protocol, version: &str) -> RequestTarget<'_> {
        RequestTarget {
            protocol,
            model: "simple",
            version,
            http_json: false,
        }
    }

    #[test]
    fn http_paths_and_header() {
        let r = PreparedRequest::new(&target(Protocol::Http, ""), &input(), vec![]).unwrap();
        let Payload::Http { path, header_len, body } = r.payload else {
            panic!("not http")
        };
        assert_eq!(path, "/v2/models/simple/infer");
        assert_eq!(
            header_len.unwrap().to_str().unwrap(),
            body.header_len.unwrap().to_string()
        );
        let r = PreparedRequest::new(&target(Protocol::Http, "3"), &input(), vec![]).unwrap();
        let Payload::Http { path, .. } = r.payload else {
            panic!("not http")
        };
        assert_eq!(path, "/v2/models/simple/versions/3/infer");
    }

    #[test]
    fn grpc_shares_tensor_bytes() {
        let inputs = input();
        let r = PreparedRequest::new(&target(Protocol::Grpc, "1"), &inputs, vec!["OUTPUT0".into()]).unwrap();
        let Payload::Grpc { message: m, framed } = r.payload else {
            panic!("not grpc")
        };
        let prefix = Prefix::read(&framed).unwrap();
        assert_eq!(prefix.flag, 0, "not compressed");
        assert_eq!(prefix.length, framed.len() - PREFIX_LEN);
        let message = framed.slice(PREFIX_LEN..);
        assert_eq!(<ModelInferRequest as prost::Message>::decode(message).unwrap(), m);
        assert_eq!(m.model_version, "1");
        assert_eq!(m.inputs[0].shape, vec![1, 2]);
        assert_eq!(m.outputs[0].name, "OUTPUT0");
        assert_eq!(m.raw_input_contents[0].as_ptr(), inputs[0].raw.as_ptr());
    }

    #[test]
    fn bad_model_names_are_rejected() {
        let t = RequestTarget {
            model: "a b",
            ..target(Protocol::Http, "")
        };
        assert!(PreparedRequest::new(&t, &input(), vec![]).is_err());
    }
}
