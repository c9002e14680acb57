//! Model repositories in Triton's layout, on the local file system or in
//! object storage ([`ObjectStorage`], plugged in by the binary from
//! nereid-object-storage, so the core does not depend on object_store):
//!
//! ```text
//! <repository>/<model>/config.pbtxt        optional when auto-complete can fill it
//! <repository>/<model>/<version>/<file>    numeric version folders
//! ```
//!
//! Several repositories may be given; a model name must be unique across them.
//! A model in object storage is fetched into a local cache when it loads, so
//! everything after [`Repository::locate`] works on local files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

pub mod cache_dir;

use futures::future::BoxFuture;
use nereid_proto::inference::{ModelConfig, ModelVersionPolicy, model_version_policy::PolicyChoice};

use crate::error::{Error, Result};
use crate::model_config::text;

/// A repository in object storage, its models fetched into a local cache
/// when they load.
pub trait ObjectStorage: Send + Sync + std::fmt::Debug {
    /// The repository's URL, for messages.
    fn url(&self) -> &str;
    /// The model folders under its prefix.
    fn model_names(&self) -> BoxFuture<'_, Result<Vec<String>>>;
    /// Fetches one model folder into the cache; its local path.
    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<PathBuf>>;
    /// What identifies the model folder's contents as the store lists them
    /// (no download): it changes when an object is added, removed or
    /// changed. Poll mode compares it between polls.
    fn fingerprint<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<String>>;
}

/// Opens an object-storage URL (`s3://`, `gs://`, `as://`) whose models are
/// cached under the given folder.
pub type Opener = fn(&str, PathBuf) -> Result<Arc<dyn ObjectStorage>>;

static OPENER: OnceLock<Opener> = OnceLock::new();

/// Makes `opener` open the object-storage repositories; called by the
/// binary before it reads its flags.
pub fn plug_in(opener: Opener) {
    let _ = OPENER.set(opener);
}

/// One `--model-repository`: a local folder or an object-storage prefix.
#[derive(Debug, Clone)]
pub enum Root {
    Local(PathBuf),
    Remote(Arc<dyn ObjectStorage>),
}

impl Root {
    /// A local path, or a URL (`s3://`, `gs://`, `as://`) whose models are
    /// fetched into `cache` (one folder per root).
    pub fn parse(location: &str, cache: &Path, index: usize) -> Result<Root> {
        if !Self::is_remote(location) {
            return Ok(Root::Local(PathBuf::from(location)));
        }
        let Some(open) = OPENER.get() else {
            return Err(Error::unsupported(format!(
                "model repository '{location}': object storage is not part of this server's build"
            )));
        };
        open(location, cache.join(format!("repository-{index}"))).map(Root::Remote)
    }

    /// Whether `location` names object storage (and so needs a cache).
    pub fn is_remote(location: &str) -> bool {
        location.contains("://")
    }

    fn describe(&self) -> String {
        match self {
            Root::Local(path) => path.display().to_string(),
            Root::Remote(remote) => remote.url().to_string(),
        }
    }

    async fn model_names(&self) -> Result<Vec<String>> {
        match self {
            Root::Remote(remote) => remote.model_names().await,
            Root::Local(root) => {
                let entries = std::fs::read_dir(root).map_err(|e| {
                    Error::internal(format!("failed to read model repository '{}': {e}", root.display()))
                })?;
                Ok(entries
                    .flatten()
                    .filter(|entry| entry.path().is_dir())
                    .map(|entry| entry.file_name().to_string_lossy().into_owned())
                    .filter(|name| !name.starts_with('.'))
                    .collect())
            }
        }
    }
}

/// The configured repositories.
#[derive(Debug, Clone)]
pub struct Repository {
    roots: Vec<Root>,
}

/// What one model folder holds.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    pub dir: PathBuf,
    /// `None` when the folder has no `config.pbtxt`.
    pub config: Option<ModelConfig>,
    /// Numeric version folders, ascending.
    pub versions: BTreeMap<i64, PathBuf>,
}

impl Repository {
    pub fn new(roots: Vec<Root>) -> Self {
        Repository { roots }
    }

    /// A repository of local folders only.
    pub fn local(folders: Vec<PathBuf>) -> Self {
        Repository::new(folders.into_iter().map(Root::Local).collect())
    }

    /// Every model in every repository, by name, with the index of the root
    /// that holds it. A name found in more than one repository maps to an
    /// error, so that model alone fails.
    pub async fn scan(&self) -> Result<BTreeMap<String, Result<usize>>> {
        let mut models: BTreeMap<String, Result<usize>> = BTreeMap::new();
        for (index, root) in self.roots.iter().enumerate() {
            for name in root.model_names().await? {
                match models.get(&name) {
                    Some(Ok(first)) => {
                        let message = format!(
                            "model appears in two or more repositories: '{}' and '{}'",
                            self.roots[*first].describe(),
                            root.describe()
                        );
                        models.insert(name, Err(Error::invalid(message)));
                    }
                    Some(Err(_)) => {}
                    None => {
                        models.insert(name, Ok(index));
                    }
                }
            }
        }
        Ok(models)
    }

