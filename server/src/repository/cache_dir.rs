//! The default model cache: a new folder only this process can use.
//!
//! A predictable path under /tmp (say `nereid-model-cache-<pid>`) lets
//! another local user create it first, or plant a symlink there, and so
//! choose what the server loads as a model. The folder is therefore created
//! fresh, with an unguessable name and mode 0700; creation fails rather than
//! reuse anything that already exists.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::PathBuf;

/// Creates `<tmp>/nereid-model-cache-<random>` with mode 0700.
pub fn private_temp() -> io::Result<PathBuf> {
    let base = std::env::temp_dir();
    for _ in 0..16 {
        let path = base.join(format!("nereid-model-cache-{:016x}", random()));
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "could not find a free name for the model cache folder",
    ))
}

/// 64 random bits: std's hasher keys come from the OS's random source.
fn random() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn each_folder_is_new_and_private() {
        let a = private_temp().unwrap();
        let b = private_temp().unwrap();
        assert_ne!(a, b);
        let mode = std::fs::metadata(&a).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        std::fs::remove_dir(a).unwrap();
        std::fs::remove_dir(b).unwrap();
    }
}
