//! The transport-free server API every front end calls.
//!
//! HTTP and gRPC reach models only through [`InferenceServer`]; whatever one
//! front end can do, the other can too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use nereid_proto::inference::ModelConfig;

use crate::datatype::DataType;
use crate::error::{Error, ErrorKind, Result};
use crate::logging::{LogControl, LogSettings};
use crate::model::Model;
use crate::model::stream::ResponseStream;
use crate::model_config::{input_datatype, output_datatype};
use crate::model_repository_manager::{IndexEntry, ModelRepositoryManager};
use crate::parameter::Parameter;
use crate::request::InferRequest;
use crate::response::InferResponse;
use crate::shared_memory::cuda::CudaSharedMemory;
use crate::shared_memory::{SharedMemory, TensorRegion};
use crate::statistics::StatsSnapshot;
use crate::trace::Traces;
use crate::trace::settings::{Change as TraceChange, Effective as TraceEffective};

/// The protocol extensions this server implements, as `/v2` lists them.
pub const EXTENSIONS: &[&str] = &[
    "classification",
    "sequence",
    "model_repository",
    "schedule_policy",
    "model_configuration",
    "binary_tensor_data",
    "system_shared_memory",
    "parameters",
    "statistics",
    "trace",
    "logging",
];

/// `/v2` server metadata.
#[derive(Debug, Clone)]
pub struct ServerMetadata {
    pub name: String,
    pub version: String,
    pub extensions: Vec<String>,
}

/// A tensor as model metadata describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorMetadata {
    pub name: String,
    pub datatype: DataType,
    /// With a leading `-1` when the model batches.
    pub shape: Vec<i64>,
}

/// `/v2/models/{m}` model metadata.
#[derive(Debug, Clone)]
pub struct ModelMetadata {
    pub name: String,
    pub versions: Vec<String>,
    pub platform: String,
    pub inputs: Vec<TensorMetadata>,
    pub outputs: Vec<TensorMetadata>,
}

/// One version's statistics, as the statistics extension reports it.
#[derive(Debug, Clone)]
pub struct VersionStatistics {
    pub name: String,
    pub version: i64,
    pub stats: StatsSnapshot,
}

pub struct InferenceServer {
    name: String,
    manager: ModelRepositoryManager,
    ready: AtomicBool,
    log: Arc<LogControl>,
    traces: Arc<Traces>,
    shared_memory: SharedMemory,
    cuda_shared_memory: CudaSharedMemory,
}

impl InferenceServer {
    pub fn new(name: String, manager: ModelRepositoryManager, log: Arc<LogControl>, traces: Arc<Traces>) -> Arc<Self> {
        let cuda_shared_memory = CudaSharedMemory::new(Arc::clone(manager.gpus()));
        Arc::new(InferenceServer {
            name,
            manager,
            ready: AtomicBool::new(false),
            log,
            traces,
            shared_memory: SharedMemory::default(),
            cuda_shared_memory,
        })
    }

    /// The trace settings in force for `model` (global when `None`).
    pub fn trace_settings(&self, model: Option<&str>) -> Result<TraceEffective> {
        if let Some(name) = model {
            self.model(name, "")?;
        }
        Ok(self.traces.settings(model))
    }

    /// Changes trace settings by Triton's keys; all or nothing.
    pub fn update_trace_settings(
        &self,
        model: Option<&str>,
        changes: &[(String, TraceChange)],
    ) -> Result<TraceEffective> {
        if let Some(name) = model {
            self.model(name, "")?;
        }
        self.traces.update(model, changes)
    }

    /// Sends buffered traces (at shutdown).
    pub fn flush_traces(&self) {
        self.traces.flush();
    }

    /// The logging extension's settings.
    pub fn log_settings(&self) -> LogSettings {
        self.log.settings()
    }

    /// Changes log settings by Triton's keys; all or nothing.
    pub fn update_log_settings(&self, changes: &[(String, Parameter)]) -> Result<LogSettings> {
        self.log.update(changes)
    }

    pub fn manager(&self) -> &ModelRepositoryManager {
        &self.manager
    }

    pub fn is_live(&self) -> bool {
        true
    }

