//! Backends: what runs a model, behind one trait.
//!
//! A backend reads a model's files (to complete its config) and creates
//! instances. An instance is owned by exactly one worker thread, so its
//! `execute` takes `&mut self` and may block: it never runs on the async
//! runtime.

pub mod builtin;
pub mod onnx;

use std::path::Path;

use nereid_proto::inference::ModelConfig;

use crate::error::Result;
use crate::model_config::BackendKind;
use crate::model_config::autocomplete::ModelSignature;
use crate::tensor::Tensor;

/// Where an instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Device {
    Cpu,
    /// A CUDA device by ordinal.
    Gpu(i32),
}

/// Everything a backend needs to create one instance.
#[derive(Debug, Clone, Copy)]
pub struct InstanceSpec<'a> {
    /// The completed, validated config.
    pub config: &'a ModelConfig,
    /// The version folder (holds the model file for file-based backends).
    pub version_dir: &'a Path,
    pub device: Device,
    /// Threads ONNX Runtime may use inside one operator.
    pub intra_op_threads: usize,
}

/// A loaded copy of a model that can run requests, one at a time.
pub trait ModelInstance: Send {
    /// Runs one (possibly batched) request. Inputs are validated and in the
    /// shapes the model expects; returns every output the model produces.
    fn execute(&mut self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>>;
}

/// A kind of model implementation.
pub trait Backend: Send + Sync {
    /// Reads the model file's inputs and outputs, for auto-complete and for
    /// checking the config against the file. `None` when there is no file.
    fn signature(&self, config: &ModelConfig, version_dir: &Path)
    -> Result<Option<ModelSignature>>;

    /// Creates one instance. Called on the instance's own worker thread.
    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>>;
}

/// The backend implementing a kind.
pub fn for_kind(kind: BackendKind) -> &'static dyn Backend {
    match kind {
        BackendKind::OnnxRuntime => &onnx::OnnxRuntimeBackend,
        BackendKind::Identity => &builtin::IdentityBackend,
        BackendKind::AddSub => &builtin::AddSubBackend,
    }
}

/// The model file of a version: `default_model_filename` or the backend's default.
pub fn model_file(config: &ModelConfig, version_dir: &Path, default: &str) -> std::path::PathBuf {
    let name = if config.default_model_filename.is_empty() {
        default
    } else {
        config.default_model_filename.as_str()
    };
    version_dir.join(name)
}
