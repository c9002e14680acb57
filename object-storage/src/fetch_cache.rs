//! The fetch cache: each object of a model folder is downloaded once, into
//! `CACHE/.objects/`, under a name made from what identifies its contents in
//! the store (the repository, the object's path, its size, ETag and time of
//! change), and hard-linked into the model folders built from it. A load
//! whose objects did not change in the store reuses them without a GET, and
//! so does a restart given the same `--model-cache-dir`.
//!
//! Several processes may share one cache folder:
//! - a download is written under a name of its own (`KEY.tmp-PID-N`),
//!   verified (its size, and its MD5 where the store's ETag is one: S3's
//!   single-part uploads), synced, made read-only and renamed into place,
//!   so a blob is either whole or absent;
//! - a lock per blob (`KEY.lock`, flock) lets one process download it
//!   while the others wait and then reuse it;
//! - a model folder is swapped in under a lock per model, and only when
//!   the listing it was built from differs from the one last placed there
//!   (`.model-NAME.listing`): a server loading from it never sees it go;
//! - every fetch holds `.gc.lock` shared; the clean-up that follows a fetch
//!   runs only if it gets that lock exclusively (nobody is fetching), and
//!   removes the blobs no model folder links any more (link count 1), the
//!   leftovers of downloads that died, and their locks. That bounds the
//!   folder to the models it holds.
//!
//! A download that fails on the way (the connection, a truncated body, a
//! checksum that does not match) is tried again, up to [`ATTEMPTS`] times
//! with a growing pause; a permanent error (not found, access denied) is
//! not. Large objects log their progress.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path as LocalPath, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::TryStreamExt;
use md5::{Digest, Md5};
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use nereid_core::error::{Error, Result};

use crate::progress::FetchProgress;

/// Tries per object before its load fails.
pub const ATTEMPTS: u32 = 4;
/// The pause after the first failed try; doubled after each.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// Objects at least this large log their progress.
const PROGRESS_FROM_BYTES: u64 = 64 << 20;
/// How often a large download logs its progress.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);
/// A download's bytes go to its writer thread in batches of about this
/// many...
const WRITE_BATCH_BYTES: usize = 1 << 20;
/// ...and at most this many batches wait for it: a download holds at most
/// 8 MiB in memory however fast the store sends.
const WRITE_QUEUE: usize = 8;
/// Each time a download has written this much more, a thread of its own
/// asks the disk to write back what it has so far (`fdatasync`), so that
/// the sync before the blob is renamed into place finds little left: for a
/// 200 MiB model, 0.2 s of waiting became a few milliseconds (bench log 29).
const WRITEBACK_EVERY: u64 = 16 << 20;

/// The folder under the cache that holds the blobs.
const OBJECTS: &str = ".objects";
/// In the name of a model folder a fetch is building beside the cache:
/// `.<model>.partial-<pid>-<n>` ([`crate::ObjectStorage::fetch_to`]).
pub(crate) const STAGING_MARK: &str = ".partial-";
const GC_LOCK: &str = ".gc.lock";

/// Numbers the temporary files of this process.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// The blobs of one cache folder.
#[derive(Debug, Clone)]
pub struct FetchCache {
    dir: PathBuf,
    /// Where the bytes obtained are counted, when someone reports them.
    progress: Option<Arc<FetchProgress>>,
}

/// Whether a blob came from the cache or from the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Obtained {
    Reused,
    Downloaded,
}

