//! Nereid's Python backend: Triton's `model.py` models, unchanged.
//!
//! Each instance runs its model in its own Python process, the stub
//! (`stub/`, compiled in and written out on first use), so nothing a model
//! does can take the server down. The server and a stub talk over a socket
//! pair in small JSON frames; tensors cross through shared memory
//! (docs/python-backend.md defines the protocol).
//!
//! ```text
//! lib         the backend: settings, instances, auto-complete, the interpreter
//! instance    one instance: its stub, the loop that runs a batch, restarts
//! stub        the process: spawn with its socket as fd 3, read with deadlines, kill
//! protocol    the messages and their frames
//! shm         the two shared-memory pools (rings of blocks; zero-copy outputs)
//! bls         a model's calls to other models, on the async runtime
//! metrics     pb_utils.MetricFamily on the server's metrics port
//! log         pb_utils.Logger in the server's log
//! stub_files  the stub's sources, written to a private folder
//! ```

mod bls;
mod channel;
mod instance;
mod log;
mod metrics;
mod protocol;
mod pump;
mod shm;
mod stub;
mod stub_files;

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use nereid_core::backend::settings::BackendConfig;
use nereid_core::backend::{self, Backend, InstanceSpec, ModelInstance};
use nereid_core::error::{Error, Result};
use nereid_core::model_config::autocomplete::ModelSignature;
use nereid_core::model_config::{self, json as config_json};
use nereid_proto::inference::ModelConfig;
use nereid_proto::inference::model_config::SchedulingChoice;
use parking_lot::Mutex;

use crate::instance::{PythonInstance, Shared};
use crate::metrics::CustomMetrics;
use crate::protocol::{FromStub, ToStub};
use crate::shm::PoolSize;
use crate::stub::{Gone, Launch, Stub};

/// The settings (`--backend-config=python,<setting>=<value>`) and their defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    pub shm_default_byte_size: usize,
    pub shm_growth_byte_size: usize,
    pub shm_limit_byte_size: usize,
    pub stub_timeout: Duration,
    pub execute_timeout: Duration,
    /// How many executes an instance sends ahead while its stub runs the
    /// current one (`execute-ahead`, at most [`MAX_EXECUTE_AHEAD`]); unset,
    /// as the model's scheduling suits ([`execute_ahead`]).
    pub execute_ahead: Option<usize>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            shm_default_byte_size: 1 << 20,
            shm_growth_byte_size: 1 << 20,
            shm_limit_byte_size: 1 << 30,
            stub_timeout: Duration::from_secs(30),
            execute_timeout: Duration::from_secs(300),
            execute_ahead: None,
        }
    }
}

impl Settings {
    /// The Python backend's values among `--backend-config`'s (already
    /// checked to be counts).
    pub fn from_configs(configs: &[BackendConfig]) -> Self {
        let defaults = Settings::default();
        let count = |setting: &str, default: u64| {
            BackendConfig::value_of(configs, "python", setting)
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(default)
        };
        let bytes = |setting: &str, default: usize| {
            usize::try_from(count(setting, default as u64))
                .unwrap_or(usize::MAX)
                .max(shm::ALIGN)
        };
        let seconds = |setting: &str, default: Duration| Duration::from_secs(count(setting, default.as_secs()).max(1));
        Settings {
            shm_default_byte_size: bytes("shm-default-byte-size", defaults.shm_default_byte_size),
            shm_growth_byte_size: bytes("shm-growth-byte-size", defaults.shm_growth_byte_size),
            shm_limit_byte_size: bytes("shm-limit-byte-size", defaults.shm_limit_byte_size),
            stub_timeout: seconds("stub-timeout-seconds", defaults.stub_timeout),
            execute_timeout: seconds("execute-timeout-seconds", defaults.execute_timeout),
            execute_ahead: BackendConfig::value_of(configs, "python", "execute-ahead")
                .and_then(|v| v.parse::<u64>().ok())
                .map(|n| n.min(MAX_EXECUTE_AHEAD as u64) as usize),
        }
    }
}

/// The most executes an instance sends ahead: the pool runs an instance on
/// at most four threads.
pub const MAX_EXECUTE_AHEAD: usize = 3;

