//! Triton's `ModelConfig`: reading it, completing it, checking it.
//!
//! The config type is the protobuf message generated from
//! `proto/inference/model_config.proto`, so what a user writes in
//! `config.pbtxt`, what `/config` returns and what gRPC `ModelConfig` sends
//! are one and the same value.

pub mod autocomplete;
pub mod file_names;
pub mod json;
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

/// Which implementation runs a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// ONNX Runtime through the `ort` crate.
    OnnxRuntime,
    /// Copies each input to the output at the same position (Triton's identity backend).
    Identity,
    /// `OUTPUT0 = INPUT0 + INPUT1`, `OUTPUT1 = INPUT0 - INPUT1`.
    AddSub,
    /// Triton's `platform: "ensemble"`: a DAG of other models.
    Ensemble,
    /// `backend: "remote"`: another server's model, over KServe v2 gRPC.
    Remote,
}

impl BackendKind {
    /// Resolves `platform` / `backend` as Triton does; `None` when neither names
    /// a backend we have.
    pub fn from_config(config: &ModelConfig) -> Option<BackendKind> {
        match (config.backend.as_str(), config.platform.as_str()) {
            ("onnxruntime", _) | ("", "onnxruntime_onnx") => Some(BackendKind::OnnxRuntime),
            ("identity", _) => Some(BackendKind::Identity),
            ("add_sub", _) => Some(BackendKind::AddSub),
            ("", "ensemble") => Some(BackendKind::Ensemble),
            ("remote", _) => Some(BackendKind::Remote),
            _ => None,
        }
    }

    /// The model file name used when the config names none.
    pub fn default_model_filename(self) -> Option<&'static str> {
        match self {
            BackendKind::OnnxRuntime => Some("model.onnx"),
            BackendKind::Identity | BackendKind::AddSub | BackendKind::Ensemble | BackendKind::Remote => None,
        }
    }

    /// Fills `backend` / `platform` the way Triton reports them.
    pub fn describe(self, config: &mut ModelConfig) {
        match self {
            BackendKind::OnnxRuntime => {
                config.backend = "onnxruntime".into();
                if config.platform.is_empty() {
                    config.platform = "onnxruntime_onnx".into();
                }
            }
            BackendKind::Identity => config.backend = "identity".into(),
            BackendKind::AddSub => config.backend = "add_sub".into(),
            // Triton reports an ensemble by its platform, with no backend.
            BackendKind::Ensemble => config.backend.clear(),
            BackendKind::Remote => config.backend = "remote".into(),
        }
    }
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
