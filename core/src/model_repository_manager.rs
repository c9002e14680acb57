//! Which models are loaded, in which state, and the repository API.
//!
//! Loads run on the blocking pool and are serialised per manager, so two
//! loads of one model never race; lookups only take a short read lock and
//! clone an `Arc<Model>`. A reload swaps the versions in one step: requests
//! already holding the old `Arc<Model>` finish on the old instances, which
//! stop once the last of them is done.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use nereid_proto::inference::ModelConfig;
use parking_lot::RwLock;

use crate::error::{Error, ErrorKind, Result};
use crate::model::{Model, Retired};
use crate::model_lifecycle::{self, LoadOptions};
use crate::repository::Repository;

/// Triton's `--model-control-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ControlMode {
    /// Load everything at start-up; the repository API cannot change it.
    None,
    /// Load only what `--load-model` names; the repository API loads and unloads.
    Explicit,
    /// Load everything at start-up, then every `--repository-poll-secs` load
    /// new models, reload changed ones and unload removed ones
    /// ([`ModelRepositoryManager::poll`]); the repository API cannot load or
    /// unload.
    Poll,
}

/// A model version's state, as the repository index spells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelState {
    Loading,
    Ready,
    Unloading,
    Unavailable,
}

impl ModelState {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelState::Loading => "LOADING",
            ModelState::Ready => "READY",
            ModelState::Unloading => "UNLOADING",
            ModelState::Unavailable => "UNAVAILABLE",
        }
    }
}

/// One row of the repository index.
#[derive(Debug, Clone, PartialEq)]
pub struct IndexEntry {
    pub name: String,
    /// `None` for a model that was never loaded or failed before any version was known.
    pub version: Option<i64>,
    /// `None` for a model that was never loaded.
    pub state: Option<ModelState>,
    pub reason: String,
}

#[derive(Clone)]
struct VersionEntry {
    state: ModelState,
    reason: String,
    model: Option<Arc<Model>>,
}

#[derive(Clone, Default)]
struct ModelEntry {
    versions: BTreeMap<i64, VersionEntry>,
    /// A state for the model as a whole, when no version got that far.
    whole: Option<(ModelState, String)>,
}

type Models = RwLock<BTreeMap<String, ModelEntry>>;

pub struct ModelRepositoryManager {
    repository: Repository,
    mode: ControlMode,
    options: Arc<LoadOptions>,
    models: Arc<Models>,
    /// Serialises loads and unloads.
    changes: tokio::sync::Mutex<()>,
    /// Poll mode: each model's fingerprint as its last load attempt saw it.
    seen: parking_lot::Mutex<BTreeMap<String, String>>,
}

/// The loaded models as an ensemble's steps find them: a weak handle, so
/// a loaded ensemble never keeps the manager's models alive.
#[derive(Clone, Default)]
pub struct Members(Weak<Models>);

impl std::fmt::Debug for Members {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Members").finish_non_exhaustive()
    }
}

impl Members {
    /// A ready version of `name` (`None`: the highest), as `get` finds it.
    pub fn get(&self, name: &str, version: Option<i64>) -> Result<Arc<Model>> {
        let models = self
            .0
            .upgrade()
            .ok_or_else(|| Error::new(ErrorKind::NotServing, "the server is shutting down"))?;
        // Recursive: the index checks an ensemble's members while it holds
        // a read lock, and a plain read could wait behind a queued writer.
        let models = models.read_recursive();
        lookup(&models, name, version)
    }

    /// The config of a ready version, if there is one.
    pub fn config(&self, name: &str, version: Option<i64>) -> Option<Arc<ModelConfig>> {
        self.get(name, version).ok().map(|m| Arc::clone(m.config()))
    }
}

impl ModelRepositoryManager {
    /// The GPUs its models' instances are placed on.
    pub fn gpus(&self) -> &Arc<nereid_gpu::Gpus> {
        &self.options.gpus
    }

    pub fn new(repository: Repository, mode: ControlMode, mut options: LoadOptions) -> Self {
        let models = Arc::new(RwLock::new(BTreeMap::new()));
        options.members = Members(Arc::downgrade(&models));
        ModelRepositoryManager {
            repository,
            mode,
            options: Arc::new(options),
            models,
            changes: tokio::sync::Mutex::new(()),
            seen: parking_lot::Mutex::new(BTreeMap::new()),
        }
    }

    pub fn mode(&self) -> ControlMode {
        self.mode
    }

