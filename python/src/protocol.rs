//! The messages between the server and a stub, as docs/python-backend.md
//! ("The stub protocol") defines them: length-prefixed JSON frames over
//! the stub's socket ([`crate::channel`]); tensor data stays in shared
//! memory and frames carry only where it is.

use nereid_core::error::{Error, ErrorKind};
use nereid_core::parameter::{Parameter, Parameters};
use serde::{Deserialize, Serialize};

/// The largest frame either side accepts: a frame carries descriptors and
/// text, never tensor data.
pub const MAX_FRAME_BYTES: usize = 64 << 20;

/// Where a tensor's data is in a pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Descriptor {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    /// The segment, or -1 for a tensor of no bytes.
    pub seg: i64,
    /// The data's offset in the segment (its block's header is 16 bytes before).
    pub off: u64,
    pub len: u64,
}

/// A response: its outputs, or the error that ends its request.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireResponse {
    #[serde(default)]
    pub outputs: Vec<Descriptor>,
    #[serde(default)]
    pub error: Option<WireError>,
    #[serde(default)]
    pub parameters: Option<serde_json::Map<String, serde_json::Value>>,
}

/// `pb_utils.TritonError`: a message and one of its codes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireError {
    pub message: String,
    #[serde(default = "internal_code")]
    pub code: String,
}

fn internal_code() -> String {
    "INTERNAL".to_string()
}

impl WireError {
    pub fn from_error(error: &Error) -> Self {
        let code = match error.kind() {
            ErrorKind::InvalidArgument => "INVALID_ARG",
            ErrorKind::NotFound => "NOT_FOUND",
            ErrorKind::Unavailable | ErrorKind::NotServing | ErrorKind::ResourceExhausted => "UNAVAILABLE",
            ErrorKind::Unsupported => "UNSUPPORTED",
            ErrorKind::AlreadyExists => "ALREADY_EXISTS",
            ErrorKind::Internal | ErrorKind::PermissionDenied => "INTERNAL",
        };
        WireError {
            message: error.message().to_string(),
            code: code.to_string(),
        }
    }

    /// The server's error for a model's: its code's kind, its message as is.
    pub fn to_error(&self) -> Error {
        let kind = match self.code.as_str() {
            "INVALID_ARG" => ErrorKind::InvalidArgument,
            "NOT_FOUND" => ErrorKind::NotFound,
            "UNAVAILABLE" | "CANCELLED" => ErrorKind::Unavailable,
            "UNSUPPORTED" => ErrorKind::Unsupported,
            "ALREADY_EXISTS" => ErrorKind::AlreadyExists,
            _ => ErrorKind::Internal,
        };
        Error::new(kind, self.message.clone())
    }
}

/// The shared-memory settings a stub allocates its own pool with.
#[derive(Debug, Clone, Serialize)]
pub struct ShmSettings {
    pub default_byte_size: u64,
    pub growth_byte_size: u64,
    pub limit_byte_size: u64,
}

/// What `initialize(args)` gets: every value a string, as in Triton.
#[derive(Debug, Clone, Serialize)]
pub struct InitArgs {
    pub model_config: String,
    pub model_instance_kind: String,
    pub model_instance_name: String,
    pub model_instance_device_id: String,
    pub model_repository: String,
    pub model_version: String,
    pub model_name: String,
}

/// One request of an `execute`.
#[derive(Debug, Clone, Serialize)]
pub struct ExecRequest {
    pub id: String,
    pub correlation_id: serde_json::Value,
    pub flags: u32,
    pub inputs: Vec<Descriptor>,
    pub requested_outputs: Vec<String>,
    pub parameters: serde_json::Map<String, serde_json::Value>,
    pub timeout_us: u64,
}

/// Server to stub.
#[derive(Debug, Serialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ToStub {
    /// A new segment of the server's pool: its descriptor comes with
    /// this frame.
    Segment {
        seg: usize,
    },
    Init {
        model_file: String,
        args: InitArgs,
        shm: ShmSettings,
    },
    AutoComplete {
        model_file: String,
        config: serde_json::Value,
    },
    /// `first` is the key of the first request; the others follow it.
    /// Keys are unique for the stub's life: a decoupled model's requests
    /// outlive their execute, and another model's next execute may wait in
    /// the stub's socket while the current one runs.
    Execute {
        requests: Vec<ExecRequest>,
        first: u64,
    },
    /// The request with this key has lost its client.
    Cancelled {
        request: u64,
    },
    BlsResponse {
        call: u64,
        response: Option<WireResponse>,
        #[serde(rename = "final")]
        last: bool,
    },
    Finalize,
}