/// Held while a fetch uses the cache: no clean-up runs meanwhile.
#[derive(Debug)]
pub struct InUse(#[allow(dead_code)] std::fs::File);

impl FetchCache {
    /// The cache of model folders kept in `folder`.
    pub fn in_folder(folder: &LocalPath) -> Self {
        FetchCache {
            dir: folder.join(OBJECTS),
            progress: None,
        }
    }

    /// Counts every byte it obtains (reused or downloaded) in `progress`.
    pub fn reporting(mut self, progress: Option<Arc<FetchProgress>>) -> Self {
        self.progress = progress;
        self
    }

    fn count(&self, bytes: u64) {
        if let Some(progress) = &self.progress {
            progress.add(bytes);
        }
    }

    /// Creates the folder if needed and marks the cache in use until the
    /// returned guard drops.
    pub async fn use_it(&self) -> Result<InUse> {
        tokio::fs::create_dir_all(&self.dir)
            .await
            .map_err(|e| local_error("create", &self.dir, e))?;
        let path = self.dir.join(GC_LOCK);
        let file = blocking(move || {
            let file = lock_file(&path)?;
            file.lock_shared().map_err(|e| local_error("lock", &path, e))?;
            Ok(file)
        })
        .await?;
        Ok(InUse(file))
    }

    /// Held while the model folder `folder` beside this cache is replaced.
    pub async fn lock_model(&self, folder: &str) -> Result<std::fs::File> {
        let path = self.dir.join(format!(".model-{folder}.lock"));
        blocking(move || {
            let file = lock_file(&path)?;
            file.lock().map_err(|e| local_error("lock", &path, e))?;
            Ok(file)
        })
        .await
    }

    /// The listing digest of what [`Self::lock_model`]'s holder last placed
    /// at the model folder `folder`; none when unknown. Read under that lock.
    pub async fn placed_listing(&self, folder: &str) -> Option<String> {
        tokio::fs::read_to_string(self.listing_path(folder)).await.ok()
    }

    /// Forgets the placed listing before the folder is replaced, so that a
    /// process dying half-way leaves a folder no listing claims.
    pub async fn forget_listing(&self, folder: &str) {
        let _ = tokio::fs::remove_file(self.listing_path(folder)).await;
    }

    /// Records the listing just placed at `folder`. A failure only costs the
    /// next fetch a swap.
    pub async fn record_listing(&self, folder: &str, listing: &str) {
        let path = self.listing_path(folder);
        if let Err(e) = tokio::fs::write(&path, listing).await {
            tracing::warn!(error = %e, "could not record '{}'", path.display());
        }
    }

    fn listing_path(&self, folder: &str) -> PathBuf {
        self.dir.join(format!(".model-{folder}.listing"))
    }

    /// The blob's name: what identifies the object's contents in the store.
    pub fn key(repository: &str, meta: &ObjectMeta) -> String {
        let identity = format!(
            "{repository}\n{}\n{}\n{}\n{}",
            meta.location,
            meta.size,
            meta.e_tag.as_deref().unwrap_or(""),
            meta.last_modified.timestamp_nanos_opt().unwrap_or_default()
        );
        digest(identity.as_bytes())
    }

    /// The object's blob, downloaded unless a whole one is already cached.
    /// Call with the cache in use ([`FetchCache::use_it`]).
    pub async fn obtain(
        &self,
        store: &dyn ObjectStore,
        repository: &str,
        meta: &ObjectMeta,
    ) -> Result<(PathBuf, Obtained)> {
        let key = Self::key(repository, meta);
        let blob = self.dir.join(&key);
        if is_whole(&blob, meta.size).await {
            self.count(meta.size);
            return Ok((blob, Obtained::Reused));
        }
        let lock_path = self.dir.join(format!("{key}.lock"));
        let _lock = blocking(move || {
            let file = lock_file(&lock_path)?;
            file.lock().map_err(|e| local_error("lock", &lock_path, e))?;
            Ok(file)
        })
        .await?;
        // Another process may have downloaded it while this one waited.
        if is_whole(&blob, meta.size).await {
            self.count(meta.size);
            return Ok((blob, Obtained::Reused));
        }
        let expected_md5 = md5_of(repository, meta);
        let mut pause = FIRST_PAUSE;
        for attempt in 1..=ATTEMPTS {
            match self.download(store, meta, &key, expected_md5.as_deref()).await {
                Ok(temporary) => {
                    tokio::fs::rename(&temporary, &blob)
                        .await
                        .map_err(|e| local_error("place", &blob, e))?;
                    return Ok((blob, Obtained::Downloaded));
                }
                Err(Failure::Permanent(e)) => return Err(e),
                Err(Failure::Transient(e)) if attempt == ATTEMPTS => return Err(e),
                Err(Failure::Transient(e)) => {
                    tracing::warn!(object = %meta.location, attempt, error = %e, "download failed; trying again");
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
        unreachable!("the last attempt returns")
    }

    /// Streams the object into a temporary file of its own, checks it and
    /// returns that file, read-only and synced.
    async fn download(
        &self,
        store: &dyn ObjectStore,
        meta: &ObjectMeta,
        key: &str,
        expected_md5: Option<&str>,
    ) -> std::result::Result<PathBuf, Failure> {
        let temporary = self.dir.join(format!(
            "{key}.tmp-{}-{}",
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        ));
        let mut counted = 0;
        let result = self
            .download_to(store, meta, &temporary, expected_md5, &mut counted)
            .await;
        if result.is_err() {
            let _ = tokio::fs::remove_file(&temporary).await;
            if let Some(progress) = &self.progress {
                progress.rewind(counted);
            }
        }
        result.map(|()| temporary)
    }

    /// Receives on the runtime and hands the bytes, in batches of about
    /// [`WRITE_BATCH_BYTES`], to a blocking thread that hashes, writes and
    /// syncs them ([`write_blob`]): receiving the next bytes overlaps the
    /// MD5 and the disk, and the disk's write-back overlaps both
    /// ([`WRITEBACK_EVERY`]). Writing each chunk from the runtime (tokio's file)
    /// cost a blocking-pool round trip per 16 KiB chunk, and put the MD5 on
    /// the receiving thread (bench log 27).
    async fn download_to(
        &self,
        store: &dyn ObjectStore,
        meta: &ObjectMeta,
        temporary: &LocalPath,
        expected_md5: Option<&str>,
        counted: &mut u64,
    ) -> std::result::Result<(), Failure> {
        let location = &meta.location;
        let store_failed = |e: object_store::Error| Failure::from_store(location, e);
        let mut chunks = store.get(location).await.map_err(store_failed)?.into_stream();
        let (batches, received) = tokio::sync::mpsc::channel::<Vec<bytes::Bytes>>(WRITE_QUEUE);
        let path = temporary.to_path_buf();
        let hash = expected_md5.is_some();
        let writer = tokio::task::spawn_blocking(move || write_blob(&path, received, hash));
        let mut batch = Vec::new();
        let mut batched = 0usize;
        let mut sent: u64 = 0;
        let started = Instant::now();
        let mut next_report = started + PROGRESS_EVERY;
        let received = async {
            while let Some(chunk) = chunks.try_next().await.map_err(store_failed)? {
                batched += chunk.len();
                sent += chunk.len() as u64;
                *counted += chunk.len() as u64;
                self.count(chunk.len() as u64);
                batch.push(chunk);
                if batched >= WRITE_BATCH_BYTES {
                    batched = 0;
                    // A writer that stopped says why below.
                    if batches.send(std::mem::take(&mut batch)).await.is_err() {
                        break;
                    }
                }
                if meta.size >= PROGRESS_FROM_BYTES && Instant::now() >= next_report {
                    next_report += PROGRESS_EVERY;
                    let seconds = started.elapsed().as_secs_f64();
                    tracing::info!(
                        object = %location,
                        "fetching: {:.1} of {:.1} MiB ({:.0} %), {:.1} MiB/s",
                        sent as f64 / MIB,
                        meta.size as f64 / MIB,
                        sent as f64 * 100.0 / meta.size as f64,
                        sent as f64 / MIB / seconds.max(1e-3)
                    );
                }
            }
            if !batch.is_empty() {
                let _ = batches.send(batch).await;
            }
            Ok::<(), Failure>(())
        }
        .await;
        // The writer ends when the channel closes, with what it wrote.
        drop(batches);
        let written = writer
            .await
            .map_err(|e| Failure::Permanent(Error::internal(format!("the fetch cache's writer failed: {e}"))))?
            .map_err(|e| Failure::Permanent(local_error("write", temporary, e)));
        received?;
        let (written, md5) = written?;
        if written != meta.size {
            return Err(Failure::Transient(Error::unavailable(format!(
                "object '{location}' was {written} bytes, the store listed {}",
                meta.size
            ))));
        }
        if let (Some(expected), Some(md5)) = (expected_md5, md5) {
            let got = hex(&md5);
            if got != expected {
                return Err(Failure::Transient(Error::unavailable(format!(
                    "object '{location}' has MD5 {got}, its ETag says {expected}"
                ))));
            }
        }
        if meta.size >= PROGRESS_FROM_BYTES {
            tracing::info!(object = %location, "fetched {:.1} MiB in {:.1} s", meta.size as f64 / MIB, started.elapsed().as_secs_f64());
        }
        Ok(())
    }

    /// Removes what no model folder uses, and the folders fetches that died
    /// were building, if no fetch is under way (in this process or another);
    /// returns how many files and folders went.
    pub async fn collect_garbage(&self) -> Result<usize> {
        let dir = self.dir.clone();
        blocking(move || {
            let lock_path = dir.join(GC_LOCK);
            let lock = lock_file(&lock_path)?;
            if lock.try_lock().is_err() {
                return Ok(0);
            }
            let mut removed = 0;
            // A model folder a fetch was building when its process died
            // (`.<model>.partial-*`, beside this folder): no fetch is under
            // way, so none is being built. First, so that the blobs only
            // it linked go in the pass below.
            if let Some(models) = dir.parent() {
                for entry in std::fs::read_dir(models)
                    .map_err(|e| local_error("read", models, e))?
                    .flatten()
                {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    let staging = name.starts_with('.') && name.contains(STAGING_MARK);
                    if staging
                        && entry.file_type().is_ok_and(|t| t.is_dir())
                        && std::fs::remove_dir_all(entry.path()).is_ok()
                    {
                        removed += 1;
                    }
                }
            }
            let entries = std::fs::read_dir(&dir).map_err(|e| local_error("read", &dir, e))?;
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let unused = match name.split_once('.') {
                    // A blob: unused when only this folder links it.
                    None => entry.metadata().is_ok_and(|m| m.nlink() == 1),
                    // What a download that died left.
                    Some((key, rest)) => !key.is_empty() && rest.starts_with("tmp-"),
                };
                if unused && std::fs::remove_file(entry.path()).is_ok() {
                    removed += 1;
                }
            }
            // A blob's lock goes with it.
            for entry in std::fs::read_dir(&dir)
                .map_err(|e| local_error("read", &dir, e))?
                .flatten()
            {
                let name = entry.file_name().to_string_lossy().into_owned();
                if let Some(key) = name.strip_suffix(".lock")
                    && !key.is_empty()
                    && !key.starts_with('.')
                    && !dir.join(key).exists()
                    && std::fs::remove_file(entry.path()).is_ok()
                {
                    removed += 1;
                }
            }
            Ok(removed)
        })
        .await
    }
}

const MIB: f64 = (1u64 << 20) as f64;

/// Why one try failed, and whether another may succeed.
enum Failure {
    Transient(Error),
    Permanent(Error),
}

impl Failure {
    fn from_store(location: &object_store::path::Path, e: object_store::Error) -> Self {
        let permanent = matches!(
            e,
            object_store::Error::NotFound { .. }
                | object_store::Error::PermissionDenied { .. }
                | object_store::Error::Unauthenticated { .. }
        );
        let error = Error::unavailable(format!("failed to download '{location}': {e}"));
        if permanent {
            Failure::Permanent(error)
        } else {
            Failure::Transient(error)
        }
    }
}

/// The MD5 the object must have, where the store says: S3's ETag of a
/// single-part upload is the hex MD5 of the contents (a multipart one has a
/// `-N` suffix; GCS and Azure ETags are opaque).
fn md5_of(repository: &str, meta: &ObjectMeta) -> Option<String> {
    if !repository.starts_with("s3://") {
        return None;
    }
    let tag = meta.e_tag.as_deref()?.trim_matches('"');
    (tag.len() == 32 && tag.bytes().all(|b| b.is_ascii_hexdigit())).then(|| tag.to_ascii_lowercase())
}

/// A cached blob is whole when it has the listed size: it only ever appears
/// by a rename after its size and checksum were checked.
async fn is_whole(blob: &LocalPath, size: u64) -> bool {
    tokio::fs::metadata(blob)
        .await
        .is_ok_and(|m| m.is_file() && m.len() == size)
}

fn lock_file(path: &LocalPath) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| local_error("open", path, e))
}

/// Writes the batches it receives into a new file at `path`, hashing them
/// when `hash` (there is an MD5 to check them against: hashing 200 MiB
/// costs 0.3 s of CPU), then syncs the file and makes it read-only: the
/// blocking half of a download. Returns the bytes written and their MD5.
fn write_blob(
    path: &LocalPath,
    mut batches: tokio::sync::mpsc::Receiver<Vec<bytes::Bytes>>,
    hash: bool,
) -> std::io::Result<(u64, Option<Vec<u8>>)> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    let mut md5 = hash.then(Md5::new);
    let mut written = 0u64;
    std::thread::scope(|scope| {
        // Started at the first WRITEBACK_EVERY bytes: small blobs need none.
        let mut writeback: Option<std::sync::mpsc::SyncSender<()>> = None;
        let mut next_writeback = WRITEBACK_EVERY;
        while let Some(batch) = batches.blocking_recv() {
            for chunk in batch {
                if let Some(md5) = &mut md5 {
                    md5.update(&chunk);
                }
                file.write_all(&chunk)?;
                written += chunk.len() as u64;
            }
            if written >= next_writeback {
                next_writeback = written + WRITEBACK_EVERY;
                if writeback.is_none() {
                    let (kick, kicks) = std::sync::mpsc::sync_channel::<()>(1);
                    let syncing = file.try_clone()?;
                    // Its errors are the final sync's to report.
                    scope.spawn(move || kicks.iter().for_each(|()| drop(syncing.sync_data())));
                    writeback = Some(kick);
                }
                // One still running covers these bytes when it ends.
                if let Some(kick) = &writeback {
                    let _ = kick.try_send(());
                }
            }
        }
        drop(writeback);
        Ok::<(), std::io::Error>(())
    })?;
    file.sync_all()?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o444))?;
    Ok((written, md5.map(|md5| md5.finalize().to_vec())))
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::internal(format!("the fetch cache's worker failed: {e}")))?
}

