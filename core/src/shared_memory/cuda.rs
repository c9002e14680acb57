//! Triton's CUDA shared memory extension: a client on the server's machine
//! shares device memory through a CUDA IPC handle (`cudaIpcMemHandle_t`,
//! 64 bytes, base64 in JSON) and names a range of it for an input or an
//! output, as with system shared memory.
//!
//! A region is opened on the CUDA device the client names (an ordinal as
//! this server sees it, `CUDA_VISIBLE_DEVICES` applied) and checked against
//! the allocation behind the handle. Inputs are copied from the device and
//! outputs to it; every range is checked against the registered size. On a
//! server without a GPU the status is an empty list, unregistering succeeds
//! (Triton's client examples unregister every CUDA region before they
//! start, also when they use only system shared memory), and a register is
//! refused with the reason no device can open the handle.

use std::sync::Arc;

use bytes::Bytes;
use nereid_gpu::{GpuError, Gpus, IpcMemory};

use super::TensorRegion;
use super::table::{Region, RegionTable};
use crate::error::{Error, Result};

pub use nereid_gpu::IPC_HANDLE_BYTES;

/// A registered CUDA region, as status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaRegionStatus {
    pub name: String,
    pub device_id: u64,
    pub byte_size: u64,
}

/// The registered CUDA shared memory regions (at most [`super::MAX_REGIONS`]:
/// each holds an IPC mapping and a reference on its device's context).
pub struct CudaSharedMemory {
    gpus: Arc<Gpus>,
    /// Each region's status and its device memory, open (shared with copies in flight).
    regions: RegionTable<CudaRegionStatus, IpcMemory>,
}

impl std::fmt::Debug for CudaSharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaSharedMemory").finish_non_exhaustive()
    }
}

impl CudaSharedMemory {
    /// Regions on `gpus`.
    pub fn new(gpus: Arc<Gpus>) -> Self {
        CudaSharedMemory {
            gpus,
            regions: RegionTable::new("CUDA "),
        }
    }

    /// Opens `raw_handle` on device `device_id` as `name`, `byte_size` bytes.
    pub fn register(&self, name: &str, raw_handle: &[u8], device_id: i64, byte_size: u64) -> Result<()> {
        self.regions.check_new(name)?;
        let refused =
            |why: String| Error::invalid(format!("failed to register CUDA shared memory region '{name}': {why}"));
        if raw_handle.len() != IPC_HANDLE_BYTES {
            return Err(refused(format!(
                "'raw_handle' must be a cudaIpcMemHandle_t of {IPC_HANDLE_BYTES} bytes, got {} bytes",
                raw_handle.len()
            )));
        }
        if self.gpus.is_empty() {
            return Err(refused(format!(
                "this server has no GPU, so its 'raw_handle' cannot be opened ({})",
                self.gpus.absent_reason().unwrap_or("none is visible")
            )));
        }
        let ordinal = i32::try_from(device_id)
            .ok()
            .filter(|ordinal| self.gpus.get(*ordinal).is_some())
            .ok_or_else(|| {
                refused(format!(
                    "'device_id' {device_id} is not a GPU this server sees; visible are {:?}",
                    self.gpus.ordinals()
                ))
            })?;
        let size = usize::try_from(byte_size).map_err(|_| refused(format!("'byte_size' {byte_size} is too large")))?;
        let memory = IpcMemory::open(ordinal, raw_handle, size).map_err(|e| match e {
            GpuError::NoDriver(_) => {
                Error::unavailable(format!("failed to register CUDA shared memory region '{name}': {e}"))
            }
            _ => refused(e.to_string()),
        })?;
        let status = CudaRegionStatus {
            name: name.to_string(),
            device_id: device_id as u64,
            byte_size,
        };
        self.regions.insert(name, status, memory)?;
        tracing::debug!(region = %name, device_id, byte_size, "CUDA shared memory region registered");
        Ok(())
    }

    /// Unregisters `name` (every region when `None`); an unknown name is
    /// not an error, as in Triton. Copies in flight finish first.
    pub fn unregister(&self, name: Option<&str>) {
        self.regions.unregister(name);
    }

    /// The regions (`name`'s alone when given; an unknown one is an error).
    pub fn status(&self, name: Option<&str>) -> Result<Vec<CudaRegionStatus>> {
        self.regions.status(name, |name| {
            Error::not_found(format!("Unable to find cuda shared memory region: '{name}'"))
        })
    }

