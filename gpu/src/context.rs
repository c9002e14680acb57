//! A reference on a device's primary context: the context every
//! runtime-API user in the process shares (ONNX Runtime's CUDA provider,
//! torch), so memory opened or allocated in it is usable by them. Made
//! current before every call that uses it; released when dropped, after
//! whatever holds it has freed what it made there.

use cudarc::driver::{result, sys};

use crate::{GpuError, call, driver};

#[derive(Debug)]
pub(crate) struct PrimaryContext {
    device: sys::CUdevice,
    context: sys::CUcontext,
}

// SAFETY: a driver-API context may be made current on any thread, and
// every use makes it current first.
unsafe impl Send for PrimaryContext {}
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains the primary context of the device with CUDA ordinal
    /// `ordinal` and makes it current on this thread.
    pub(crate) fn retain(ordinal: i32) -> Result<PrimaryContext, GpuError> {
        driver()?;
        let device = call("cuDeviceGet", result::device::get(ordinal))?;
        // SAFETY: `device` came from cuDeviceGet; released in Drop.
        let context = call("cuDevicePrimaryCtxRetain", unsafe {
            result::primary_ctx::retain(device)
        })?;
        let retained = PrimaryContext { device, context };
        retained.make_current()?;
        Ok(retained)
    }

    /// Makes the context current on this thread.
    pub(crate) fn make_current(&self) -> Result<(), GpuError> {
        // SAFETY: the context is retained for as long as `self` lives.
        call("cuCtxSetCurrent", unsafe { result::ctx::set_current(self.context) })
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `retain`.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}
