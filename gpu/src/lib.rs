//! The GPUs this process may use, read through the CUDA driver and NVML,
//! both loaded at run time: the same binary starts on a machine without a
//! GPU, where [`Gpus::discover`] finds none and says why.
//!
//! - [`devices`]: the visible CUDA devices, as the driver numbers them
//!   (`CUDA_VISIBLE_DEVICES` applied), each with its NVML UUID.
//! - [`monitor`]: NVML readings per device, for Triton's GPU metrics.
//! - [`ipc`]: device memory another process shares through a CUDA IPC
//!   handle (Triton's CUDA shared memory), copied to and from the host.
//! - [`staging`]: pinned host and device buffers an instance stages its
//!   batches through.
//!
//! Both hold a reference on their device's primary context (`context`).
//!
//! cudarc panics when a driver function is called without libcuda, or when
//! the library lacks the function's symbol (an older driver), so every CUDA
//! call here goes through [`driver`], which checks for the library and for
//! every symbol used here ([`SYMBOLS`]), and initialises the driver once.

#![allow(unsafe_code)]

mod context;
pub mod devices;
pub mod ipc;
pub mod monitor;
pub mod staging;

use std::sync::OnceLock;

use cudarc::driver::{result, sys};

pub use devices::{Gpu, Gpus};
pub use ipc::{IPC_HANDLE_BYTES, IpcMemory};
pub use monitor::{GpuMonitor, GpuReading};
pub use staging::DeviceStaging;

/// What went wrong with a GPU call, with the call named.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    /// The CUDA driver cannot be used here (no library, or cuInit failed).
    #[error("no CUDA driver: {0}")]
    NoDriver(String),
    /// A driver call failed.
    #[error("{call} failed: {message}")]
    Driver { call: &'static str, message: String },
    /// The request does not fit what the device or the region has.
    #[error("{0}")]
    Invalid(String),
}

/// Every driver function this crate calls, cudarc's wrappers included: one
/// missing would be a panic at its first call. All are in every driver from
/// CUDA 12.0 on, CUDA 13's included.
const SYMBOLS: [&str; 24] = [
    "cuInit",
    "cuGetErrorName",
    "cuGetErrorString",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetName",
    "cuDeviceGetUuid_v2",
    "cuDeviceTotalMem_v2",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxSetCurrent",
    "cuIpcOpenMemHandle_v2",
    "cuIpcCloseMemHandle",
    "cuMemGetAddressRange_v2",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyHtoDAsync_v2",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemAlloc_v2",
    "cuMemFree_v2",
    "cuStreamCreate",
    "cuStreamSynchronize",
    "cuStreamDestroy_v2",
];

/// The driver, initialised once per process; an error says why it cannot be used.
pub(crate) fn driver() -> Result<(), GpuError> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            // SAFETY: only probes whether the library can be opened.
            if !unsafe { sys::is_culib_present() } {
                return Err("libcuda.so was not found (no NVIDIA driver on this machine)".to_string());
            }
            // SAFETY: the library is present (checked above), so culib()
            // opens it; `get` only looks the names up.
            let library = unsafe { sys::culib() };
            let missing: Vec<&str> = SYMBOLS
                .into_iter()
                .filter(|name| unsafe { library.get::<*const std::ffi::c_void>(name.as_bytes()) }.is_err())
                .collect();
            if !missing.is_empty() {
                return Err(format!(
                    "the CUDA driver is too old: libcuda lacks {}",
                    missing.join(", ")
                ));
            }
            result::init().map_err(|e| format!("cuInit failed: {}", describe(e)))
        })
        .clone()
        .map_err(GpuError::NoDriver)
}

/// A driver error as its name and text, e.g. `CUDA_ERROR_INVALID_VALUE (invalid argument)`.
pub(crate) fn describe(error: result::DriverError) -> String {
    let name = error.error_name().map(|n| n.to_string_lossy().into_owned());
    let text = error.error_string().map(|n| n.to_string_lossy().into_owned());
    match (name, text) {
        (Ok(name), Ok(text)) => format!("{name} ({text})"),
        _ => format!("{:?}", error.0),
    }
}

/// Wraps a failed driver call with its name.
pub(crate) fn call<T>(call: &'static str, outcome: Result<T, result::DriverError>) -> Result<T, GpuError> {
    outcome.map_err(|e| GpuError::Driver {
        call,
        message: describe(e),
    })
}
