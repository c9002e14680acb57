//! One POSIX shared memory object the server reads tensors from and writes
//! them to: the only place the server touches memory another process writes.
//!
//! The object is kept open, not mapped: reads and writes go through
//! `pread`/`pwrite` at checked offsets. A mapping held two hazards a client
//! could trigger: a client that shrank its object after registering it made
//! the server's next read of the mapping fault with SIGBUS (the process
//! died), and every registration took one of the kernel's 65,530 mappings
//! per process, after which the allocator's own next mmap failed and the
//! server aborted. A descriptor read past the object's end just reads
//! short, which is refused like any other range outside the region.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

use crate::error::{Error, Result};

/// `[0, len)` of a shared memory object, open for reading and writing.
#[derive(Debug)]
pub struct SharedObject {
    file: File,
    len: usize,
}

impl SharedObject {
    /// Opens the shared memory object `key` (a POSIX name, `/name`) whose
    /// first `len` bytes will be used. Refused when the object does not
    /// exist, is not owned by this process's user (another user's memory is
    /// not for a client to read through the server), or is smaller than
    /// `len`, always in the same words: the refusal must not tell a client
    /// which names exist in /dev/shm, or how large they are.
    pub fn open(key: &str, len: usize) -> Result<SharedObject> {
        let refused = || {
            Error::invalid(format!(
                "Unable to open shared memory region: '{key}': no object of at least {len} bytes by that name belongs to the server's user"
            ))
        };
        // A POSIX name is one path component under /dev/shm.
        let name = key.strip_prefix('/').unwrap_or(key);
        if name.is_empty() || name.contains('/') || name.contains('\0') || name == "." || name == ".." {
            return Err(Error::invalid(format!(
                "Unable to open shared memory region: '{key}' is not a shared memory object name ('/name')"
            )));
        }
        if len == 0 {
            return Err(Error::invalid(format!(
                "Unable to open shared memory region: '{key}': byte_size must be positive"
            )));
        }
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(format!("/dev/shm/{name}"))
            .map_err(|_| refused())?;
        let meta = file.metadata().map_err(|_| refused())?;
        if !meta.is_file() || meta.uid() != effective_uid() || meta.size() < len as u64 {
            return Err(refused());
        }
        Ok(SharedObject { file, len })
    }

    /// A copy of `[at, at + count)`; `None` when that is not inside the
    /// registered bytes, or no longer inside the object (it shrank).
    pub fn read(&self, at: usize, count: usize) -> Option<Vec<u8>> {
        let end = at.checked_add(count)?;
        if end > self.len {
            return None;
        }
        let mut out = vec![0u8; count];
        self.file.read_exact_at(&mut out, at as u64).ok()?;
        Some(out)
    }

    /// Copies `data` to `at`; `false` when it would not fit inside the
    /// registered bytes, or the object shrank below them (writing would
    /// grow it back).
    pub fn write(&self, at: usize, data: &[u8]) -> bool {
        let Some(end) = at.checked_add(data.len()) else {
            return false;
        };
        if end > self.len || self.file.metadata().map_or(true, |m| m.size() < end as u64) {
            return false;
        }
        self.file.write_all_at(data, at as u64).is_ok()
    }
}

fn effective_uid() -> u32 {
    #[allow(unsafe_code)]
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe {
        libc::geteuid()
    }
}

/// A shared memory object for tests: created owned by this process's
/// user, unlinked on drop.
#[cfg(test)]
pub mod testing {
    #![allow(unsafe_code)]

    use std::ffi::CString;

    pub struct Object(CString);

    impl Object {
        pub fn create(key: &str, len: usize) -> Object {
            let name = CString::new(key).unwrap();
            // SAFETY: valid string; the test owns the object it creates.
            let fd = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600) };
            assert!(fd >= 0, "{}", std::io::Error::last_os_error());
            // SAFETY: `fd` is open; ftruncate sizes the object.
            assert_eq!(unsafe { libc::ftruncate(fd, len as libc::off_t) }, 0);
            // SAFETY: `fd` is open and no longer needed.
            unsafe { libc::close(fd) };
            Object(name)
        }
    }

    impl Object {
        /// Truncates (or grows) the object, as a client may at any time.
        pub fn resize(&self, len: usize) {
            // SAFETY: valid string naming the object created above.
            let fd = unsafe { libc::shm_open(self.0.as_ptr(), libc::O_RDWR, 0) };
            assert!(fd >= 0, "{}", std::io::Error::last_os_error());
            // SAFETY: `fd` is open; ftruncate sizes the object.
            assert_eq!(unsafe { libc::ftruncate(fd, len as libc::off_t) }, 0);
            // SAFETY: `fd` is open and no longer needed.
            unsafe { libc::close(fd) };
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            // SAFETY: valid string naming the object created above.
            unsafe { libc::shm_unlink(self.0.as_ptr()) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::Object;
    use super::*;

    #[test]
    fn reads_and_writes_stay_inside_the_mapping() {
        let key = format!("/nereid-mapping-test-{}", std::process::id());
        let _object = Object::create(&key, 64);
        let object = SharedObject::open(&key, 64).unwrap();
        assert!(object.write(8, &[1, 2, 3, 4]));
        assert_eq!(object.read(8, 4).unwrap(), [1, 2, 3, 4]);
        assert!(!object.write(62, &[0; 4]), "past the end");
        assert!(object.read(60, 8).is_none());
        assert!(object.read(usize::MAX, 2).is_none(), "overflow");
        // A second opening sees the first one's writes: the memory is shared.
        let other = SharedObject::open(&key, 16).unwrap();
        assert_eq!(other.read(8, 4).unwrap(), [1, 2, 3, 4]);
    }

    #[test]
    fn an_object_that_shrank_reads_and_writes_nothing() {
        let key = format!("/nereid-shrunk-test-{}", std::process::id());
        let object = Object::create(&key, 4096);
        let opened = SharedObject::open(&key, 4096).unwrap();
        object.resize(16);
        assert!(opened.read(0, 4096).is_none(), "read past the new end");
        assert!(!opened.write(1024, &[1; 8]), "write past the new end");
        assert_eq!(opened.read(0, 16).unwrap(), [0; 16]);
    }

    #[test]
    fn a_missing_or_too_small_object_is_refused() {
        let e = SharedObject::open("/nereid-no-such-region", 8).unwrap_err();
        assert!(
            e.message()
                .starts_with("Unable to open shared memory region: '/nereid-no-such-region'"),
            "{e}"
        );
        let key = format!("/nereid-mapping-small-{}", std::process::id());
        let _object = Object::create(&key, 16);
        let e = SharedObject::open(&key, 32).unwrap_err();
        // Missing, too small: the same words.
        let missing = SharedObject::open("/nereid-no-such-region", 32).unwrap_err();
        assert_eq!(
            e.message().replace(&key, "K"),
            missing.message().replace("/nereid-no-such-region", "K")
        );
        assert!(SharedObject::open("/../etc/passwd", 8).is_err());
        assert!(SharedObject::open("/a/b", 8).is_err());
    }
}
