//! The protocol-free inference response the core returns.

use crate::parameter::Parameters;
use crate::tensor::Tensor;

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
}
