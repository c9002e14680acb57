//! Model repositories on the local file system, in Triton's layout:
//!
//! ```text
//! <repository>/<model>/config.pbtxt        optional when auto-complete can fill it
//! <repository>/<model>/<version>/<file>    numeric version folders
//! ```
//!
//! Several repositories may be given; a model name must be unique across them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use nereid_proto::inference::{ModelConfig, ModelVersionPolicy, model_version_policy::PolicyChoice};

use crate::error::{Error, Result};
use crate::model_config::text;

/// The configured repository folders.
#[derive(Debug, Clone)]
pub struct Repository {
    roots: Vec<PathBuf>,
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
    pub fn new(roots: Vec<PathBuf>) -> Self {
        Repository { roots }
    }

    /// Every model folder in every repository, by name. A name found in more
    /// than one repository maps to an error, so that model alone fails.
    pub fn scan(&self) -> Result<BTreeMap<String, Result<PathBuf>>> {
        let mut models: BTreeMap<String, Result<PathBuf>> = BTreeMap::new();
        for root in &self.roots {
            let entries = std::fs::read_dir(root)
                .map_err(|e| Error::internal(format!("failed to read model repository '{}': {e}", root.display())))?;
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with('.') || !entry.path().is_dir() {
                    continue;
                }
                let path = entry.path();
                match models.get(&name) {
                    Some(Ok(first)) => {
                        let message = format!(
                            "model appears in two or more repositories: '{}' and '{}'",
                            first.display(),
                            path.display()
                        );
                        models.insert(name, Err(Error::invalid(message)));
                    }
                    Some(Err(_)) => {}
                    None => {
                        models.insert(name, Ok(path));
                    }
                }
            }
        }
        Ok(models)
    }

    /// The folder of one model.
    pub fn locate(&self, name: &str) -> Result<PathBuf> {
        match self.scan()?.remove(name) {
            Some(found) => found,
            None => Err(Error::not_found(format!(
                "failed to load '{name}', failed to poll from model repository: no model folder named '{name}'"
            ))),
        }
    }
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

    #[test]
    fn reads_a_model_folder() {
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
        let repo = Repository::new(vec![root.clone()]);
        assert!(repo.scan().unwrap().contains_key("m"));
        assert!(repo.locate("nope").is_err());
        std::fs::remove_dir_all(root).unwrap();
    }
}
