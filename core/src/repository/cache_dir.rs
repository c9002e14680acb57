//! The default model cache: a new folder only this process can use, gone
//! when the server stops.
//!
//! A predictable path under /tmp (say `nereid-model-cache-<pid>`) lets
//! another local user create it first, or plant a symlink there, and so
//! choose what the server loads as a model. The folder is therefore created
//! fresh, with an unguessable name and mode 0700 (tempfile refuses to reuse
//! anything that exists), and removed with the copies in it at shutdown.

use std::io;

use tempfile::TempDir;

/// Creates `<tmp>/nereid-model-cache-<random>` with mode 0700; removed when dropped.
pub fn private_temp() -> io::Result<TempDir> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix("nereid-model-cache-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn each_folder_is_new_private_and_removed() {
        let a = private_temp().unwrap();
        let b = private_temp().unwrap();
        assert_ne!(a.path(), b.path());
        let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        let path = a.path().to_path_buf();
        drop(a);
        assert!(!path.exists());
    }
}