fn local_error(what: &str, path: &LocalPath, e: std::io::Error) -> Error {
    Error::internal(format!("failed to {what} '{}': {e}", path.display()))
}

/// The hex MD5 of `bytes`: a name, not a defence (the store chooses what
/// it hashes).
pub(crate) fn digest(bytes: &[u8]) -> String {
    hex(&Md5::digest(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::PutPayload;
    use object_store::memory::InMemory;
    use object_store::path::Path;

    async fn meta(store: &InMemory, path: &str) -> ObjectMeta {
        store.head(&Path::from(path)).await.unwrap()
    }

    /// A cache in a new folder, marked in use.
    async fn cache_in_use() -> (tempfile::TempDir, FetchCache, InUse) {
        let folder = tempfile::tempdir().unwrap();
        let cache = FetchCache::in_folder(folder.path());
        let in_use = cache.use_it().await.unwrap();
        (folder, cache, in_use)
    }

    fn files(dir: &LocalPath) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with('.') && !n.ends_with(".lock"))
            .collect();
        names.sort();
        names
    }

    #[tokio::test]
    async fn an_object_is_downloaded_once_and_again_when_it_changes() {
        let store = InMemory::new();
        store
            .put(&Path::from("m/1/model.onnx"), PutPayload::from("one"))
            .await
            .unwrap();
        let (folder, cache, _in_use) = cache_in_use().await;

        let first = meta(&store, "m/1/model.onnx").await;
        let (blob, how) = cache.obtain(&store, "memory://", &first).await.unwrap();
        assert_eq!(how, Obtained::Downloaded);
        assert_eq!(std::fs::read_to_string(&blob).unwrap(), "one");
        assert!(std::fs::metadata(&blob).unwrap().permissions().readonly());
        let (again, how) = cache.obtain(&store, "memory://", &first).await.unwrap();
        assert_eq!((again.clone(), how), (blob.clone(), Obtained::Reused));

        // A changed object (new ETag and size) is another blob.
        store
            .put(&Path::from("m/1/model.onnx"), PutPayload::from("two!"))
            .await
            .unwrap();
        let second = meta(&store, "m/1/model.onnx").await;
        let (changed, how) = cache.obtain(&store, "memory://", &second).await.unwrap();
        assert_eq!(how, Obtained::Downloaded);
        assert_ne!(changed, blob);
        assert_eq!(std::fs::read_to_string(&changed).unwrap(), "two!");
        // Nothing half-written is left.
        assert_eq!(files(&folder.path().join(OBJECTS)).len(), 2);
    }

    #[tokio::test]
    async fn a_truncated_blob_is_not_reused() {
        let store = InMemory::new();
        store
            .put(&Path::from("m/x"), PutPayload::from("contents"))
            .await
            .unwrap();
        let (_folder, cache, _in_use) = cache_in_use().await;
        let object = meta(&store, "m/x").await;
        let (blob, _) = cache.obtain(&store, "memory://", &object).await.unwrap();
        std::fs::set_permissions(&blob, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::fs::write(&blob, "cont").unwrap();
        let (blob, how) = cache.obtain(&store, "memory://", &object).await.unwrap();
        assert_eq!(how, Obtained::Downloaded);
        assert_eq!(std::fs::read_to_string(blob).unwrap(), "contents");
    }

    #[tokio::test(start_paused = true)]
    async fn a_checksum_that_never_matches_fails_after_every_attempt() {
        let store = InMemory::new();
        store
            .put(&Path::from("m/x"), PutPayload::from("contents"))
            .await
            .unwrap();
        let (folder, cache, _in_use) = cache_in_use().await;
        let mut object = meta(&store, "m/x").await;
        object.e_tag = Some(format!("\"{}\"", "0".repeat(32)));
        let err = cache.obtain(&store, "s3://bucket/repo", &object).await.unwrap_err();
        assert!(err.message().contains("its ETag says 0000"), "{err}");
        assert!(files(&folder.path().join(OBJECTS)).is_empty());

        // The right MD5 passes.
        object.e_tag = Some(format!("\"{}\"", hex(&Md5::digest(b"contents"))));
        let (_, how) = cache.obtain(&store, "s3://bucket/repo", &object).await.unwrap();
        assert_eq!(how, Obtained::Downloaded);
    }

    /// A blob past the write-back size: written back while it downloads,
    /// whole, and checked against its MD5 (a wrong one still fails).
    #[tokio::test(start_paused = true)]
    async fn a_large_blob_is_written_back_as_it_comes_and_checked() {
        let contents: Vec<u8> = (0..(WRITEBACK_EVERY as usize * 2 + 12_345))
            .map(|i| (i % 251) as u8)
            .collect();
        let store = InMemory::new();
        store
            .put(&Path::from("m/big"), PutPayload::from(contents.clone()))
            .await
            .unwrap();
        let (_folder, cache, _in_use) = cache_in_use().await;
        let mut object = meta(&store, "m/big").await;
        object.e_tag = Some(format!("\"{}\"", hex(&Md5::digest(&contents))));
        let (blob, how) = cache.obtain(&store, "s3://bucket/repo", &object).await.unwrap();
        assert_eq!(how, Obtained::Downloaded);
        assert!(std::fs::read(&blob).unwrap() == contents);

        let (_folder, cache, _in_use) = cache_in_use().await;
        object.e_tag = Some(format!("\"{}\"", hex(&Md5::digest(b"something else"))));
        let err = cache.obtain(&store, "s3://bucket/repo", &object).await.unwrap_err();
        assert!(err.message().contains("its ETag says"), "{err}");
    }

    #[tokio::test]
    async fn a_missing_object_fails_at_once() {
        let store = InMemory::new();
        store
            .put(&Path::from("m/x"), PutPayload::from("contents"))
            .await
            .unwrap();
        let object = meta(&store, "m/x").await;
        store.delete(&Path::from("m/x")).await.unwrap();
        let (_folder, cache, _in_use) = cache_in_use().await;
        let started = Instant::now();
        let err = cache.obtain(&store, "memory://", &object).await.unwrap_err();
        assert!(err.message().contains("m/x"), "{err}");
        assert!(started.elapsed() < FIRST_PAUSE, "a permanent error is not retried");
    }

    #[tokio::test]
    async fn clean_up_waits_for_fetches_and_keeps_linked_blobs() {
        let store = InMemory::new();
        store
            .put(&Path::from("m/kept"), PutPayload::from("kept"))
            .await
            .unwrap();
        store
            .put(&Path::from("m/dropped"), PutPayload::from("dropped"))
            .await
            .unwrap();
        let (folder, cache, in_use) = cache_in_use().await;
        let (kept, _) = cache
            .obtain(&store, "memory://", &meta(&store, "m/kept").await)
            .await
            .unwrap();
        let (dropped, _) = cache
            .obtain(&store, "memory://", &meta(&store, "m/dropped").await)
            .await
            .unwrap();
        std::fs::hard_link(&kept, folder.path().join("model-file")).unwrap();
        std::fs::write(folder.path().join(OBJECTS).join("abc.tmp-1-1"), "left by a crash").unwrap();
        // A model folder a crashed fetch was building links the other blob.
        let staging = folder.path().join(format!(".m{STAGING_MARK}99-0"));
        std::fs::create_dir_all(staging.join("1")).unwrap();
        std::fs::hard_link(&dropped, staging.join("1").join("dropped")).unwrap();

        // While a fetch uses the cache, nothing is removed.
        assert_eq!(cache.collect_garbage().await.unwrap(), 0);
        assert!(staging.exists());
        drop(in_use);
        // Then the staging folder, the blob only it linked, that blob's lock
        // and the leftover go; the linked blob and its lock stay.
        assert_eq!(cache.collect_garbage().await.unwrap(), 4);
        assert!(!staging.exists());
        assert!(
            folder
                .path()
                .join(OBJECTS)
                .join(format!("{}.lock", kept.file_name().unwrap().to_string_lossy()))
                .exists()
        );
        assert!(kept.exists());
        assert!(!dropped.exists());
        assert_eq!(
            files(&folder.path().join(OBJECTS)),
            vec![kept.file_name().unwrap().to_string_lossy()]
        );
    }
}
