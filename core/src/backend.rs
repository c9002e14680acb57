//! Backends: what runs a model, behind one trait.
//!
//! A backend reads a model's files (to complete its config) and creates
//! instances (ensembles and remote models have none: their schedulers, or
//! the backend's [`Runner`], do the work). An instance is owned by exactly one worker thread, so its
//! `execute` takes `&mut self` and may block: it never runs on the async
//! runtime.

pub mod builtin;
pub mod registry;
pub mod settings;

pub use registry::{BackendKind, plug_in};

use std::path::Path;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use nereid_proto::inference::ModelConfig;

use crate::datatype::DataType;
use crate::error::Result;
use crate::model_config::autocomplete::ModelSignature;
use crate::model_repository_manager::Members;
use crate::parameter::Parameters;
use crate::response::Produced;
use crate::scheduler::Runner;
use crate::sequence_batcher::correlation::Flags;
use crate::statistics::ComputeTiming;
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
    /// The server's models, for instances that call others (a Python
    /// model's business-logic scripting).
    pub members: &'a Members,
}

/// One input of an execution: the batched shape and the requests' pieces
/// of data, in batch order. The backend copies the pieces straight into
/// its own buffer, so a batched input is copied exactly once; a single
/// piece may be used without any copy.
#[derive(Debug, Clone)]
pub struct BatchInput {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    pub parts: Vec<Bytes>,
}

impl BatchInput {
    /// An input made of one request's tensor.
    pub fn single(tensor: Tensor) -> Self {
        BatchInput {
            name: tensor.name,
            datatype: tensor.datatype,
            shape: tensor.shape,
            parts: vec![tensor.data],
        }
    }

    pub fn byte_len(&self) -> usize {
        self.parts.iter().map(Bytes::len).sum()
    }

    /// The data in one buffer: free for one piece, one copy for several.
    pub fn contiguous(&self) -> Bytes {
        match self.parts.as_slice() {
            [one] => one.clone(),
            parts => {
                let mut out = BytesMut::with_capacity(self.byte_len());
                parts.iter().for_each(|p| out.extend_from_slice(p));
                out.freeze()
            }
        }
    }

