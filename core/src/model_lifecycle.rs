//! Turning a model folder into loaded versions: the blocking part of a load.
//!
//! The steps are Triton's: take the config (an override, `config.pbtxt`, or
//! nothing), pick the backend, pick the versions by policy, complete the
//! config from the model file (a remote model's from the remote's config),
//! check it (an ensemble's DAG against its loaded members), then start each
//! version's instances. Each step's failure is a reason the repository
//! index shows.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use nereid_gpu::Gpus;
use nereid_proto::inference::{
    ModelConfig, ModelTransactionPolicy, ModelVersionPolicy, model_config::SchedulingChoice, model_version_policy,
};

use crate::backend;
use crate::backend::BackendKind;
use crate::backend::settings::BackendSettings;
use crate::ensemble_scheduler::plan;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::model::{Model, VersionSource};
use crate::model_config::{autocomplete, file_names, instance_group, sequence, validate::validate};
use crate::model_repository_manager::Members;
use crate::repository::{ModelFiles, select_versions};

/// A config ready to load, with what was decided on the way.
pub struct PreparedModel {
    pub config: Arc<ModelConfig>,
    pub kind: BackendKind,
    pub versions: Vec<(i64, std::path::PathBuf)>,
}

/// How models are loaded, the same for every load.
#[derive(Clone)]
pub struct LoadOptions {
    /// Complete missing config fields from the model file.
    pub autocomplete: bool,
    /// The backends' settings (`--backend-config`).
    pub backend_settings: BackendSettings,
    /// Per model, a JSON file merged over its `config.pbtxt` (`--model-config-patch`).
    pub patches: BTreeMap<String, std::path::PathBuf>,
    /// Where every loaded version registers its metrics.
    pub metrics: Arc<Metrics>,
    /// The loaded models, for ensembles' steps (set by the manager).
    pub members: Members,
    /// How long an unload waits for the requests a version had admitted
    /// (and for its instances to be dropped) before it answers
    /// (`--model-unload-timeout-secs`).
    pub unload_timeout: std::time::Duration,
    /// The GPUs instances may be placed on.
    pub gpus: Arc<Gpus>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            autocomplete: false,
            backend_settings: BackendSettings::default(),
            patches: BTreeMap::new(),
            metrics: Metrics::disabled(),
            members: Members::default(),
            unload_timeout: std::time::Duration::from_secs(30),
            gpus: Arc::new(Gpus::none("this server was not asked to look for GPUs")),
        }
    }
}

/// A model's config as the folder (or an override, or a patch) gives it,
/// before anything is completed: enough to see what the model depends on.
pub fn read_config(
    name: &str,
    dir: &Path,
    config_override: Option<ModelConfig>,
    options: &LoadOptions,
) -> Result<(ModelConfig, ModelFiles)> {
    let files = ModelFiles::read(dir)?;
    let config = match config_override {
        Some(config) => config,
        None => {
            let base = files.config.clone().unwrap_or_default();
            match options.patches.get(name) {
                Some(path) => {
                    let patch = std::fs::read_to_string(path).map_err(|e| {
                        Error::invalid(format!("failed to read the config patch '{}': {e}", path.display()))
                    })?;
                    crate::model_config::json::merge_patch(&base, &patch)?
                }
                None => base,
            }
        }
    };
    Ok((config, files))
}

/// The models `config` needs loaded first: an ensemble's members.
pub fn dependencies(config: &ModelConfig) -> Vec<String> {
    match BackendKind::from_config(config) {
        Some(BackendKind::Ensemble) => crate::ensemble_scheduler::plan::members(config),
        _ => Vec::new(),
    }
}

