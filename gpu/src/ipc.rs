//! Device memory another process shares with this one through a CUDA IPC
//! handle (`cudaIpcMemHandle_t`), as Triton's CUDA shared memory extension
//! registers it. The memory is opened in the device's primary context (the
//! one every runtime-API user in this process shares) and copied to and
//! from host buffers; every range is checked against the registered size.

use cudarc::driver::{result, sys};

use crate::context::PrimaryContext;
use crate::{GpuError, call};

/// The size of a CUDA IPC memory handle.
pub const IPC_HANDLE_BYTES: usize = 64;

/// Another process's device memory, open in this one until dropped.
#[derive(Debug)]
pub struct IpcMemory {
    pointer: sys::CUdeviceptr,
    byte_size: usize,
    /// Dropped after the handle is closed in it.
    context: PrimaryContext,
}

impl IpcMemory {
    /// Opens `handle` on the device with CUDA ordinal `ordinal` and checks
    /// that its allocation holds `byte_size` bytes.
    pub fn open(ordinal: i32, handle: &[u8], byte_size: usize) -> Result<IpcMemory, GpuError> {
        let handle: [u8; IPC_HANDLE_BYTES] = handle.try_into().map_err(|_| {
            GpuError::Invalid(format!(
                "a CUDA IPC handle has {IPC_HANDLE_BYTES} bytes, got {}",
                handle.len()
            ))
        })?;
        let context = PrimaryContext::retain(ordinal)?;
        let raw = sys::CUipcMemHandle {
            reserved: handle.map(|b| b as std::ffi::c_char),
        };
        let mut pointer: sys::CUdeviceptr = 0;
        // SAFETY: `pointer` is written by the call; the handle is by value.
        let opened = unsafe {
            sys::cuIpcOpenMemHandle_v2(
                &mut pointer,
                raw,
                sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as std::ffi::c_uint,
            )
            .result()
        };
        call("cuIpcOpenMemHandle", opened)?;
        let memory = IpcMemory {
            pointer,
            byte_size,
            context,
        };
        let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
        // SAFETY: the outputs are written by the call; `pointer` is open.
        let range = unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, pointer).result() };
        call("cuMemGetAddressRange", range)?;
        let available = bytes_after(base, size, pointer);
        if byte_size > available {
            // Dropping `memory` closes the handle and releases the context.
            return Err(GpuError::Invalid(format!(
                "the shared allocation has {available} bytes from the handle's address, fewer than the {byte_size} registered"
            )));
        }
        Ok(memory)
    }

    /// Copies `len` bytes at `offset` to the host.
    pub fn read(&self, offset: usize, len: usize) -> Result<Vec<u8>, GpuError> {
        let at = self.at(offset, len)?;
        let mut host = vec![0u8; len];
        self.context.make_current()?;
        // SAFETY: `[at, at + len)` lies inside the open allocation and `host` has `len` bytes.
        call("cuMemcpyDtoH", unsafe { result::memcpy_dtoh_sync(&mut host, at) })?;
        Ok(host)
    }

    /// Copies `data` to `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<(), GpuError> {
        let at = self.at(offset, data.len())?;
        self.context.make_current()?;
        // SAFETY: `[at, at + data.len())` lies inside the open allocation.
        call("cuMemcpyHtoD", unsafe { result::memcpy_htod_sync(at, data) })
    }

    fn at(&self, offset: usize, len: usize) -> Result<sys::CUdeviceptr, GpuError> {
        match offset.checked_add(len) {
            Some(end) if end <= self.byte_size => Ok(self.pointer + offset as u64),
            _ => Err(GpuError::Invalid(format!(
                "{len} bytes at offset {offset} are outside the {} bytes registered",
                self.byte_size
            ))),
        }
    }
}

impl Drop for IpcMemory {
    fn drop(&mut self) {
        if self.context.make_current().is_ok() {
            // SAFETY: the handle was opened in this context, still retained.
            let _ = unsafe { sys::cuIpcCloseMemHandle(self.pointer) }.result();
        }
    }
}

// SAFETY: the pointer is a device address, not host memory, and every use
// makes its context current first.
unsafe impl Send for IpcMemory {}
unsafe impl Sync for IpcMemory {}

/// The bytes from `pointer` to the end of the allocation `[base, base + size)`.
fn bytes_after(base: sys::CUdeviceptr, size: usize, pointer: sys::CUdeviceptr) -> usize {
    let skipped = usize::try_from(pointer.saturating_sub(base)).unwrap_or(usize::MAX);
    size.saturating_sub(skipped)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a GPU the handle is refused with the reason; a malformed one
    /// is refused for its length wherever it runs.
    #[test]
    fn a_handle_is_refused_when_no_device_can_open_it() {
        match IpcMemory::open(0, &[0u8; 3], 16) {
            Err(GpuError::NoDriver(reason)) => assert!(!reason.is_empty()),
            Err(GpuError::Invalid(message)) => assert!(message.contains("got 3"), "{message}"),
            other => panic!("a 3-byte handle opened: {other:?}"),
        }
    }
}