/// How many executes an instance of `config` sends ahead unless
/// `execute-ahead` says: two for a model that takes one request per
/// execute, so that a delayed server thread still leaves the stub one to
/// start on; one behind a dynamic batcher, which forms a batch whenever a
/// thread is free, so that every thread more makes the batches smaller
/// (benchmarks log 33).
fn execute_ahead(settings: &Settings, config: &ModelConfig) -> usize {
    let batched = matches!(config.scheduling_choice, Some(SchedulingChoice::DynamicBatching(_)));
    settings.execute_ahead.unwrap_or(if batched { 1 } else { 2 })
}

/// The backend, plugged in by the binary.
pub struct PythonBackend {
    settings: Settings,
    runtime: tokio::runtime::Handle,
    metrics: Arc<CustomMetrics>,
    /// Instances made per model, for their names.
    instances: Mutex<HashMap<String, usize>>,
}

impl PythonBackend {
    /// `registry`: where models' own metrics go (`None` with metrics off).
    /// Must be made on the async runtime: models' calls to other models run there.
    pub fn new(settings: Settings, registry: Option<prometheus::Registry>) -> Self {
        PythonBackend {
            settings,
            runtime: tokio::runtime::Handle::current(),
            metrics: Arc::new(CustomMetrics::new(registry)),
            instances: Mutex::new(HashMap::new()),
        }
    }

    fn launch(&self, config: &ModelConfig, model_dir: &Path) -> Result<Launch> {
        Ok(Launch {
            python: interpreter(config, model_dir)?,
            stub_dir: stub_files::dir()?,
            pool: PoolSize {
                default: self.settings.shm_default_byte_size,
                growth: self.settings.shm_growth_byte_size,
                limit: self.settings.shm_limit_byte_size,
            },
        })
    }
}

impl Backend for PythonBackend {
    /// A model.py declares nothing a server can read without running it:
    /// auto-complete asks the model ([`Backend::complete_config`]).
    fn signature(&self, _: &ModelConfig, _: &Path) -> Result<Option<ModelSignature>> {
        Ok(None)
    }

    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
        let config = spec.config;
        let model_dir = spec.version_dir.parent().unwrap_or(spec.version_dir);
        let model_file = backend::model_file(config, spec.version_dir, "model.py")?;
        let version = spec
            .version_dir
            .file_name()
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<i64>().ok())
            .unwrap_or(1);
        let mut outputs = HashMap::new();
        for output in &config.output {
            let datatype = model_config::output_datatype(output)
                .ok_or_else(|| Error::invalid(format!("output '{}' has no datatype the server knows", output.name)))?;
            outputs.insert(output.name.clone(), (datatype, output.dims.clone()));
        }
        let index = {
            let mut counts = self.instances.lock();
            let count = counts.entry(config.name.clone()).or_default();
            *count += 1;
            *count - 1
        };
        let shared = Shared {
            model: config.name.clone(),
            version,
            config_json: config_json::to_json(config).to_string(),
            model_file: model_file.to_string_lossy().into_owned(),
            model_dir: model_dir.to_string_lossy().into_owned(),
            decoupled: config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled),
            output_names: config.output.iter().map(|o| o.name.clone()).collect(),
            outputs,
            batching: config.max_batch_size > 0,
            launch: self.launch(config, model_dir)?,
            stub_timeout: self.settings.stub_timeout,
            execute_timeout: self.settings.execute_timeout,
            members: spec.members.clone(),
            runtime: self.runtime.clone(),
            metrics: Arc::clone(&self.metrics),
            mistyped: Default::default(),
            execute_ahead: execute_ahead(&self.settings, config),
        };
        let name = format!("{}_0_{index}", config.name);
        Ok(Box::new(PythonInstance::start(Arc::new(shared), name, spec.device)?))
    }

    /// The stub tells the model its device; the model computes there.
    fn runs_on_gpu(&self) -> bool {
        true
    }

    fn decoupled(&self) -> bool {
        true
    }

    fn reads_requested_outputs(&self) -> bool {
        true
    }

    /// Triton's `auto_complete_config`: a stub started for it alone imports
    /// the model and lets its class fill in the config.
    fn complete_config(&self, config: &mut ModelConfig, version_dir: &Path) -> Result<()> {
        let model_dir = version_dir.parent().unwrap_or(version_dir);
        let model_file = backend::model_file(config, version_dir, "model.py")?;
        let launch = self.launch(config, model_dir)?;
        let failed = |why: String| Error::invalid(format!("model '{}': auto-complete failed: {why}", config.name));
        let mut stub = Stub::spawn(&launch, &config.name)?;
        let ask = ToStub::AutoComplete {
            model_file: model_file.to_string_lossy().into_owned(),
            config: config_json::to_json(config),
        };
        stub.send(&ask).map_err(|g| failed(g.describe()))?;
        let completed = match stub.answer(self.settings.stub_timeout, &config.name, &self.metrics) {
            Ok(FromStub::Config { config }) => config,
            Ok(FromStub::Failed { message }) => return Err(failed(message)),
            Ok(other) => return Err(failed(format!("the stub answered {other:?}"))),
            Err(Gone::Silent(_)) => {
                return Err(failed(format!(
                    "no answer within {} s (--backend-config=python,stub-timeout-seconds)",
                    self.settings.stub_timeout.as_secs()
                )));
            }
            Err(gone) => return Err(failed(gone.describe())),
        };
        let mut completed =
            config_json::from_json(&completed.to_string()).map_err(|e| failed(e.message().to_string()))?;
        // What the repository decided is not the model's to change.
        completed.name.clone_from(&config.name);
        completed.backend.clone_from(&config.backend);
        completed.platform.clone_from(&config.platform);
        completed
            .default_model_filename
            .clone_from(&config.default_model_filename);
        *config = completed;
        Ok(())
    }
}