    /// Loads what the control mode says to load at start-up. Failures are
    /// logged, left in the index and returned; whether they stop the server
    /// is the caller's choice (`--exit-on-error`).
    pub async fn load_startup_models(&self, explicit: &[String]) -> Result<Vec<(String, Error)>> {
        let names: Vec<String> = match self.mode {
            ControlMode::None | ControlMode::Poll => self.repository.scan().await?.into_keys().collect(),
            ControlMode::Explicit if explicit.iter().any(|n| n == "*") => {
                self.repository.scan().await?.into_keys().collect()
            }
            ControlMode::Explicit => explicit.to_vec(),
        };
        let mut failures = Vec::new();
        for name in names {
            // Already loaded as a member of an ensemble loaded before it.
            if self.has_ready_version(&name) {
                continue;
            }
            match self.load_unchecked(&name, None).await {
                Ok(()) => tracing::info!(model = %name, "loaded"),
                Err(e) => {
                    tracing::error!(model = %name, error = %e, "failed to load");
                    failures.push((name, e));
                }
            }
        }
        Ok(failures)
    }

    /// The repository API's load: (re)loads a model, optionally with a config override.
    pub async fn load(&self, name: &str, config_override: Option<ModelConfig>) -> Result<()> {
        self.check_explicit()?;
        if name.is_empty() {
            return Err(Error::invalid(
                "Model name cannot be empty. Please enter a valid name to deploy.",
            ));
        }
        self.load_unchecked(name, config_override).await
    }

    async fn load_unchecked(&self, name: &str, config_override: Option<ModelConfig>) -> Result<()> {
        let _guard = self.changes.lock().await;
        self.load_locked(name, config_override, &mut Vec::new()).await
    }

