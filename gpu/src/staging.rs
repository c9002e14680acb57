//! Pinned host buffers and device buffers for one instance's batch inputs,
//! slot by slot: a batch input is gathered into its slot's pinned buffer
//! and copied to the device in one transfer on the instance's own stream.
//! Buffers grow to the largest batch seen and are reused; everything is
//! freed with the staging.

use std::ffi::c_void;

use cudarc::driver::{result, sys};

use crate::context::PrimaryContext;
use crate::{GpuError, call};

/// Grown in steps of this many bytes, so a batch slightly larger than the
/// last does not reallocate.
const GROWTH: usize = 1 << 20;

struct Slot {
    host: *mut u8,
    host_capacity: usize,
    device: sys::CUdeviceptr,
    device_capacity: usize,
}

/// One instance's staging buffers on one device.
pub struct DeviceStaging {
    ordinal: i32,
    stream: sys::CUstream,
    slots: Vec<Slot>,
    /// Dropped after the buffers and the stream are freed in it.
    context: PrimaryContext,
}

impl std::fmt::Debug for DeviceStaging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceStaging")
            .field("ordinal", &self.ordinal)
            .field("slots", &self.slots.len())
            .finish_non_exhaustive()
    }
}

// SAFETY: the buffers belong to this value alone; the context is made
// current on whichever thread uses them before every call.
unsafe impl Send for DeviceStaging {}

impl DeviceStaging {
    /// Staging on the device with CUDA ordinal `ordinal`, in its primary
    /// context, with a stream of its own.
    pub fn new(ordinal: i32) -> Result<DeviceStaging, GpuError> {
        let context = PrimaryContext::retain(ordinal)?;
        let stream = call(
            "cuStreamCreate",
            result::stream::create(result::stream::StreamKind::NonBlocking),
        )?;
        Ok(DeviceStaging {
            ordinal,
            stream,
            slots: Vec::new(),
            context,
        })
    }

    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Pinned host memory of at least `len` bytes for `slot`.
    pub fn host(&mut self, slot: usize, len: usize) -> Result<&mut [u8], GpuError> {
        self.context.make_current()?;
        let slot = self.slot(slot);
        if slot.host_capacity < len {
            let capacity = len.next_multiple_of(GROWTH);
            // SAFETY: the old buffer (if any) is no longer referenced; the new
            // one replaces it before anything reads it.
            unsafe {
                if !slot.host.is_null() {
                    let _ = result::free_host(slot.host.cast::<c_void>());
                    slot.host = std::ptr::null_mut();
                    slot.host_capacity = 0;
                }
                slot.host = call("cuMemHostAlloc", result::malloc_host(capacity, 0))?.cast::<u8>();
            }
            slot.host_capacity = capacity;
        }
        // SAFETY: `host` points at `host_capacity` bytes this value owns, and
        // the borrow of `self` keeps them from being freed meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(slot.host, slot.host_capacity) })
    }

    /// Copies the first `len` bytes of `slot`'s host buffer to its device
    /// buffer and waits for the copy; the device address.
    pub fn upload(&mut self, slot: usize, len: usize) -> Result<u64, GpuError> {
        self.context.make_current()?;
        let stream = self.stream;
        let slot = self.slot(slot);
        if slot.host_capacity < len {
            return Err(GpuError::Invalid(format!(
                "{len} bytes to upload, {} staged",
                slot.host_capacity
            )));
        }
        if slot.device_capacity < len {
            let capacity = len.next_multiple_of(GROWTH);
            // SAFETY: the old device buffer is not in use: every copy into it
            // was waited for, and the run that read it has returned.
            unsafe {
                if slot.device != 0 {
                    let _ = result::free_sync(slot.device);
                    slot.device = 0;
                    slot.device_capacity = 0;
                }
                slot.device = call("cuMemAlloc", result::malloc_sync(capacity))?;
            }
            slot.device_capacity = capacity;
        }
        // SAFETY: both buffers hold at least `len` bytes; the copy is waited
        // for before the host buffer can be written again.
        unsafe {
            let source = std::slice::from_raw_parts(slot.host, len);
            call(
                "cuMemcpyHtoDAsync",
                result::memcpy_htod_async(slot.device, source, stream),
            )?;
            call("cuStreamSynchronize", result::stream::synchronize(stream))?;
        }
        Ok(slot.device)
    }

    fn slot(&mut self, slot: usize) -> &mut Slot {
        if self.slots.len() <= slot {
            self.slots.resize_with(slot + 1, || Slot {
                host: std::ptr::null_mut(),
                host_capacity: 0,
                device: 0,
                device_capacity: 0,
            });
        }
        &mut self.slots[slot]
    }
}

impl Drop for DeviceStaging {
    fn drop(&mut self) {
        if self.context.make_current().is_err() {
            return;
        }
        // SAFETY: every buffer and the stream were made in this context,
        // still retained; nothing else refers to them.
        unsafe {
            let _ = result::stream::synchronize(self.stream);
            for slot in &self.slots {
                if !slot.host.is_null() {
                    let _ = result::free_host(slot.host.cast::<c_void>());
                }
                if slot.device != 0 {
                    let _ = result::free_sync(slot.device);
                }
            }
            let _ = result::stream::destroy(self.stream);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without a GPU there is no staging, and the reason says so; with one,
    /// staged bytes arrive on the device as they were gathered.
    #[test]
    fn staged_bytes_reach_the_device_or_the_reason_is_given() {
        if crate::Gpus::discover().is_empty() {
            let error = DeviceStaging::new(0).unwrap_err();
            assert!(
                matches!(error, GpuError::NoDriver(_) | GpuError::Driver { .. }),
                "{error}"
            );
            return;
        }
        let mut staging = DeviceStaging::new(0).unwrap();
        let data: Vec<u8> = (0..=255).cycle().take(3 << 20).collect();
        staging.host(1, data.len()).unwrap()[..data.len()].copy_from_slice(&data);
        let address = staging.upload(1, data.len()).unwrap();
        let mut back = vec![0u8; data.len()];
        // SAFETY: `address` holds `data.len()` bytes until the next upload.
        unsafe { result::memcpy_dtoh_sync(&mut back, address) }.unwrap();
        assert_eq!(back, data);
        // The device check looks for this line (run with --nocapture).
        println!("staged {} bytes on GPU 0 and read them back equal", data.len());
    }
}