    /// Copies the pieces, in order, into `dst` (exactly `byte_len` bytes).
    pub fn copy_into(&self, dst: &mut [u8]) {
        let mut at = 0;
        for part in &self.parts {
            dst[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
    }
}

/// What one batched execution produced and how long its phases took.
#[derive(Debug)]
pub struct Execution {
    /// Every output the model produces, batched.
    pub outputs: Vec<Tensor>,
    pub timing: ComputeTiming,
}

/// The requests of one execution, in batch order: each one's inputs, its
/// rows along the batch dimension and what else a model may read about it.
#[derive(Debug, Default)]
pub struct Batch {
    pub requests: Vec<Vec<Tensor>>,
    pub sizes: Vec<usize>,
    /// Empty, or one per request (the instance pool fills it; backends
    /// that read only tensors ignore it).
    pub info: Vec<RequestInfo>,
}

/// What Triton's backend API lets a model read about a request beside its
/// inputs. Moved out of the queued request, never copied.
#[derive(Debug, Default)]
pub struct RequestInfo {
    pub id: String,
    pub parameters: Parameters,
    /// The outputs the request asks for (every output when the client
    /// named none); empty when the backend does not read them.
    pub requested: Vec<String>,
    /// Its sequence's id and flags, for a sequence model.
    pub sequence: Option<Flags>,
}

impl Batch {
    /// Rows in all.
    pub fn rows(&self) -> usize {
        self.sizes.iter().sum()
    }
}

/// A loaded copy of a model that runs one batch at a time.
///
/// One execute for every kind of model: the instance gets the batch's
/// requests and a sink, and sends each request its responses (one for an
/// ordinary model, any number for a decoupled one). Returning ends every
/// request (the final flag); an error fails those the sink has not ended.
/// Backends that compute a batch as one set of tensors implement
/// [`BatchedInstance`] instead, which does the batching for them.
pub trait ModelInstance: Send {
    fn execute(&mut self, batch: Batch, sink: &mut dyn ResponseSink) -> Result<ComputeTiming>;

    /// Another handle on this instance, for another pool thread that takes
    /// the next batch while this one's runs; the instance still runs its
    /// batches one at a time, in the order they came. Worth it where a
    /// batch's hand-over costs as much as its run: a Python stub waits
    /// idle for the server's round trip between two executes unless the
    /// next one is already in its socket. Asked again after each lane
    /// given, until `None` (the default: one thread) or four threads.
    fn lane(&mut self) -> Option<Box<dyn ModelInstance>> {
        None
    }
}

/// An instance that runs a batch as batched tensors: its inputs are
/// assembled once, and its outputs cut per request, each request's piece
/// its one response.
pub trait BatchedInstance: Send {
    /// Runs one batch. Inputs are validated and in the shapes the model
    /// expects.
    fn run(&mut self, inputs: Vec<BatchInput>) -> Result<Execution>;
}

impl<T: BatchedInstance> ModelInstance for T {
    fn execute(&mut self, batch: Batch, sink: &mut dyn ResponseSink) -> Result<ComputeTiming> {
        let Batch { requests, sizes, .. } = batch;
        let execution = self.run(crate::batch::assemble(requests, &sizes))?;
        let per_request = match sizes.len() {
            1 => vec![execution.outputs],
            _ => crate::batch::split(execution.outputs, &sizes)?,
        };
        for (request, outputs) in per_request.into_iter().enumerate() {
            sink.send(request, outputs.into());
        }
        Ok(execution.timing)
    }
}

/// Where an execution's responses go, request by request (by their
/// position in the batch).
pub trait ResponseSink {
    /// Sends one response of `request`. `false` when its client has gone
    /// away: the backend should stop working for it.
    fn send(&mut self, request: usize, response: Produced) -> bool;

    /// Ends `request` with `error` (its last response), leaving the batch's
    /// other requests alone. `false` when it had already ended.
    fn fail(&mut self, request: usize, error: crate::error::Error) -> bool;

    /// Whether `request`'s client has gone away.
    fn is_cancelled(&self, request: usize) -> bool;

    /// Takes a decoupled model's `request` out of its batch, so that its
    /// responses may go on after `execute` returns: Triton lets a
    /// decoupled model keep a request's response sender past execute and
    /// take its next batch meanwhile (its vLLM backend streams every
    /// request from a loop of its own). The batch then neither ends nor
    /// answers it; dropping the [`Responder`] ends it, as the final flag.
    /// `None` when the model is not decoupled or the request has ended.
    fn detach(&mut self, _request: usize) -> Option<crate::scheduler::responder::Responder> {
        None
    }
}

/// Runs one request of `rows` rows on the calling thread and returns its
/// one response (an instance that sends none fails it).
pub fn execute_one(
    instance: &mut dyn ModelInstance,
    inputs: Vec<Tensor>,
    rows: usize,
) -> Result<(Produced, ComputeTiming)> {
    let mut sink = OneResponse(None);
    let batch = Batch {
        requests: vec![inputs],
        sizes: vec![rows],
        info: Vec::new(),
    };
    let timing = instance.execute(batch, &mut sink)?;
    let outputs = sink
        .0
        .ok_or_else(|| crate::error::Error::internal("the model instance sent no response"))??;
    Ok((outputs, timing))
}

/// Keeps the one response of a batch of one.
struct OneResponse(Option<Result<Produced>>);

impl ResponseSink for OneResponse {
    fn send(&mut self, request: usize, response: Produced) -> bool {
        if request != 0 || self.0.is_some() {
            return false;
        }
        self.0 = Some(Ok(response));
        true
    }

    fn fail(&mut self, request: usize, error: crate::error::Error) -> bool {
        if request != 0 || self.0.is_some() {
            return false;
        }
        self.0 = Some(Err(error));
        true
    }

    fn is_cancelled(&self, _: usize) -> bool {
        false
    }
}

/// A kind of model implementation.
pub trait Backend: Send + Sync {
    /// Reads the model file's inputs and outputs, for auto-complete and for
    /// checking the config against the file. `None` when there is no file.
    fn signature(&self, config: &ModelConfig, version_dir: &Path) -> Result<Option<ModelSignature>>;

    /// Creates one instance. Called on the instance's own worker thread.
    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>>;

    /// Whether its instances can run decoupled models (stream responses).
    fn decoupled(&self) -> bool {
        false
    }

    /// Whether its instances can run on a GPU: KIND_AUTO places them there
    /// when one is visible, and KIND_GPU is refused for a backend that cannot.
    fn runs_on_gpu(&self) -> bool {
        false
    }

    /// Whether its instances read the outputs each request named
    /// ([`RequestInfo::requested`]); others are spared copying the names.
    fn reads_requested_outputs(&self) -> bool {
        false
    }

    /// Completes `config` from what only the backend can read (a remote
    /// model's own config, from the remote; a Python model's
    /// `auto_complete_config`), its files in `version_dir`. Blocking: it
    /// runs in the load.
    fn complete_config(&self, config: &mut ModelConfig, version_dir: &Path) -> Result<()> {
        let _ = (config, version_dir);
        Ok(())
    }

    /// For a model that runs elsewhere (another server): what takes every
    /// request in place of instances. `None`: the model has instances.
    fn runner(&self, config: &ModelConfig) -> Result<Option<Arc<dyn Runner>>> {
        let _ = config;
        Ok(None)
    }

    /// Whether executing `config`'s instances is so cheap, and never
    /// blocking, that a request may run on the thread that received it:
    /// handing it to an instance thread and back costs two cross-thread
    /// wake-ups, far more than work of this size ([`crate::instance_pool`]).
    fn runs_inline(&self, config: &ModelConfig) -> bool {
        let _ = config;
        false
    }
}

/// The backend implementing a kind.
pub fn for_kind(kind: BackendKind) -> &'static dyn Backend {
    kind.implementation()
}

/// Ensembles read no model file and have no instances: their scheduler
/// stands in for them ([`crate::scheduler::Scheduler`]).
pub(crate) struct NoInstances;

impl Backend for NoInstances {
    fn signature(&self, _: &ModelConfig, _: &Path) -> Result<Option<ModelSignature>> {
        Ok(None)
    }

    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
        Err(crate::error::Error::internal(format!(
            "model '{}' has no instances to create",
            spec.config.name
        )))
    }

    /// An ensemble streams whatever its members stream.
    fn decoupled(&self) -> bool {
        true
    }
}

/// The model file of a version: `default_model_filename` or the backend's
/// default, which must be a file inside the model's folder.
pub fn model_file(config: &ModelConfig, version_dir: &Path, default: &str) -> Result<std::path::PathBuf> {
    let name = if config.default_model_filename.is_empty() {
        default
    } else {
        config.default_model_filename.as_str()
    };
    let model_dir = version_dir.parent().unwrap_or(version_dir);
    crate::model_config::file_names::resolve(model_dir, version_dir, name, "model file")
}
