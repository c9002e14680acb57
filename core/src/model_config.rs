//! Triton's `ModelConfig`: reading it, completing it, checking it.
//!
//! The config type is the protobuf message generated from
//! `proto/inference/model_config.proto`, so what a user writes in
//! `config.pbtxt`, what `/config` returns and what gRPC `ModelConfig` sends
//! are one and the same value.

pub mod autocomplete;
pub mod file_names;
pub mod instance_group;
pub mod json;
pub mod sequence;
pub mod text;
pub mod validate;

use nereid_proto::inference::{ModelConfig, ModelInput, ModelOutput};
use prost_reflect::MessageDescriptor;

use crate::datatype::DataType;

/// Triton's default `max_batch_size` when auto-complete finds a model that can batch.
pub const DEFAULT_MAX_BATCH_SIZE: i32 = 4;

fn descriptor() -> MessageDescriptor {
    nereid_proto::descriptor_pool()
        .get_message_by_name("inference.ModelConfig")
        .expect("inference.ModelConfig is in the descriptor set built from proto/")
}

/// The datatype of a config input, if it is a valid one.
pub fn input_datatype(input: &ModelInput) -> Option<DataType> {
    DataType::from_config(input.data_type)
}

pub fn output_datatype(output: &ModelOutput) -> Option<DataType> {
    DataType::from_config(output.data_type)
}

/// The shape the model itself sees for an input: `reshape` if present, else `dims`.
pub fn model_dims(input: &ModelInput) -> &[i64] {
    input
        .reshape
        .as_ref()
        .map_or(input.dims.as_slice(), |r| r.shape.as_slice())
}

/// A string parameter from `parameters { key: ... value: { string_value: ... } }`.
pub fn parameter<'a>(config: &'a ModelConfig, key: &str) -> Option<&'a str> {
    config
        .parameters
        .get(key)
        .map(|p| p.string_value.as_str())
        .filter(|v| !v.is_empty())
}
