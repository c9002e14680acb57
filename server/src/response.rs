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
}