/// The interpreter for a model: the one its `EXECUTION_ENV_PATH` names (a
/// folder holding `bin/python3`, or a packed environment unpacked once
/// into a private cache), else `python3` on the PATH.
fn interpreter(config: &ModelConfig, model_dir: &Path) -> Result<PathBuf> {
    let Some(named) = model_config::parameter(config, "EXECUTION_ENV_PATH").filter(|p| !p.is_empty()) else {
        return Ok(PathBuf::from("python3"));
    };
    let path = PathBuf::from(named.replace("$$TRITON_MODEL_DIRECTORY", &model_dir.to_string_lossy()));
    let env = match path.is_dir() {
        true => path,
        false => unpack(&path)?,
    };
    let python = env.join("bin").join("python3");
    match python.exists() {
        true => Ok(python),
        false => Err(Error::invalid(format!(
            "EXECUTION_ENV_PATH '{named}' has no bin/python3"
        ))),
    }
}

/// This process's user, as the kernel reports it for our own process.
fn user_id() -> std::io::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").map(|m| m.uid())
}

/// Unpacks a packed environment (`.tar.gz`, as conda-pack makes) once: the
/// folder is named by the archive's path, size and modification time.
fn unpack(archive: &Path) -> Result<PathBuf> {
    let meta = std::fs::metadata(archive).map_err(|e| {
        Error::invalid(format!(
            "EXECUTION_ENV_PATH '{}' cannot be read: {e}",
            archive.display()
        ))
    })?;
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    (archive, meta.len(), meta.modified().ok()).hash(&mut hasher);
    let uid = user_id().map_err(|e| Error::unavailable(format!("failed to read this process's user: {e}")))?;
    let dir = std::env::temp_dir().join(format!("nereid-python-env-{uid}-{:016x}", hasher.finish()));
    let done = dir.join(".nereid-unpacked");
    if done.exists() {
        return Ok(dir);
    }
    let partial = dir.with_extension(format!("partial{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&partial);
    std::fs::create_dir_all(&partial)
        .map_err(|e| Error::unavailable(format!("failed to unpack the environment: {e}")))?;
    let status = std::process::Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(&partial)
        .status()
        .map_err(|e| Error::unavailable(format!("failed to run tar to unpack '{}': {e}", archive.display())))?;
    if !status.success() {
        let _ = std::fs::remove_dir_all(&partial);
        return Err(Error::invalid(format!(
            "EXECUTION_ENV_PATH '{}' could not be unpacked (tar {status})",
            archive.display()
        )));
    }
    std::fs::write(partial.join(".nereid-unpacked"), b"")
        .and_then(|()| match std::fs::rename(&partial, &dir) {
            // Another server unpacked it meanwhile.
            Err(_) if done.exists() => std::fs::remove_dir_all(&partial),
            other => other,
        })
        .map_err(|e| Error::unavailable(format!("failed to unpack the environment: {e}")))?;
    Ok(dir)
}
