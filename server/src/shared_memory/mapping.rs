//! One POSIX shared memory object mapped into the server: the only place
//! the server touches memory another process writes.
//!
//! The client keeps writing its region while the server reads it, so the
//! mapped bytes are never lent out as a Rust slice (a slice promises no one
//! else changes them): reads copy out and writes copy in, through raw
//! pointers, within the bounds checked here.

#![allow(unsafe_code)]

use std::ffi::CString;

use crate::error::{Error, Result};

/// `[0, len)` of a shared memory object, mapped read-write.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory shared with other processes; this
// type only ever copies into and out of it with bounds checked against
// `len`, never hands out references to it, and unmaps it once (on drop,
// when the last owner is gone). Copies from several threads at once are
// what the memory is for; their order is the client's affair, as in Triton.
unsafe impl Send for Mapping {}
// SAFETY: as above: `&Mapping` gives only bounded copies.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Opens the shared memory object `key` and maps its first `len` bytes.
    /// Refused when the object does not exist, is not owned by this
    /// process's user (another user's memory is not for a client to read
    /// through the server), or is smaller than `len`.
    pub fn open(key: &str, len: usize) -> Result<Mapping> {
        let unable = |why: String| Error::invalid(format!("Unable to open shared memory region: '{key}': {why}"));
        let name = CString::new(key).map_err(|_| unable("the key contains a NUL byte".into()))?;
        if len == 0 {
            return Err(unable("byte_size must be positive".into()));
        }
        // SAFETY: `name` is a valid NUL-terminated string for the call.
        let fd = unsafe { libc::shm_open(name.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(unable(std::io::Error::last_os_error().to_string()));
        }
        let mapped = Self::map(fd, len).map_err(|e| unable(e.to_string()));
        // SAFETY: `fd` was opened above and is not used after this; the
        // mapping (if any) stays valid after its descriptor is closed.
        unsafe { libc::close(fd) };
        mapped
    }

    fn map(fd: libc::c_int, len: usize) -> std::io::Result<Mapping> {
        // SAFETY: `stat` is plain data, written by fstat before it is read.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is an open descriptor and `stat` a valid out pointer.
        if unsafe { libc::fstat(fd, &mut stat) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: geteuid has no preconditions.
        if stat.st_uid != unsafe { libc::geteuid() } {
            return Err(std::io::Error::other("it is owned by another user"));
        }
        let size = usize::try_from(stat.st_size).unwrap_or(0);
        if size < len {
            return Err(std::io::Error::other(format!(
                "the object has {size} bytes, fewer than the {len} registered"
            )));
        }
        // SAFETY: a fresh shared mapping of `len` bytes (checked to exist
        // above) at an address the kernel picks; failure is MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast::<u8>(),
            len,
        })
    }

    /// A copy of `[at, at + count)`; `None` when that is not inside the mapping.
    pub fn read(&self, at: usize, count: usize) -> Option<Vec<u8>> {
        let end = at.checked_add(count)?;
        if end > self.len {
            return None;
        }
        let mut out = vec![0u8; count];
        // SAFETY: `[at, end)` lies inside the mapping (checked above) and
        // `out` is a distinct, writable buffer of `count` bytes.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(at), out.as_mut_ptr(), count) };
        Some(out)
    }

    /// Copies `data` to `at`; `false` when it would not fit inside the mapping.
    pub fn write(&self, at: usize, data: &[u8]) -> bool {
        let Some(end) = at.checked_add(data.len()) else {
            return false;
        };
        if end > self.len {
            return false;
        }
        // SAFETY: `[at, end)` lies inside the mapping (checked above) and
        // `data` is a distinct buffer of that many bytes.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(at), data.len()) };
        true
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
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
        let mapping = Mapping::open(&key, 64).unwrap();
        assert!(mapping.write(8, &[1, 2, 3, 4]));
        assert_eq!(mapping.read(8, 4).unwrap(), [1, 2, 3, 4]);
        assert!(!mapping.write(62, &[0; 4]), "past the end");
        assert!(mapping.read(60, 8).is_none());
        assert!(mapping.read(usize::MAX, 2).is_none(), "overflow");
        // A second mapping sees the first one's writes: the memory is shared.
        let other = Mapping::open(&key, 16).unwrap();
        assert_eq!(other.read(8, 4).unwrap(), [1, 2, 3, 4]);
    }

    #[test]
    fn a_missing_or_too_small_object_is_refused() {
        let e = Mapping::open("/nereid-no-such-region", 8).unwrap_err();
        assert!(
            e.message()
                .starts_with("Unable to open shared memory region: '/nereid-no-such-region'"),
            "{e}"
        );
        let key = format!("/nereid-mapping-small-{}", std::process::id());
        let _object = Object::create(&key, 16);
        let e = Mapping::open(&key, 32).unwrap_err();
        assert!(
            e.message()
                .contains("the object has 16 bytes, fewer than the 32 registered"),
            "{e}"
        );
    }
}