    /// What identifies one model folder's contents, without fetching it:
    /// for a local folder, every entry's path, size and time of change; for
    /// object storage, the store's listing ([`ObjectStorage::fingerprint`]).
    pub async fn fingerprint(&self, name: &str) -> Result<String> {
        match self.scan().await?.remove(name) {
            Some(found) => self.fingerprint_found(name, &found).await,
            None => Err(Error::not_found(format!("no model folder named '{name}'"))),
        }
    }

    /// [`Repository::fingerprint`] for a model [`Repository::scan`] found.
    /// A name the scan refused (in two repositories) has the refusal as its
    /// fingerprint, so it changes when the refusal does.
    pub async fn fingerprint_found(&self, name: &str, found: &Result<usize>) -> Result<String> {
        let index = match found {
            Ok(index) => *index,
            Err(e) => return Ok(format!("unusable: {}", e.message())),
        };
        match &self.roots[index] {
            Root::Local(root) => {
                let dir = root.join(name);
                tokio::task::spawn_blocking(move || local_fingerprint(&dir))
                    .await
                    .map_err(|e| Error::internal(format!("the repository scan failed: {e}")))?
            }
            Root::Remote(remote) => remote.fingerprint(name).await,
        }
    }

    /// The local folder of one model, fetching it first from object storage.
    pub async fn locate(&self, name: &str) -> Result<PathBuf> {
        let index = match self.scan().await?.remove(name) {
            Some(found) => found?,
            None => {
                return Err(Error::not_found(format!(
                    "failed to load '{name}', failed to poll from model repository: no model folder named '{name}'"
                )));
            }
        };
        match &self.roots[index] {
            Root::Local(root) => Ok(root.join(name)),
            Root::Remote(remote) => remote.fetch(name).await,
        }
    }
}

/// The most entries a model folder may hold for poll mode to compare it.
pub const FINGERPRINT_MAX_ENTRIES: usize = 100_000;

/// The entries under `dir`, each with its size and time of change, hashed.
/// Links are followed, so a link swapped to a new target (the way a
/// deployment tool switches versions) counts as a change.
fn local_fingerprint(dir: &Path) -> Result<String> {
    use std::hash::{Hash, Hasher};
    let mut entries = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(folder) = pending.pop() {
        let listing = std::fs::read_dir(&folder)
            .map_err(|e| Error::internal(format!("failed to read '{}': {e}", folder.display())))?;
        for entry in listing.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let changed = meta
                .modified()
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |d| d.as_nanos());
            let relative = path.strip_prefix(dir).unwrap_or(&path).to_path_buf();
            entries.push((relative, meta.is_dir(), meta.len(), changed));
            // A link that loops back would never end the walk.
            if entries.len() > FINGERPRINT_MAX_ENTRIES {
                return Err(Error::invalid(format!(
                    "'{}' holds more than {FINGERPRINT_MAX_ENTRIES} entries (a link loop?)",
                    dir.display()
                )));
            }
            if meta.is_dir() {
                pending.push(path);
            }
        }
    }
    entries.sort();
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    entries.hash(&mut hasher);
    Ok(format!("{:016x}-{}", hasher.finish(), entries.len()))
}

