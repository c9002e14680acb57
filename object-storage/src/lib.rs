//! A model repository in object storage: S3 (`s3://bucket/path`), Google
//! Cloud Storage (`gs://bucket/path`) and Azure (`as://account/container/path`,
//! Triton's spelling, or `az://container/path`).
//!
//! A model is fetched into a local cache folder each time it is loaded, then
//! loaded from there like any local model, so a reload picks up new files
//! and ONNX Runtime reads a real file. Each object is downloaded once and
//! reused while the store lists it unchanged ([`fetch_cache`]), streamed to
//! disk, never held whole in memory. Credentials and endpoints come from the environment
//! the usual way for each store (`AWS_ACCESS_KEY_ID`, `AWS_ENDPOINT_URL`,
//! `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_KEY`, ...), which is also
//! how the Kubernetes operator passes a Secret. Each store reads only its own
//! variables, through object_store's `from_env` (`AWS_*` for s3://,
//! `GOOGLE_*` and `SERVICE_ACCOUNT` for gs://, `AZURE_*` and the managed
//! identity endpoint for Azure): a generic name in the environment
//! (`ENDPOINT`, `TOKEN`) never changes how a store is reached.
//!
//! The core reads repositories through its `ObjectStorage` trait; the
//! binary plugs [`open`] in, so only this crate depends on object_store.

pub mod fetch_cache;
pub mod progress;

use std::path::{Path as LocalPath, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::TryStreamExt;
use futures::future::BoxFuture;
use object_store::ObjectStore;
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::path::Path;

use fetch_cache::{FetchCache, Obtained};
pub use progress::FetchProgress;

use nereid_core::error::{Error, Result};
use nereid_core::repository::ObjectStorage;

/// Opens `url` as a model repository cached under `cache`: what the core's
/// `repository::plug_in` takes.
pub fn open(url: &str, cache: PathBuf) -> Result<Arc<dyn ObjectStorage>> {
    Ok(Arc::new(RemoteRoot::parse(url, cache)?))
}

impl ObjectStorage for RemoteRoot {
    fn url(&self) -> &str {
        &self.url
    }

    fn model_names(&self) -> BoxFuture<'_, Result<Vec<String>>> {
        Box::pin(RemoteRoot::model_names(self))
    }

    fn fetch<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<PathBuf>> {
        Box::pin(RemoteRoot::fetch(self, name))
    }

    fn fingerprint<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<String>> {
        Box::pin(RemoteRoot::fingerprint(self, name))
    }
}

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
        // Triton's Azure form names the account first.
        let (url_for_store, azure_account) = match url.strip_prefix("as://") {
            Some(rest) => {
                let (account, path) = rest
                    .split_once('/')
                    .ok_or_else(|| bad("expected as://account/container/path".into()))?;
                (format!("az://{path}"), Some(account))
            }
            None => (url.to_string(), None),
        };
        let parsed = url::Url::parse(&url_for_store).map_err(|e| bad(e.to_string()))?;
        // Each store's own `from_env` reads only its variables; what the URL
        // says is applied after them, so it wins.
        let store: Arc<dyn ObjectStore> = match parsed.scheme() {
            "s3" => Arc::new(
                AmazonS3Builder::from_env()
                    .with_url(url_for_store.as_str())
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            "gs" => Arc::new(
                GoogleCloudStorageBuilder::from_env()
                    .with_url(url_for_store.as_str())
                    .build()
                    .map_err(|e| bad(e.to_string()))?,
            ),
            "az" => {
                let mut builder = MicrosoftAzureBuilder::from_env().with_url(url_for_store.as_str());
                if let Some(account) = azure_account {
                    builder = builder.with_account(account);
                }
                Arc::new(builder.build().map_err(|e| bad(e.to_string()))?)
            }
            _ => return Err(bad("supported schemes are s3://, gs:// and as:// (or az://)".into())),
        };
        let prefix = Path::from_url_path(parsed.path()).map_err(|e| bad(e.to_string()))?;
        Ok(Self::with_store(url, store, prefix, cache))
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

    /// Fetches the model folder `name` to `destination`: each object from
    /// the fetch cache beside it (`.objects` in the same folder), downloaded
    /// only when the cache lacks it. The copy is built beside `destination`
    /// from links to the cached objects and swapped in, so a failed fetch
    /// never leaves a half-written model behind, and two processes fetching
    /// the same model take turns at the swap.
    pub async fn fetch_to(&self, name: &str, destination: &LocalPath) -> Result<()> {
        self.fetch_reporting(name, destination, None).await
    }

    /// [`Self::fetch_to`], counting the folder's bytes as they come in
    /// `progress` (those the cache holds count at once).
    pub async fn fetch_reporting(
        &self,
        name: &str,
        destination: &LocalPath,
        progress: Option<Arc<FetchProgress>>,
    ) -> Result<()> {
        let model_prefix = self.prefix.clone().join(name);
        let objects = self.list_model(name).await?;
        if let Some(progress) = &progress {
            progress.set_total(objects.iter().map(|o| o.size).sum());
        }
        let parent = destination.parent().unwrap_or(LocalPath::new("."));
        let cache = FetchCache::in_folder(parent).reporting(progress);
        let in_use = cache.use_it().await?;
        let folder = destination
            .file_name()
            .map_or_else(|| name.into(), |n| n.to_string_lossy());
        let staging = parent.join(format!(
            ".{folder}{}{}-{}",
            fetch_cache::STAGING_MARK,
            std::process::id(),
            STAGING.fetch_add(1, Ordering::Relaxed)
        ));
        let listing = self.listing_digest(&objects);
        let built = self.build(&cache, &objects, &model_prefix, &staging).await;
        let placed = match built {
            Ok(counts) => place(&cache, &folder, &listing, &staging, destination)
                .await
                .map(|()| counts),
            Err(e) => Err(e),
        };
        if placed.is_err() {
            let _ = tokio::fs::remove_dir_all(&staging).await;
        }
        let (reused, downloaded) = placed?;
        drop(in_use);
        tracing::info!(model = name, reused, downloaded, "fetched from {}", self.url);
        if let Err(e) = cache.collect_garbage().await {
            tracing::warn!(error = %e, "the fetch cache could not be cleaned up");
        }
        Ok(())
    }

    /// The model folder's listing hashed: each object's path, size, ETag and
    /// time of change, as the fetch cache names its blobs. One LIST, no GET.
    pub async fn fingerprint(&self, name: &str) -> Result<String> {
        Ok(self.listing_digest(&self.list_model(name).await?))
    }

    fn listing_digest(&self, objects: &[object_store::ObjectMeta]) -> String {
        let mut keys: Vec<String> = objects
            .iter()
            .map(|object| FetchCache::key(&self.url, object))
            .collect();
        keys.sort();
        fetch_cache::digest(keys.join("\n").as_bytes())
    }

    /// Every object under the model's folder; not found when there is none.
    async fn list_model(&self, name: &str) -> Result<Vec<object_store::ObjectMeta>> {
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
        Ok(objects)
    }

    /// Builds the model folder in `staging` from the cached objects; returns
    /// how many were reused and how many downloaded.
    async fn build(
        &self,
        cache: &FetchCache,
        objects: &[object_store::ObjectMeta],
        model_prefix: &Path,
        staging: &LocalPath,
    ) -> Result<(usize, usize)> {
        create_dir(staging).await?;
        let (mut reused, mut downloaded) = (0, 0);
        for object in objects {
            let Some(relative) = object.location.prefix_match(model_prefix) else {
                continue;
            };
            let relative: Vec<String> = relative.map(|part| part.as_ref().to_string()).collect();
            if relative.iter().any(|p| p == ".." || p.is_empty()) {
                continue;
            }
            let target = relative
                .iter()
                .fold(staging.to_path_buf(), |path, part| path.join(part));
            if let Some(parent) = target.parent() {
                create_dir(parent).await?;
            }
            let (blob, how) = cache.obtain(self.store.as_ref(), &self.url, object).await?;
            match how {
                Obtained::Reused => reused += 1,
                Obtained::Downloaded => downloaded += 1,
            }
            tokio::fs::hard_link(&blob, &target).await.map_err(|e| {
                Error::internal(format!(
                    "failed to link '{}' to '{}': {e}",
                    blob.display(),
                    target.display()
                ))
            })?;
        }
        Ok((reused, downloaded))
    }
}

