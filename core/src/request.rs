//! The protocol-free inference request every front end produces.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::memory_budget::Reservation;
use crate::parameter::Parameters;
use crate::shared_memory::TensorRegion;
use crate::tensor::Tensor;
use crate::trace::RequestTrace;

/// An inference request after the wire format has been decoded.
///
/// Inputs carry their data as received (zero-copy slices of the HTTP body or
/// of the gRPC message); nothing here knows whether they came as JSON, binary
/// or protobuf.
#[derive(Debug, Default)]
pub struct InferRequest {
    pub model_name: String,
    /// `None` lets the version policy pick (the highest ready version).
    pub model_version: Option<i64>,
    pub id: String,
    pub inputs: Vec<Tensor>,
    /// Empty means "every output of the model".
    pub outputs: Vec<RequestedOutput>,
    pub parameters: Parameters,
    /// The request data's share of the server's memory budget: held until
    /// the inputs are dropped (answered, failed or cancelled).
    pub reservation: Reservation,
    /// The client's W3C trace context (`traceparent`, `tracestate`), as
    /// header name and value, from HTTP headers or gRPC metadata.
    pub trace_parent: Vec<(String, String)>,
    /// Set by the server when this request is sampled for tracing.
    pub trace: Option<Arc<RequestTrace>>,
    /// Inputs whose data is in a system shared memory region (by input
    /// name): the front end leaves their data empty and the server reads it.
    pub shared_memory_inputs: BTreeMap<String, TensorRegion>,
    pub protocol: Protocol,
}

/// The front end a request came through, for the few answers that name it
/// the way Triton's do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Protocol {
    #[default]
    Http,
    Grpc,
}

impl Protocol {
    /// What Triton calls the unary endpoint in its errors.
    pub fn unary_endpoint(self) -> &'static str {
        match self {
            Protocol::Http => "HTTP end point",
            Protocol::Grpc => "ModelInfer RPC",
        }
    }
}

/// The W3C trace context headers a front end passes on.
pub const TRACE_HEADERS: [&str; 2] = ["traceparent", "tracestate"];

/// The client's W3C trace context, from whatever carries it (HTTP headers,
/// gRPC metadata): the value of each of [`TRACE_HEADERS`], in its order. A
/// front end looks them up with keys it made once: looking a header up by
/// a `&str` parses the name every time. A header that is absent costs
/// nothing: its name is copied only beside a value.
pub fn trace_parent(values: [Option<&str>; 2]) -> Vec<(String, String)> {
    TRACE_HEADERS
        .iter()
        .zip(values)
        .filter_map(|(name, value)| value.map(|value| ((*name).to_owned(), value.to_owned())))
        .collect()
}

/// An output the client asked for.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestedOutput {
    pub name: String,
    /// Triton's classification extension: return the top `k` classes as
    /// BYTES `"value:index[:label]"` instead of the raw tensor.
    pub classification: Option<usize>,
    /// Where to write it instead of the answer: a system shared memory region.
    pub shared_memory: Option<TensorRegion>,
}

impl RequestedOutput {
    pub fn named(name: impl Into<String>) -> Self {
        RequestedOutput {
            name: name.into(),
            ..RequestedOutput::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_trace_context_keeps_only_the_headers_present_in_their_order() {
        assert!(trace_parent([None, None]).is_empty());
        assert_eq!(
            trace_parent([None, Some("k=v")]),
            vec![("tracestate".to_string(), "k=v".to_string())]
        );
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            trace_parent([Some(parent), Some("k=v")]),
            vec![
                ("traceparent".to_string(), parent.to_string()),
                ("tracestate".to_string(), "k=v".to_string())
            ]
        );
    }
}