/// Reads, completes and checks a model's config. An override from the
/// repository API replaces the whole config, as in Triton; otherwise a
/// patch given for the model is merged over the folder's config.
pub fn prepare(
    name: &str,
    dir: &Path,
    config_override: Option<ModelConfig>,
    options: &LoadOptions,
) -> Result<PreparedModel> {
    let autocomplete_enabled = options.autocomplete;
    let (mut config, files) = read_config(name, dir, config_override, options)?;
    // Before anything is opened: an override's file names are client input.
    file_names::check(&config)?;
    if config.name.is_empty() {
        config.name = name.to_string();
    } else if config.name != name {
        return Err(Error::invalid(format!(
            "model name '{}' in the configuration does not match the folder name '{name}'",
            config.name
        )));
    }
    let available: Vec<i64> = files.versions.keys().copied().collect();
    let selected = select_versions(config.version_policy.as_ref(), &available)
        .map_err(|e| Error::invalid(format!("{} '{name}'", e.message())))?;
    let versions: Vec<(i64, std::path::PathBuf)> = selected.iter().map(|v| (*v, files.versions[v].clone())).collect();
    let latest_dir = &versions.last().expect("select_versions returns at least one").1;

    let kind = match BackendKind::from_config(&config) {
        Some(kind) => kind,
        // Like Triton, recognise an ONNX or a Python model by its file when
        // nothing is named.
        None if config.backend.is_empty()
            && config.platform.is_empty()
            && autocomplete_enabled
            && latest_dir.join("model.onnx").is_file() =>
        {
            BackendKind::OnnxRuntime
        }
        None if config.backend.is_empty()
            && config.platform.is_empty()
            && autocomplete_enabled
            && latest_dir.join("model.py").is_file() =>
        {
            BackendKind::Python
        }
        None => {
            return Err(Error::invalid(format!(
                "unknown backend '{}' / platform '{}': supported are {}",
                config.backend,
                config.platform,
                BackendKind::known()
            )));
        }
    };
    kind.describe(&mut config);
    if let Some(file) = kind.default_model_filename()
        && config.default_model_filename.is_empty()
    {
        config.default_model_filename = file.to_string();
    }

    if let Some(signature) = backend::for_kind(kind).signature(&config, latest_dir)? {
        if autocomplete_enabled {
            autocomplete::complete(&mut config, &signature, options.backend_settings.default_max_batch_size)?;
        }
        autocomplete::check_against(&config, &signature)?;
    }
    if autocomplete_enabled {
        kind.implementation().complete_config(&mut config, latest_dir)?;
    }
    fill_defaults(&mut config);
    // Ensembles and remote models have no instances to place.
    if !matches!(kind, BackendKind::Ensemble | BackendKind::Remote) {
        instance_group::resolve(&mut config, &options.gpus, kind.implementation().runs_on_gpu())?;
    }
    validate(&config)?;
    if config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled) && !kind.implementation().decoupled() {
        return Err(Error::unsupported(format!(
            "backend '{}' cannot run decoupled models (model_transaction_policy {{ decoupled: true }})",
            config.backend
        )));
    }
    if kind == BackendKind::Ensemble {
        // The DAG against the members loaded now (the manager loads them first).
        let plan = plan::plan(&config, &|member, version| options.members.config(member, version))?;
        // A decoupled step makes the ensemble decoupled: its config says so,
        // as a client reading /config expects of a model it must stream.
        if plan.is_decoupled() && config.model_transaction_policy.is_none() {
            config.model_transaction_policy = Some(ModelTransactionPolicy { decoupled: true });
        }
    }
    Ok(PreparedModel {
        config: Arc::new(config),
        kind,
        versions,
    })
}

/// Triton's normalisation: the defaults it writes into every config so that
/// `/config` shows what is in force.
fn fill_defaults(config: &mut ModelConfig) {
    if config.version_policy.is_none() {
        config.version_policy = Some(ModelVersionPolicy {
            policy_choice: Some(model_version_policy::PolicyChoice::Latest(
                model_version_policy::Latest { num_versions: 1 },
            )),
        });
    }
    if let Some(SchedulingChoice::SequenceBatching(sequence)) = &mut config.scheduling_choice {
        sequence::fill_defaults(sequence);
    }
    if let Some(SchedulingChoice::DynamicBatching(batching)) = &mut config.scheduling_choice
        && batching.preferred_batch_size.is_empty()
        && config.max_batch_size > 0
    {
        batching.preferred_batch_size.push(config.max_batch_size);
    }
}

/// Loads every version of a prepared model; each version succeeds or fails on its own.
pub fn load_versions(name: &str, prepared: &PreparedModel, options: &LoadOptions) -> BTreeMap<i64, Result<Arc<Model>>> {
    prepared
        .versions
        .iter()
        .map(|(version, dir)| {
            let source = VersionSource {
                name,
                version: *version,
                dir,
                config: Arc::clone(&prepared.config),
                kind: prepared.kind,
            };
            (*version, Model::load(source, options).map(Arc::new))
        })
        .collect()
}
