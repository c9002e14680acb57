//! Triton's CUDA shared memory extension on a server without a GPU.
//!
//! A client registers device memory it shares through a CUDA IPC handle
//! (`cudaIpcMemHandle_t`, 64 bytes). This server has no GPU yet, so no
//! handle can be opened and no region is ever registered: as real Triton
//! does on a machine without one, the status is an empty list, an
//! unregister (of every region or of one name) succeeds, and a register is
//! refused as an invalid argument that names the region and its handle.
//! Triton's own client examples unregister every CUDA region before they
//! start, also when they only use system shared memory, so those calls must
//! succeed here.

use crate::error::{Error, Result};

/// The size of a CUDA IPC memory handle (`cudaIpcMemHandle_t`).
pub const IPC_HANDLE_BYTES: usize = 64;

/// A registered CUDA region, as status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaRegionStatus {
    pub name: String,
    pub device_id: u64,
    pub byte_size: u64,
}

/// The registered CUDA shared memory regions: none, without a GPU.
#[derive(Debug, Default)]
pub struct CudaSharedMemory;

impl CudaSharedMemory {
    /// Refuses to register `raw_handle` on `device_id` as `name`: a
    /// malformed handle for what it is, a well-formed one because no device
    /// here can open it.
    pub fn register(&self, name: &str, raw_handle: &[u8], device_id: i64, byte_size: u64) -> Result<()> {
        if name.is_empty() {
            return Err(Error::invalid("a shared memory region needs a name"));
        }
        if raw_handle.len() != IPC_HANDLE_BYTES {
            return Err(Error::invalid(format!(
                "failed to register CUDA shared memory region '{name}': 'raw_handle' must be a cudaIpcMemHandle_t \
                 of {IPC_HANDLE_BYTES} bytes, got {} bytes",
                raw_handle.len()
            )));
        }
        Err(Error::invalid(format!(
            "failed to register CUDA shared memory region '{name}' ({byte_size} bytes on device {device_id}): \
             this server has no GPU, so its 'raw_handle' cannot be opened"
        )))
    }

    /// Unregisters `name` (every region when `None`): nothing to do, and an
    /// unknown name is not an error, as in Triton.
    pub fn unregister(&self, _name: Option<&str>) {}

    /// The regions: none; a named one is unknown.
    pub fn status(&self, name: Option<&str>) -> Result<Vec<CudaRegionStatus>> {
        match name {
            Some(name) => Err(Error::not_found(format!(
                "Unable to find cuda shared memory region: '{name}'"
            ))),
            None => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn nothing_is_registered_and_unregistering_succeeds() {
        let cuda = CudaSharedMemory;
        cuda.unregister(None);
        cuda.unregister(Some("never"));
        assert_eq!(cuda.status(None).unwrap(), Vec::new());
        let unknown = cuda.status(Some("never")).unwrap_err();
        assert_eq!(unknown.kind(), ErrorKind::NotFound);
        assert!(unknown.message().contains("'never'"), "{unknown}");
    }

    #[test]
    fn a_register_is_refused_naming_the_region_and_its_handle() {
        let cuda = CudaSharedMemory;
        let short = cuda.register("input", &[0; 3], 0, 64).unwrap_err();
        assert_eq!(short.kind(), ErrorKind::InvalidArgument);
        assert!(
            short.message().contains("'input'") && short.message().contains("got 3 bytes"),
            "{short}"
        );
        let whole = cuda.register("input", &[0; IPC_HANDLE_BYTES], 1, 64).unwrap_err();
        assert_eq!(whole.kind(), ErrorKind::InvalidArgument);
        assert!(
            whole.message().contains("'input'") && whole.message().contains("no GPU"),
            "{whole}"
        );
    }
}