    /// Ready once start-up loading is done, and until shutdown begins.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn metadata(&self) -> ServerMetadata {
        ServerMetadata {
            name: self.name.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            extensions: EXTENSIONS.iter().map(|e| e.to_string()).collect(),
        }
    }

    /// A ready model version; `version` is the URL's string ("" for the latest).
    pub fn model(&self, name: &str, version: &str) -> Result<Arc<Model>> {
        self.manager.get(name, parse_version(version)?)
    }

    /// Whether requests of this model go through [`Self::infer_stream`]
    /// (false for a model that is not there: [`Self::infer`] says so).
    pub fn is_decoupled(&self, name: &str, version: Option<i64>) -> bool {
        self.manager.get(name, version).is_ok_and(|m| m.is_decoupled())
    }

    pub fn model_ready(&self, name: &str, version: &str) -> Result<bool> {
        self.model(name, version)?.check_ready().map(|()| true)
    }

    pub fn model_metadata(&self, name: &str, version: &str) -> Result<ModelMetadata> {
        let model = self.model(name, version)?;
        let config = model.config();
        let versions = if version.is_empty() {
            self.manager.ready_versions(name).iter().map(i64::to_string).collect()
        } else {
            vec![model.version().to_string()]
        };
        let batch = config.max_batch_size > 0;
        let shape = |dims: &[i64]| {
            let mut shape = Vec::with_capacity(dims.len() + 1);
            if batch {
                shape.push(-1);
            }
            shape.extend_from_slice(dims);
            shape
        };
        Ok(ModelMetadata {
            name: name.to_string(),
            versions,
            platform: if config.platform.is_empty() {
                config.backend.clone()
            } else {
                config.platform.clone()
            },
            inputs: config
                .input
                .iter()
                .filter_map(|i| {
                    Some(TensorMetadata {
                        name: i.name.clone(),
                        datatype: input_datatype(i)?,
                        shape: shape(&i.dims),
                    })
                })
                .collect(),
            outputs: config
                .output
                .iter()
                .filter_map(|o| {
                    Some(TensorMetadata {
                        name: o.name.clone(),
                        datatype: output_datatype(o)?,
                        shape: shape(&o.dims),
                    })
                })
                .collect(),
        })
    }

    pub fn model_config(&self, name: &str, version: &str) -> Result<Arc<ModelConfig>> {
        Ok(Arc::clone(self.model(name, version)?.config()))
    }

    pub async fn infer(&self, request: InferRequest) -> Result<InferResponse> {
        if !self.is_ready() {
            return Err(Error::new(ErrorKind::NotServing, "Server not ready"));
        }
        let model = self.manager.get(&request.model_name, request.model_version)?;
        self.infer_on(&model, request).await
    }

    /// [`Self::infer`] on a version the front end has already looked up
    /// (the HTTP front end does, to refuse an unknown model before reading
    /// the body), so a request finds its model once.
    pub async fn infer_on(&self, model: &Model, mut request: InferRequest) -> Result<InferResponse> {
        if !self.is_ready() {
            return Err(Error::new(ErrorKind::NotServing, "Server not ready"));
        }
        if model.is_decoupled() {
            return Err(Error::unsupported(format!(
                "{} doesn't support models with decoupled transaction policy",
                request.protocol.unary_endpoint()
            )));
        }
        self.read_shared_memory_inputs(&mut request)?;
        let output_regions: Vec<(String, TensorRegion)> = request
            .outputs
            .iter()
            .filter_map(|o| {
                let region = o.shared_memory.clone()?;
                Some((o.name.clone(), region))
            })
            .collect();
        request.trace = self
            .traces
            .start_request(model.name(), model.version(), &request.id, &request.trace_parent);
        let trace = request.trace.clone();
        let result = model
            .infer(request)
            .await
            .and_then(|response| self.write_shared_memory_outputs(response, &output_regions));
        if let Some(trace) = trace {
            trace.finish(result.as_ref().err());
        }
        result
    }

    /// Queues a request of a decoupled model; its responses come on the
    /// returned stream (unary [`Self::infer`] refuses such models).
    pub fn infer_stream(&self, mut request: InferRequest) -> Result<ResponseStream> {
        if !self.is_ready() {
            return Err(Error::new(ErrorKind::NotServing, "Server not ready"));
        }
        let model = self.manager.get(&request.model_name, request.model_version)?;
        if let Some(output) = request.outputs.iter().find(|o| o.shared_memory.is_some()) {
            // Every response would land on the same bytes, each overwriting
            // the one before while the client may still be reading it.
            return Err(Error::invalid(format!(
                "output '{}' asks for shared memory, which responses of a decoupled model cannot use: \
                 each response would overwrite the last",
                output.name
            )));
        }
        self.read_shared_memory_inputs(&mut request)?;
        request.trace = self
            .traces
            .start_request(model.name(), model.version(), &request.id, &request.trace_parent);
        model.infer_stream(request)
    }

    /// Fills the inputs that are in shared memory, each within the
    /// request's share of the memory budget.
    fn read_shared_memory_inputs(&self, request: &mut InferRequest) -> Result<()> {
        for (name, place) in std::mem::take(&mut request.shared_memory_inputs) {
            let tensor = request
                .inputs
                .iter_mut()
                .find(|t| t.name == name)
                .ok_or_else(|| Error::internal(format!("no input '{name}' for its shared memory region")))?;
            request.reservation.grow(place.byte_size)?;
            tensor.data = if self.cuda_shared_memory.contains(&place.region) {
                self.cuda_shared_memory.read(&place)?
            } else {
                self.shared_memory.read(&place)?
            };
        }
        Ok(())
    }

    /// Writes the outputs asked for in shared memory there; the answer
    /// keeps their metadata and says where they are.
    fn write_shared_memory_outputs(
        &self,
        mut response: InferResponse,
        regions: &[(String, TensorRegion)],
    ) -> Result<InferResponse> {
        for (name, place) in regions {
            let Some(tensor) = response.outputs.iter_mut().find(|t| &t.name == name) else {
                continue;
            };
            if self.cuda_shared_memory.contains(&place.region) {
                self.cuda_shared_memory.write(place, name, &tensor.data)?;
            } else {
                self.shared_memory.write(place, name, &tensor.data)?;
            }
            let written = std::mem::take(&mut tensor.data).len();
            response
                .output_parameters
                .insert(name.clone(), place.parameters(written));
        }
        Ok(response)
    }

    /// The system shared memory regions.
    pub fn shared_memory(&self) -> &SharedMemory {
        &self.shared_memory
    }

    pub fn cuda_shared_memory(&self) -> &CudaSharedMemory {
        &self.cuda_shared_memory
    }

    /// Statistics of the ready versions of one model (`name` given) or of
    /// every model; `version` "" means every ready version.
    pub fn statistics(&self, name: Option<&str>, version: &str) -> Result<Vec<VersionStatistics>> {
        let models: Vec<Arc<Model>> = match name {
            Some(name) if !version.is_empty() => vec![self.model(name, version)?],
            Some(name) => {
                let versions = self.manager.ready_versions(name);
                if versions.is_empty() {
                    // Reports the right "unknown model" error.
                    self.model(name, "")?;
                }
                versions
                    .into_iter()
                    .filter_map(|v| self.manager.get(name, Some(v)).ok())
                    .collect()
            }
            None => self.manager.ready_models(),
        };
        Ok(models
            .into_iter()
            .map(|m| VersionStatistics {
                name: m.name().to_string(),
                version: m.version(),
                stats: m.statistics().snapshot(),
            })
            .collect())
    }

    pub async fn repository_index(&self, ready_only: bool) -> Result<Vec<IndexEntry>> {
        self.manager.index(ready_only).await
    }

    /// A load's JSON config override (the repository API's `config`
    /// parameter), refused in Triton's words when it does not parse.
    pub fn config_override(&self, name: &str, json: &str) -> Result<ModelConfig> {
        let config = crate::model_config::json::from_json(json).map_err(|e| {
            Error::invalid(format!(
                "failed to load '{name}', Invalid config override: {}",
                e.message()
            ))
        })?;
        // Where a remote model connects is the repository's to say: from a
        // client, an endpoint would point the server at any host and port,
        // and its errors would tell open ports from closed ones.
        if config.parameters.contains_key("endpoint") {
            return Err(Error::invalid(format!(
                "failed to load '{name}', Invalid config override: the parameter 'endpoint' (a remote model's address) can be set only in the model repository"
            )));
        }
        Ok(config)
    }

    pub async fn load_model(&self, name: &str, config_override: Option<ModelConfig>) -> Result<()> {
        self.manager.load(name, config_override).await
    }

    pub async fn unload_model(&self, name: &str) -> Result<()> {
        self.manager.unload(name).await
    }
}

/// Parses a version from a URL or a gRPC field: empty means "latest".
pub fn parse_version(version: &str) -> Result<Option<i64>> {
    if version.is_empty() {
        return Ok(None);
    }
    match version.parse::<i64>() {
        Ok(v) if v > 0 => Ok(Some(v)),
        Ok(_) => Err(Error::invalid(format!(
            "failed to get model version from specified version string '{version}' (details: not positive), version should be an integral value > 0"
        ))),
        Err(e) => Err(Error::invalid(format!(
            "failed to get model version from specified version string '{version}' (details: {e}), version should be an integral value > 0"
        ))),
    }
}
