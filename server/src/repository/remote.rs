//! A model repository in object storage: S3 (`s3://bucket/path`), Google
//! Cloud Storage (`gs://bucket/path`) and Azure (`as://account/container/path`,
//! Triton's spelling, or `az://container/path`).
//!
//! A model is fetched into a local cache folder each time it is loaded, then
//! loaded from there like any local model, so a reload picks up new files
//! and ONNX Runtime reads a real file; objects are streamed to disk, never
//! held whole in memory. Credentials and endpoints come from the environment
//! the usual way for each store (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`,
//! `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_KEY`, ...), which is also
//! how the Kubernetes operator passes a Secret. Only the variables of the
//! URL's own store are read (`AWS_*` for s3://, `GOOGLE_*` for gs://,
//! `AZURE_*` for Azure): a generic name in the environment (`ENDPOINT`,
//! `TOKEN`) never changes how a store is reached.

use std::path::{Path as LocalPath, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};

/// One object-storage repository root and where its models are cached.
#[derive(Debug, Clone)]
pub struct RemoteRoot {
    url: String,
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    cache: PathBuf,
}

impl RemoteRoot {
    /// Parses a repository URL; `cache` is this root's own local folder.
    pub fn parse(url: &str, cache: PathBuf) -> Result<Self> {
        let bad = |why: String| Error::invalid(format!("model repository '{url}': {why}"));
        let (url_for_store, mut options): (String, Vec<(String, String)>) = match url.strip_prefix("as://") {
            // Triton's Azure form names the account first.
            Some(rest) => {
                let (account, path) = rest
                    .split_once('/')
                    .ok_or_else(|| bad("expected as://account/container/path".into()))?;
                (
                    format!("az://{path}"),
                    vec![("azure_storage_account_name".into(), account.into())],
                )
            }
            None => (url.to_string(), Vec::new()),
        };
        let parsed = url::Url::parse(&url_for_store).map_err(|e| bad(e.to_string()))?;
        let prefix = match parsed.scheme() {
            "s3" => "aws_",
            "gs" => "google_",
            "az" => "azure_",
            _ => return Err(bad("supported schemes are s3://, gs:// and as:// (or az://)".into())),
        };
        options.extend(store_options(prefix, std::env::vars()));
        let (store, prefix) = object_store::parse_url_opts(&parsed, options).map_err(|e| bad(e.to_string()))?;
        Ok(Self::with_store(url, Arc::from(store), prefix, cache))
    }

    /// A root over an existing store (tests use an in-memory one).
    pub fn with_store(url: &str, store: Arc<dyn ObjectStore>, prefix: Path, cache: PathBuf) -> Self {
        RemoteRoot {
            url: url.to_string(),
            store,
            prefix,
            cache,
        }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) -> Error {
        Error::unavailable(format!("model repository '{}': failed to {what}: {e}", self.url))
    }

    /// The model folders directly under the prefix.
    pub async fn model_names(&self) -> Result<Vec<String>> {
        let listing = self
            .store
            .list_with_delimiter(Some(&self.prefix))
            .await
            .map_err(|e| self.failed("list models", e))?;
        Ok(listing
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .filter(|name| !name.starts_with('.'))
            .collect())
    }

    /// Downloads one model folder into the cache and returns its local path.
    pub async fn fetch(&self, name: &str) -> Result<PathBuf> {
        let destination = self.cache.join(name);
        self.fetch_to(name, &destination).await?;
        Ok(destination)
    }

    /// Downloads the model folder `name` to `destination`. The copy is built
    /// beside it and swapped in, so a failed download never leaves a
    /// half-written model behind.
    pub async fn fetch_to(&self, name: &str, destination: &LocalPath) -> Result<()> {
        let model_prefix = self.prefix.clone().join(name);
        let objects: Vec<_> = self
            .store
            .list(Some(&model_prefix))
            .try_collect()
            .await
            .map_err(|e| self.failed(&format!("list model '{name}'"), e))?;
        if objects.is_empty() {
            return Err(Error::not_found(format!(
                "failed to load '{name}', failed to poll from model repository: nothing under '{}/{name}'",
                self.url
            )));
        }
        let parent = destination.parent().unwrap_or(LocalPath::new("."));
        let staging = parent.join(format!(".{name}.partial"));
        let _ = tokio::fs::remove_dir_all(&staging).await;
        for object in objects {
            let Some(relative) = object.location.prefix_match(&model_prefix) else {
                continue;
            };
            let relative: Vec<String> = relative.map(|part| part.as_ref().to_string()).collect();
            if relative.iter().any(|p| p == ".." || p.is_empty()) {
                continue;
            }
            let target = relative.iter().fold(staging.clone(), |path, part| path.join(part));
            if let Some(parent) = target.parent() {
                create_dir(parent).await?;
            }
            self.download(&object.location, &target).await?;
        }
        let _ = tokio::fs::remove_dir_all(destination).await;
        tokio::fs::rename(&staging, destination).await.map_err(|e| {
            Error::internal(format!(
                "failed to place model '{name}' at '{}': {e}",
                destination.display()
            ))
        })?;
        Ok(())
    }
}