impl ModelFiles {
    /// Reads the config (if any) and the version folders of a model folder.
    pub fn read(dir: &Path) -> Result<ModelFiles> {
        let config_path = dir.join("config.pbtxt");
        let config = match std::fs::read_to_string(&config_path) {
            Ok(text) => Some(text::parse(&text)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(Error::internal(format!(
                    "failed to read '{}': {e}",
                    config_path.display()
                )));
            }
        };
        let mut versions = BTreeMap::new();
        let entries =
            std::fs::read_dir(dir).map_err(|e| Error::internal(format!("failed to read '{}': {e}", dir.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(version) = entry
                .file_name()
                .to_str()
                // Triton ignores names with a leading zero ("01").
                .filter(|n| !n.starts_with('0') || *n == "0")
                .and_then(|n| n.parse::<i64>().ok())
                .filter(|v| *v >= 0)
            else {
                continue;
            };
            if path.is_dir() {
                versions.insert(version, path);
            }
        }
        Ok(ModelFiles {
            dir: dir.to_path_buf(),
            config,
            versions,
        })
    }
}

/// The versions a policy selects from those available (Triton's default: the latest one).
pub fn select_versions(policy: Option<&ModelVersionPolicy>, available: &[i64]) -> Result<Vec<i64>> {
    let choice = policy.and_then(|p| p.policy_choice.as_ref());
    let selected: Vec<i64> = match choice {
        None => available.iter().rev().take(1).copied().collect(),
        Some(PolicyChoice::Latest(latest)) => {
            let n = usize::try_from(latest.num_versions.max(1)).unwrap_or(1);
            let mut v: Vec<i64> = available.iter().rev().take(n).copied().collect();
            v.reverse();
            v
        }
        Some(PolicyChoice::All(_)) => available.to_vec(),
        Some(PolicyChoice::Specific(specific)) => {
            // Versions without a folder are skipped, as Triton does.
            let mut v: Vec<i64> = specific
                .versions
                .iter()
                .copied()
                .filter(|v| available.contains(v))
                .collect();
            v.sort_unstable();
            v.dedup();
            v
        }
    };
    if selected.is_empty() {
        return Err(Error::invalid(
            "at least one version must be available under the version policy of the model",
        ));
    }
    Ok(selected)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::inference::model_version_policy::{All, Latest, Specific};

    fn policy(choice: PolicyChoice) -> ModelVersionPolicy {
        ModelVersionPolicy {
            policy_choice: Some(choice),
        }
    }

    #[test]
    fn a_local_fingerprint_changes_with_any_file_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path();
        std::fs::create_dir(model.join("1")).unwrap();
        std::fs::write(model.join("config.pbtxt"), "name: \"m\"").unwrap();
        std::fs::write(model.join("1/model.onnx"), "onnx").unwrap();
        let first = local_fingerprint(model).unwrap();
        assert_eq!(local_fingerprint(model).unwrap(), first);

        std::fs::write(model.join("1/model.onnx"), "onnx, longer").unwrap();
        let changed = local_fingerprint(model).unwrap();
        assert_ne!(changed, first);
        std::fs::create_dir(model.join("2")).unwrap();
        let added = local_fingerprint(model).unwrap();
        assert_ne!(added, changed);
        std::fs::remove_dir(model.join("2")).unwrap();
        assert_eq!(local_fingerprint(model).unwrap(), changed);
    }

    #[cfg(unix)]
    #[test]
    fn a_link_loop_is_refused_not_followed_forever() {
        // Two links back double the paths at every level.
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("a")).unwrap();
        std::os::unix::fs::symlink(dir.path(), dir.path().join("b")).unwrap();
        // Ended by the entry bound or by the kernel's refusal, whichever
        // comes first: an error either way, never an endless walk.
        let err = local_fingerprint(dir.path()).unwrap_err();
        assert!(
            err.message().contains("link loop") || err.message().contains("symbolic links"),
            "{err}"
        );
    }

    #[test]
    fn version_policies() {
        let available = [1, 2, 5];
        assert_eq!(select_versions(None, &available).unwrap(), vec![5]);
        let latest2 = policy(PolicyChoice::Latest(Latest { num_versions: 2 }));
        assert_eq!(select_versions(Some(&latest2), &available).unwrap(), vec![2, 5]);
        let all = policy(PolicyChoice::All(All {}));
        assert_eq!(select_versions(Some(&all), &available).unwrap(), vec![1, 2, 5]);
        let specific = policy(PolicyChoice::Specific(Specific { versions: vec![5, 1] }));
        assert_eq!(select_versions(Some(&specific), &available).unwrap(), vec![1, 5]);
        let partly = policy(PolicyChoice::Specific(Specific { versions: vec![3, 5] }));
        assert_eq!(select_versions(Some(&partly), &available).unwrap(), vec![5]);
        let missing = policy(PolicyChoice::Specific(Specific { versions: vec![3] }));
        assert!(select_versions(Some(&missing), &available).is_err());
        assert!(select_versions(None, &[]).is_err());
    }

    #[tokio::test]
    async fn reads_a_model_folder() {
        let root = std::env::temp_dir().join(format!("nereid-repo-test-{}", std::process::id()));
        let model = root.join("m");
        std::fs::create_dir_all(model.join("1")).unwrap();
        std::fs::create_dir_all(model.join("3")).unwrap();
        std::fs::create_dir_all(model.join("notes")).unwrap();
        std::fs::create_dir_all(model.join("02")).unwrap();
        std::fs::write(model.join("config.pbtxt"), "name: \"m\" max_batch_size: 2").unwrap();
        let files = ModelFiles::read(&model).unwrap();
        assert_eq!(files.versions.keys().copied().collect::<Vec<_>>(), vec![1, 3]);
        assert_eq!(files.config.unwrap().max_batch_size, 2);
        let repo = Repository::local(vec![root.clone()]);
        assert!(repo.scan().await.unwrap().contains_key("m"));
        assert_eq!(repo.locate("m").await.unwrap(), model);
        assert!(repo.locate("nope").await.is_err());
        std::fs::remove_dir_all(root).unwrap();
    }
}