    pub fn contains(&self, name: &str) -> bool {
        self.regions.contains(name)
    }

    /// A copy of a tensor's bytes from the device.
    pub fn read(&self, place: &TensorRegion) -> Result<Bytes> {
        let region = self.region(&place.region)?;
        let data = region
            .memory
            .read(place.offset, place.byte_size)
            .map_err(|e| copy_failed(place, &e))?;
        Ok(Bytes::from(data))
    }

    /// Copies an output's bytes to the device; they must fit its range.
    pub fn write(&self, place: &TensorRegion, output: &str, data: &[u8]) -> Result<()> {
        if data.len() > place.byte_size {
            return Err(super::too_large(place, output, data.len()));
        }
        self.region(&place.region)?
            .memory
            .write(place.offset, data)
            .map_err(|e| copy_failed(place, &e))
    }

    fn region(&self, name: &str) -> Result<Arc<Region<CudaRegionStatus, IpcMemory>>> {
        self.regions
            .get(name)
            .ok_or_else(|| Error::invalid(format!("Unable to find cuda shared memory region: '{name}'")))
    }
}

fn copy_failed(place: &TensorRegion, error: &GpuError) -> Error {
    Error::invalid(format!("CUDA shared memory region '{}': {error}", place.region))
}

#[cfg(test)]
mod tests {
    use nereid_gpu::Gpu;

    use super::*;
    use crate::error::ErrorKind;

    fn no_gpu() -> CudaSharedMemory {
        CudaSharedMemory::new(Arc::new(Gpus::none("libcuda.so was not found")))
    }

    #[test]
    fn without_a_gpu_nothing_is_registered_and_unregistering_succeeds() {
        let cuda = no_gpu();
        cuda.unregister(None);
        cuda.unregister(Some("never"));
        assert_eq!(cuda.status(None).unwrap(), Vec::new());
        let unknown = cuda.status(Some("never")).unwrap_err();
        assert_eq!(unknown.kind(), ErrorKind::NotFound);
        assert!(unknown.message().contains("'never'"), "{unknown}");
        let place = TensorRegion {
            region: "never".into(),
            byte_size: 4,
            offset: 0,
        };
        assert!(!cuda.contains("never"));
        assert!(
            cuda.read(&place)
                .unwrap_err()
                .message()
                .contains("Unable to find cuda shared memory region")
        );
    }

    #[test]
    fn a_register_is_refused_naming_the_region_and_why() {
        let cuda = no_gpu();
        let e = cuda.register("", &[0; IPC_HANDLE_BYTES], 0, 64).unwrap_err();
        assert!(e.message().contains("needs a name"), "{e}");
        let short = cuda.register("input", &[0; 3], 0, 64).unwrap_err();
        assert_eq!(short.kind(), ErrorKind::InvalidArgument);
        assert!(
            short.message().contains("'input'") && short.message().contains("got 3 bytes"),
            "{short}"
        );
        let whole = cuda.register("input", &[0; IPC_HANDLE_BYTES], 1, 64).unwrap_err();
        assert_eq!(whole.kind(), ErrorKind::InvalidArgument);
        assert!(
            whole.message().contains("'input'")
                && whole.message().contains("no GPU")
                && whole.message().contains("libcuda.so was not found"),
            "{whole}"
        );
        assert!(cuda.status(None).unwrap().is_empty());
    }

    /// The device is checked against the list before any handle is opened,
    /// so this holds on any machine.
    #[test]
    fn a_device_the_server_does_not_see_is_refused_before_opening() {
        let one = Gpus::listed(vec![Gpu {
            ordinal: 0,
            uuid: "GPU-00000000-0000-0000-0000-000000000000".into(),
            name: "listed".into(),
            total_memory: 0,
        }]);
        let cuda = CudaSharedMemory::new(Arc::new(one));
        for device in [1, -1, i64::from(i32::MAX) + 1] {
            let e = cuda.register("r", &[0; IPC_HANDLE_BYTES], device, 64).unwrap_err();
            assert!(
                e.message().contains(&format!(
                    "'device_id' {device} is not a GPU this server sees; visible are [0]"
                )),
                "{e}"
            );
        }
    }
}