/// Numbers this process's staging folders.
static STAGING: AtomicU64 = AtomicU64::new(0);

/// Swaps the built folder in for `destination`, holding the model's lock.
/// Swaps the folder built in `staging` in at `destination`, unless
/// `destination` already holds the same listing: another server sharing the
/// cache folder may be loading from it, and a swap under its feet would show
/// it a model folder with no versions.
async fn place(
    cache: &FetchCache,
    folder: &str,
    listing: &str,
    staging: &LocalPath,
    destination: &LocalPath,
) -> Result<()> {
    let _turn = cache.lock_model(folder).await?;
    if cache.placed_listing(folder).await.as_deref() == Some(listing) && destination.is_dir() {
        let _ = tokio::fs::remove_dir_all(staging).await;
        return Ok(());
    }
    cache.forget_listing(folder).await;
    let _ = tokio::fs::remove_dir_all(destination).await;
    tokio::fs::rename(staging, destination).await.map_err(|e| {
        Error::internal(format!(
            "failed to place model '{folder}' at '{}': {e}",
            destination.display()
        ))
    })?;
    cache.record_listing(folder, listing).await;
    Ok(())
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

        // A fetch of an unchanged listing leaves the folder in place: a
        // server sharing the cache folder may be loading from it.
        let inode = |p: &LocalPath| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        let before = inode(&local);
        let local = root.fetch("simple").await.unwrap();
        assert_eq!(inode(&local), before);

        // A second fetch replaces the copy: removed files disappear.
        store.delete(&Path::from("repo/simple/1/model.onnx")).await.unwrap();
        let local = root.fetch("simple").await.unwrap();
        assert!(!local.join("1/model.onnx").exists());

        let err = root.fetch("missing").await.unwrap_err();
        assert!(err.message().contains("missing"), "{err}");
        std::fs::remove_dir_all(cache).unwrap();
    }

    #[tokio::test]
    async fn progress_counts_downloaded_and_cached_bytes() {
        let store = Arc::new(InMemory::new());
        store
            .put(&Path::from("repo/m/config.pbtxt"), PutPayload::from("name: \"m\""))
            .await
            .unwrap();
        store
            .put(&Path::from("repo/m/1/model.onnx"), PutPayload::from(vec![7u8; 100_000]))
            .await
            .unwrap();
        let cache = tempfile::tempdir().unwrap();
        let root = RemoteRoot::with_store("memory://repo", store, Path::from("repo"), cache.path().to_path_buf());
        let total = 100_000 + "name: \"m\"".len() as u64;
        for _ in 0..2 {
            // Downloaded the first time, from the cache the second: all of it either way.
            let progress = Arc::new(FetchProgress::new());
            root.fetch_reporting("m", &cache.path().join("m"), Some(Arc::clone(&progress)))
                .await
                .unwrap();
            assert_eq!(progress.snapshot(), (total, total));
        }
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