impl RemoteRoot {
    /// Streams one object into a new file, chunk by chunk.
    async fn download(&self, location: &Path, target: &LocalPath) -> Result<()> {
        let failed = |e: &dyn std::fmt::Display| self.failed(&format!("download '{location}'"), e);
        let write_failed = |e: std::io::Error| Error::internal(format!("failed to write '{}': {e}", target.display()));
        let mut chunks = self.store.get(location).await.map_err(|e| failed(&e))?.into_stream();
        let mut file = tokio::fs::File::create(target).await.map_err(write_failed)?;
        while let Some(chunk) = chunks.try_next().await.map_err(|e| failed(&e))? {
            file.write_all(&chunk).await.map_err(write_failed)?;
        }
        file.flush().await.map_err(write_failed)
    }
}

/// The environment variables one store reads, as object_store options
/// (lower-case keys), for variables named `<prefix>...` only.
fn store_options(prefix: &str, vars: impl Iterator<Item = (String, String)>) -> Vec<(String, String)> {
    vars.map(|(k, v)| (k.to_ascii_lowercase(), v))
        .filter(|(k, _)| k.starts_with(prefix))
        .collect()
}

async fn create_dir(path: &LocalPath) -> Result<()> {
    tokio::fs::create_dir_all(path)
        .await
        .map_err(|e| Error::internal(format!("failed to create '{}': {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;
    use object_store::{ObjectStoreExt, PutPayload};

    #[tokio::test]
    async fn lists_and_fetches_models() {
        let store = Arc::new(InMemory::new());
        for (path, data) in [
            ("repo/simple/config.pbtxt", "name: \"simple\""),
            ("repo/simple/1/model.onnx", "onnx"),
            ("repo/other/1/x", "x"),
            ("elsewhere/nope/1/x", "x"),
        ] {
            store.put(&Path::from(path), PutPayload::from(data)).await.unwrap();
        }
        let cache = std::env::temp_dir().join(format!("nereid-remote-test-{}", std::process::id()));
        let root = RemoteRoot::with_store("memory://repo", store.clone(), Path::from("repo"), cache.clone());
        let mut names = root.model_names().await.unwrap();
        names.sort();
        assert_eq!(names, vec!["other", "simple"]);

        let local = root.fetch("simple").await.unwrap();
        assert_eq!(
            std::fs::read_to_string(local.join("config.pbtxt")).unwrap(),
            "name: \"simple\""
        );
        assert_eq!(std::fs::read_to_string(local.join("1/model.onnx")).unwrap(), "onnx");

        // A second fetch replaces the copy: removed files disappear.
        store.delete(&Path::from("repo/simple/1/model.onnx")).await.unwrap();
        let local = root.fetch("simple").await.unwrap();
        assert!(!local.join("1/model.onnx").exists());

        let err = root.fetch("missing").await.unwrap_err();
        assert!(err.message().contains("missing"), "{err}");
        std::fs::remove_dir_all(cache).unwrap();
    }

    #[test]
    fn only_the_stores_own_variables_become_options() {
        let vars = [
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9000"),
            ("ENDPOINT", "http://evil"),
            ("TOKEN", "t"),
            ("GOOGLE_SERVICE_ACCOUNT", "/sa.json"),
            ("PATH", "/bin"),
        ]
        .map(|(k, v)| (k.to_string(), v.to_string()));
        let s3 = store_options("aws_", vars.clone().into_iter());
        assert_eq!(
            s3,
            vec![("aws_endpoint_url".to_string(), "http://127.0.0.1:9000".to_string())]
        );
        let gs = store_options("google_", vars.into_iter());
        assert_eq!(gs, vec![("google_service_account".to_string(), "/sa.json".to_string())]);
    }

    #[test]
    fn parses_urls() {
        let cache = std::env::temp_dir();
        assert!(RemoteRoot::parse("s3://bucket/models", cache.clone()).is_ok());
        assert!(RemoteRoot::parse("gs://bucket/models", cache.clone()).is_ok());
        assert!(RemoteRoot::parse("as://account/container/models", cache.clone()).is_ok());
        let err = RemoteRoot::parse("ftp://host/models", cache.clone()).unwrap_err();
        assert!(err.message().contains("supported schemes"), "{err}");
        assert!(RemoteRoot::parse("as://account-only", cache).is_err());
    }
}