    /// Loads `name` (the caller holds `changes`), after the models it
    /// depends on that are not loaded yet: an ensemble's members, as Triton
    /// loads an ensemble's composing models. `chain` is the ensembles being
    /// loaded around this one, to refuse a cycle.
    fn load_locked<'a>(
        &'a self,
        name: &'a str,
        config_override: Option<ModelConfig>,
        chain: &'a mut Vec<String>,
    ) -> futures::future::BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            self.remember_fingerprint(name).await;
            // Located once, for its dependencies and its load: from object
            // storage, each locate lists the repository and the folder.
            let located = self.repository.locate(name).await;
            let dependencies = match &located {
                Ok(dir) => self.dependencies(name, dir, config_override.as_ref()).await,
                Err(_) => Vec::new(),
            };
            chain.push(name.to_string());
            for member in dependencies {
                if chain.contains(&member) {
                    let cycle = format!("{} -> {member}", chain.join(" -> "));
                    chain.pop();
                    return self.fail_first_load(
                        name,
                        Error::invalid(format!("ensemble '{name}' depends on itself: {cycle}")),
                    );
                }
                if self.has_ready_version(&member) {
                    continue;
                }
                if let Err(e) = self.load_locked(&member, None, chain).await {
                    chain.pop();
                    return self.fail_first_load(
                        name,
                        Error::unavailable(format!(
                            "ensemble '{name}' needs model '{member}', which did not load: {}",
                            e.message()
                        )),
                    );
                }
            }
            chain.pop();
            self.load_one(name, config_override, located).await
        })
    }

    /// What `name`'s config (in `dir`) says it needs loaded first; nothing
    /// when the config cannot be read (the load itself then says why).
    async fn dependencies(&self, name: &str, dir: &Path, config_override: Option<&ModelConfig>) -> Vec<String> {
        let dir = dir.to_path_buf();
        let options = Arc::clone(&self.options);
        let owned = (name.to_string(), config_override.cloned());
        tokio::task::spawn_blocking(move || {
            model_lifecycle::read_config(&owned.0, &dir, owned.1, &options)
                .map(|(config, _)| model_lifecycle::dependencies(&config))
                .unwrap_or_default()
        })
        .await
        .unwrap_or_default()
    }

    /// Marks a first load that failed before it started as unavailable.
    fn fail_first_load(&self, name: &str, error: Error) -> Result<()> {
        if !self.has_ready_version(name) {
            self.set_whole(name, ModelState::Unavailable, error.message());
        }
        Err(Error::invalid(format!(
            "load failed for model '{name}': {}",
            error.message()
        )))
    }

    /// In poll mode, records what `name`'s folder holds, unless a poll
    /// already did. Taken before the files are read: a change while they
    /// are is seen by the next poll. A poll records what it found before it
    /// reloads; this covers the loads it did not start (start-up, an
    /// ensemble's members).
    async fn remember_fingerprint(&self, name: &str) {
        if self.mode == ControlMode::Poll
            && !self.seen.lock().contains_key(name)
            && let Ok(fingerprint) = self.repository.fingerprint(name).await
        {
            self.seen.lock().insert(name.to_string(), fingerprint);
        }
    }

    /// Loads one model, `located` in its folder, whose dependencies are in
    /// place.
    async fn load_one(&self, name: &str, config_override: Option<ModelConfig>, located: Result<PathBuf>) -> Result<()> {
        let dir = match located {
            Ok(dir) => dir,
            Err(e) if e.kind() == ErrorKind::NotFound => {
                return Err(Error::internal(format!(
                    "failed to load '{name}', failed to poll from model repository"
                )));
            }
            Err(e) => {
                self.set_whole(name, ModelState::Unavailable, e.message());
                return Err(Error::invalid(format!("load failed for model '{name}': {e}")));
            }
        };
        let first_load = !self.has_ready_version(name);
        if first_load {
            self.set_whole(name, ModelState::Loading, "");
        }
        let options = Arc::clone(&self.options);
        let owned_name = name.to_string();
        let outcome = tokio::task::spawn_blocking(move || {
            let prepared = model_lifecycle::prepare(&owned_name, &dir, config_override, &options)?;
            Ok::<_, Error>(model_lifecycle::load_versions(&owned_name, &prepared, &options))
        })
        .await
        .unwrap_or_else(|e| Err(Error::internal(format!("model load panicked: {e}"))));

        let loaded = match outcome {
            Ok(loaded) => loaded,
            Err(e) => {
                // A failed reload leaves the versions that were serving in
                // place, and the index says why they were not replaced.
                if first_load {
                    self.set_whole(name, ModelState::Unavailable, e.message());
                } else {
                    let mut models = self.models.write();
                    for version in models.get_mut(name).into_iter().flat_map(|m| m.versions.values_mut()) {
                        if version.model.is_some() {
                            version.reason = format!("serving the previous load; the reload failed: {}", e.message());
                        }
                    }
                }
                return Err(Error::invalid(format!("load failed for model '{name}': {e}")));
            }
        };
        let mut failures = String::new();
        let mut entry = ModelEntry::default();
        let mut models = self.models.write();
        let previous = models.remove(name).unwrap_or_default();
        for (version, result) in loaded {
            let version_entry = match result {
                Ok(model) => VersionEntry {
                    state: ModelState::Ready,
                    reason: String::new(),
                    model: Some(model),
                },
                Err(e) => {
                    failures.push_str(&format!("version {version} is at UNAVAILABLE state: {e};\n"));
                    match previous.versions.get(&version) {
                        // A failed reload keeps the copy that was serving,
                        // and the index says why it was not replaced.
                        Some(serving) if serving.model.is_some() => VersionEntry {
                            reason: format!("serving the previous load; the reload failed: {}", e.message()),
                            ..serving.clone()
                        },
                        _ => VersionEntry {
                            state: ModelState::Unavailable,
                            reason: e.message().to_string(),
                            model: None,
                        },
                    }
                }
            };
            entry.versions.insert(version, version_entry);
        }
        models.insert(name.to_string(), entry);
        drop(models);
        if failures.is_empty() {
            Ok(())
        } else {
            Err(Error::invalid(format!("load failed for model '{name}': {failures}")))
        }
    }

    /// The repository API's unload. Unloading an unknown model is not an
    /// error, as in Triton. It answers once the requests the model had
    /// admitted have finished and its instances are dropped, or after the
    /// unload timeout, whichever comes first; in the second case the
    /// versions stay UNLOADING until that happens.
    pub async fn unload(&self, name: &str) -> Result<()> {
        self.check_explicit()?;
        let retired = {
            let _guard = self.changes.lock().await;
            self.retire(name, "unloaded")
        };
        // Not under the lock: other models load and unload meanwhile.
        drain(
            Arc::clone(&self.models),
            name.to_string(),
            retired,
            "unloaded",
            self.options.unload_timeout,
        )
        .await;
        Ok(())
    }

    /// Takes every version of `name` out of service: no new request
    /// finds it. A version that was serving is UNLOADING until the requests
    /// holding it finish and its instances are dropped ([`drain`]); the
    /// others are UNAVAILABLE for `reason` at once.
    fn retire(&self, name: &str, reason: &str) -> Vec<(i64, Retired)> {
        let mut retired = Vec::new();
        let mut models = self.models.write();
        if let Some(entry) = models.get_mut(name) {
            for (number, version) in &mut entry.versions {
                match version.model.take() {
                    Some(model) => {
                        retired.push((*number, Retired::new(model)));
                        version.state = ModelState::Unloading;
                        version.reason = "waiting for its requests in flight to finish".to_string();
                    }
                    None => {
                        version.state = ModelState::Unavailable;
                        version.reason = reason.to_string();
                    }
                }
            }
            if entry.versions.is_empty() {
                entry.whole = Some((ModelState::Unavailable, reason.to_string()));
            }
        }
        retired
    }

    /// One pass of poll mode: loads the models that appeared in the
    /// repositories, reloads those whose fingerprint changed since their last
    /// load attempt (a reload swaps the new versions in only once they are
    /// ready, so requests never see a gap) and unloads those that are gone.
    /// A repository that cannot be read (a vanished bucket) changes nothing:
    /// what serves keeps serving, and the log says why.
    pub async fn poll(&self) {
        let _guard = self.changes.lock().await;
        let found = match self.repository.scan().await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e, "poll: the model repository cannot be read; nothing changed");
                return;
            }
        };
        for (name, where_found) in &found {
            let fingerprint = match self.repository.fingerprint_found(name, where_found).await {
                Ok(fingerprint) => fingerprint,
                Err(e) => {
                    tracing::warn!(model = %name, error = %e, "poll: cannot read the model's folder; left as it is");
                    continue;
                }
            };
            let previous = self.seen.lock().insert(name.clone(), fingerprint.clone());
            if previous.as_deref() == Some(fingerprint.as_str()) {
                continue;
            }
            let what = if previous.is_some() { "reloaded" } else { "loaded" };
            match self.load_locked(name, None, &mut Vec::new()).await {
                Ok(()) => tracing::info!(model = %name, "poll: {what}"),
                Err(e) => tracing::error!(model = %name, error = %e, "poll: failed to load"),
            }
        }
        let gone: Vec<String> = self
            .seen
            .lock()
            .keys()
            .filter(|n| !found.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            self.seen.lock().remove(&name);
            let reason = "removed from the model repository";
            let retired = self.retire(&name, reason);
            tracing::info!(model = %name, "poll: unloading (removed from the repository)");
            // The next poll does not wait for it.
            tokio::spawn(drain(
                Arc::clone(&self.models),
                name,
                retired,
                reason,
                self.options.unload_timeout,
            ));
        }
    }

    /// Unloads everything (used at shutdown, after the front ends stopped).
    pub fn unload_all(&self) {
        let mut models = self.models.write();
        models.clear();
    }

    /// A ready model version; `None` picks the highest ready version.
    pub fn get(&self, name: &str, version: Option<i64>) -> Result<Arc<Model>> {
        lookup(&self.models.read(), name, version)
    }

    /// Every ready model version, by name then version.
    pub fn ready_models(&self) -> Vec<Arc<Model>> {
        let models = self.models.read();
        models
            .values()
            .flat_map(|entry| entry.versions.values().filter_map(|v| v.model.clone()))
            .collect()
    }

    /// The ready versions of a model, ascending.
    pub fn ready_versions(&self, name: &str) -> Vec<i64> {
        let models = self.models.read();
        models.get(name).map_or_else(Vec::new, |entry| {
            entry
                .versions
                .iter()
                .filter(|(_, v)| v.model.is_some())
                .map(|(n, _)| *n)
                .collect()
        })
    }

    /// Every model in the repositories and every model known to the manager.
    pub async fn index(&self, ready_only: bool) -> Result<Vec<IndexEntry>> {
        let mut names: Vec<String> = self.repository.scan().await?.into_keys().collect();
        let models = self.models.read();
        names.extend(models.keys().cloned());
        names.sort();
        names.dedup();
        let mut rows = Vec::new();
        for name in names {
            match models.get(&name) {
                None => rows.push(IndexEntry {
                    name,
                    version: None,
                    state: None,
                    reason: String::new(),
                }),
                Some(entry) if entry.versions.is_empty() => {
                    let (state, reason) = entry.whole.clone().unwrap_or((ModelState::Unavailable, String::new()));
                    rows.push(IndexEntry {
                        name,
                        version: None,
                        state: Some(state),
                        reason,
                    });
                }
                Some(entry) => {
                    for (version, v) in &entry.versions {
                        // A loaded ensemble whose member went away cannot answer.
                        let (state, reason) = match v.model.as_ref().map(|m| m.check_ready()) {
                            Some(Err(e)) => (ModelState::Unavailable, e.message().to_string()),
                            _ => (v.state, v.reason.clone()),
                        };
                        rows.push(IndexEntry {
                            name: name.clone(),
                            version: Some(*version),
                            state: Some(state),
                            reason,
                        });
                    }
                }
            }
        }
        if ready_only {
            rows.retain(|r| r.state == Some(ModelState::Ready));
        }
        Ok(rows)
    }

    fn check_explicit(&self) -> Result<()> {
        if self.mode != ControlMode::Explicit {
            return Err(Error::unavailable(
                "explicit model load / unload is not allowed if polling is enabled",
            ));
        }
        Ok(())
    }

    fn has_ready_version(&self, name: &str) -> bool {
        !self.ready_versions(name).is_empty()
    }

    fn set_whole(&self, name: &str, state: ModelState, reason: &str) {
        let mut models = self.models.write();
        let entry = models.entry(name.to_string()).or_default();
        entry.versions.clear();
        entry.whole = Some((state, reason.to_string()));
    }
}