/// A stub's `bls` call: `pb_utils.InferenceRequest(...).exec()`.
#[derive(Debug, Clone, Deserialize)]
pub struct BlsCall {
    pub call: u64,
    pub model: String,
    #[serde(default = "latest")]
    pub version: i64,
    #[serde(default)]
    pub inputs: Vec<Descriptor>,
    #[serde(default)]
    pub requested_outputs: Vec<String>,
    #[serde(default)]
    pub request_id: String,
    #[serde(default)]
    pub correlation_id: serde_json::Value,
    #[serde(default)]
    pub flags: u32,
    #[serde(default)]
    pub timeout_us: u64,
    #[serde(default)]
    pub parameters: Option<serde_json::Map<String, serde_json::Value>>,
    #[serde(default)]
    pub decoupled: bool,
}

fn latest() -> i64 {
    -1
}

/// Stub to server.
#[derive(Debug, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum FromStub {
    /// A new segment of the stub's pool: its descriptor comes with this
    /// frame.
    Segment {
        seg: usize,
    },
    Ready,
    Failed {
        message: String,
    },
    Config {
        config: serde_json::Value,
    },
    Executed {
        #[serde(default)]
        responses: Option<Vec<WireResponse>>,
        #[serde(default)]
        error: Option<WireError>,
    },
    /// One response of the request with this key.
    Response {
        request: u64,
        #[serde(default)]
        response: Option<WireResponse>,
        #[serde(default)]
        flags: u32,
    },
    Bls(BlsCall),
    Log {
        level: String,
        message: String,
        #[serde(default)]
        file: Option<String>,
        #[serde(default)]
        line: Option<u64>,
    },
    MetricFamily {
        family: u64,
        name: String,
        #[serde(default)]
        description: String,
        kind: String,
    },
    Metric {
        family: u64,
        metric: u64,
        #[serde(default)]
        labels: serde_json::Map<String, serde_json::Value>,
        #[serde(default)]
        buckets: Option<Vec<f64>>,
    },
    MetricUpdate {
        metric: u64,
        action: String,
        value: f64,
    },
    Finalized,
}

/// The final flag of a response sender.
pub const FINAL: u32 = 1;
/// A request's sequence flags.
pub const SEQUENCE_START: u32 = 1;
pub const SEQUENCE_END: u32 = 2;

/// Request or response parameters as JSON, as the stub reads them.
pub fn parameters_to_json(parameters: &Parameters) -> serde_json::Map<String, serde_json::Value> {
    parameters
        .iter()
        .map(|(k, v)| (k.clone(), serde_json::to_value(v).unwrap_or(serde_json::Value::Null)))
        .collect()
}

/// Parameters a stub sent: strings, integers, booleans (and doubles).
pub fn parameters_from_json(json: &serde_json::Map<String, serde_json::Value>) -> Result<Parameters, Error> {
    json.iter()
        .map(|(k, v)| {
            let value = match v {
                serde_json::Value::Bool(b) => Parameter::Bool(*b),
                serde_json::Value::String(s) => Parameter::String(s.clone()),
                serde_json::Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
                    (Some(i), _, _) => Parameter::Int(i),
                    (None, Some(u), _) => Parameter::Uint(u),
                    (None, None, Some(f)) => Parameter::Double(f),
                    _ => return Err(Error::invalid(format!("parameter '{k}' is not a number JSON can hold"))),
                },
                other => {
                    return Err(Error::invalid(format!(
                        "parameter '{k}' must be a string, a number or a boolean, got {other}"
                    )));
                }
            };
            Ok((k.clone(), value))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_keep_their_kind_both_ways() {
        let wire = WireError::from_error(&Error::invalid("bad"));
        assert_eq!(wire.code, "INVALID_ARG");
        assert_eq!(wire.to_error().kind(), ErrorKind::InvalidArgument);
        let unknown = WireError {
            message: "m".into(),
            code: "WHATEVER".into(),
        };
        assert_eq!(unknown.to_error().kind(), ErrorKind::Internal);
    }
}
