//! The protocol-free inference response the core returns.

use std::collections::BTreeMap;

use crate::parameter::Parameters;
use crate::shared_memory;
use crate::tensor::Tensor;

/// One response as a model produced it, before it is shaped for the
/// client: every output in the model's names and shapes, and the
/// parameters the model set on it (a Python model's
/// `InferenceResponse(parameters=...)`, a remote model's response
/// parameters), which reach the client as the response's own.
#[derive(Debug, Default, Clone)]
pub struct Produced {
    pub outputs: Vec<Tensor>,
    pub parameters: Parameters,
}

impl From<Vec<Tensor>> for Produced {
    fn from(outputs: Vec<Tensor>) -> Self {
        Produced {
            outputs,
            parameters: Parameters::default(),
        }
    }
}

#[derive(Debug, Default)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: i64,
    pub id: String,
    /// In the order the client asked for them (model order when it asked for all).
    pub outputs: Vec<Tensor>,
    pub parameters: Parameters,
    /// Requests of this model waiting in its queue when this one was
    /// answered (`None` when metrics are off), for the
    /// [`nereid_proto::QUEUE_DEPTH_HEADER`] a router balances on.
    pub queue_depth: Option<u32>,
    /// Parameters of single outputs (by name): those written into shared
    /// memory say where, and their tensor's data is empty.
    pub output_parameters: BTreeMap<String, Parameters>,
}

impl InferResponse {
    /// Whether the output `name` was written into shared memory (the
    /// answer then carries its parameters, not its data).
    pub fn in_shared_memory(&self, name: &str) -> bool {
        self.output_parameters
            .get(name)
            .is_some_and(|p| p.contains_key(shared_memory::REGION))
    }
}