/// How often a drain looks whether a retired version is gone.
const DRAIN_POLL: std::time::Duration = std::time::Duration::from_millis(20);

/// Waits, at most `timeout`, until every retired version of `name` is gone
/// (its requests finished, its instances dropped), marking each UNAVAILABLE
/// for `reason` as it goes. Past the timeout it returns and a task of its
/// own keeps watching the rest; a version that is loaded again meanwhile
/// is left to its new load.
async fn drain(
    models: Arc<Models>,
    name: String,
    mut retired: Vec<(i64, Retired)>,
    reason: &'static str,
    timeout: std::time::Duration,
) {
    let started = tokio::time::Instant::now();
    let deadline = started + timeout;
    loop {
        sweep(&models, &name, &mut retired, reason);
        if retired.is_empty() {
            tracing::info!(model = %name, elapsed_ms = started.elapsed().as_millis() as u64, "{reason}: its requests finished and its instances are dropped");
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(DRAIN_POLL).await;
    }
    tracing::warn!(
        model = %name,
        versions = ?retired.iter().map(|(v, _)| *v).collect::<Vec<_>>(),
        timeout_secs = timeout.as_secs_f64(),
        "still in use after the unload timeout: requests in flight finish on their instances, which stop after them; the versions stay UNLOADING until then"
    );
    tokio::spawn(async move {
        while !retired.is_empty() {
            tokio::time::sleep(DRAIN_POLL * 5).await;
            sweep(&models, &name, &mut retired, reason);
        }
        tracing::info!(model = %name, "{reason}: the last requests finished and its instances are dropped");
    });
}

/// Drops from `retired` the versions that are gone, marking each
/// UNAVAILABLE for `reason` unless a load took its place meanwhile.
fn sweep(models: &Models, name: &str, retired: &mut Vec<(i64, Retired)>, reason: &str) {
    retired.retain(|(version, r)| {
        if !r.is_gone() {
            return true;
        }
        let mut models = models.write();
        if let Some(entry) = models.get_mut(name).and_then(|m| m.versions.get_mut(version))
            && entry.state == ModelState::Unloading
            && entry.model.is_none()
        {
            entry.state = ModelState::Unavailable;
            entry.reason = reason.to_string();
        }
        false
    });
}

/// A ready version of `name` in `models`; `None` picks the highest.
fn lookup(models: &BTreeMap<String, ModelEntry>, name: &str, version: Option<i64>) -> Result<Arc<Model>> {
    let unknown = || Error::not_found(format!("Request for unknown model: '{name}' is not found"));

    let entry = models.get(name).ok_or_else(unknown)?;
    match version {
        Some(v) => {
            let version_entry = entry.versions.get(&v).ok_or_else(|| {
                Error::not_found(format!("Request for unknown model: '{name}' version {v} is not found"))
            })?;
            version_entry.model.clone().ok_or_else(|| {
                Error::unavailable(format!(
                    "Request for unknown model: '{name}' version {v} is not at ready state"
                ))
            })
        }
        None => entry
            .versions
            .values()
            .rev()
            .find_map(|v| v.model.clone())
            .ok_or_else(|| {
                if entry.versions.is_empty() && entry.whole.is_none() {
                    unknown()
                } else {
                    Error::not_found(format!("Request for unknown model: '{name}' has no available versions"))
                }
            }),
    }
}
