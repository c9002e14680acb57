//! The stub's Python sources, compiled into the server so that the binary
//! is all an image needs: written once to a private folder named by their
//! contents, shared by every server of this user with the same sources.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use nereid_core::error::{Error, Result};

/// (file name, contents)
const FILES: &[(&str, &str)] = &[
    ("nereid_stub.py", include_str!("../stub/nereid_stub.py")),
    ("nereid_stub_shm.py", include_str!("../stub/nereid_stub_shm.py")),
    (
        "triton_python_backend_utils.py",
        include_str!("../stub/triton_python_backend_utils.py"),
    ),
];

static DIR: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();

/// The folder holding the stub, written on first use.
pub fn dir() -> Result<PathBuf> {
    DIR.get_or_init(|| write().map_err(|e| format!("failed to write the Python stub's files: {e}")))
        .clone()
        .map_err(Error::unavailable)
}

fn write() -> std::io::Result<PathBuf> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    FILES.hash(&mut hasher);
    let uid = crate::user_id()?;
    let dir = std::env::temp_dir().join(format!("nereid-python-stub-{uid}-{:016x}", hasher.finish()));
    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // Someone else's folder, or one others may write to, is not ours to run.
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o077 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is not a private folder of this user",
            dir.display()
        )));
    }
    for (name, contents) in FILES {
        write_if_changed(&dir.join(name), contents)?;
    }
    Ok(dir)
}

/// Replaces the file atomically unless it already holds `contents`: two
/// servers starting together never see half a file.
fn write_if_changed(path: &Path, contents: &str) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|have| have == contents.as_bytes()) {
        return Ok(());
    }
    let temporary = path.with_extension(format!("tmp{}", std::process::id()));
    let mut file = std::fs::File::create(&temporary)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()?;
    std::fs::rename(&temporary, path)
}
