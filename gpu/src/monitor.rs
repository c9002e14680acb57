//! NVML readings of the visible devices, the figures behind Triton's GPU
//! metrics. Devices are found in NVML by UUID, because NVML numbers every
//! device on the machine while CUDA numbers only the visible ones.

use std::ffi::OsStr;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;

use crate::{GpuError, Gpus};

/// One device's figures at one moment; `None` where the device does not
/// report that figure (NVML's NotSupported, e.g. power on some boards).
#[derive(Debug, Clone, PartialEq)]
pub struct GpuReading {
    pub uuid: String,
    /// Busy fraction over NVML's last sample period, 0 to 1.
    pub utilization: Option<f64>,
    pub memory_total_bytes: Option<u64>,
    pub memory_used_bytes: Option<u64>,
    pub power_watts: Option<f64>,
    pub power_limit_watts: Option<f64>,
    /// Energy used since the monitor opened, in joules.
    pub energy_joules: Option<f64>,
}

/// NVML, open, and the devices it reads.
pub struct GpuMonitor {
    nvml: Nvml,
    /// Each device's UUID and its energy counter (mJ) when the monitor opened.
    devices: Vec<(String, Option<u64>)>,
}

impl std::fmt::Debug for GpuMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GpuMonitor")
            .field("devices", &self.devices)
            .finish_non_exhaustive()
    }
}

impl GpuMonitor {
    /// Opens NVML for `gpus`; an error when NVML cannot be loaded or knows
    /// none of them.
    pub fn open(gpus: &Gpus) -> Result<GpuMonitor, GpuError> {
        if gpus.is_empty() {
            return Err(GpuError::Invalid(format!(
                "no GPU to monitor: {}",
                gpus.absent_reason().unwrap_or("none visible")
            )));
        }
        let nvml = open_nvml().map_err(|e| GpuError::NoDriver(format!("NVML cannot be opened: {e}")))?;
        let mut devices = Vec::new();
        for gpu in gpus.devices() {
            match nvml.device_by_uuid(gpu.uuid.as_str()) {
                Ok(device) => devices.push((gpu.uuid.clone(), device.total_energy_consumption().ok())),
                // A MIG slice, say: CUDA's UUID is not a device NVML reads.
                Err(error) => {
                    tracing::warn!(uuid = %gpu.uuid, %error, "NVML does not know this CUDA device; no metrics for it")
                }
            }
        }
        if devices.is_empty() {
            return Err(GpuError::Invalid("NVML knows none of the visible CUDA devices".into()));
        }
        Ok(GpuMonitor { nvml, devices })
    }

    /// The UUIDs of the devices read.
    pub fn uuids(&self) -> impl Iterator<Item = &str> {
        self.devices.iter().map(|(uuid, _)| uuid.as_str())
    }

    /// Reads every device once; a device that cannot be read is left out.
    pub fn read(&self) -> Vec<GpuReading> {
        self.devices
            .iter()
            .filter_map(|(uuid, energy_at_open)| {
                let device = self.nvml.device_by_uuid(uuid.as_str()).ok()?;
                let memory = device.memory_info().ok();
                let energy = match (device.total_energy_consumption().ok(), energy_at_open) {
                    (Some(now), Some(then)) => Some(now.saturating_sub(*then) as f64 / 1000.0),
                    _ => None,
                };
                Some(GpuReading {
                    uuid: uuid.clone(),
                    utilization: device.utilization_rates().ok().map(|u| f64::from(u.gpu) / 100.0),
                    memory_total_bytes: memory.as_ref().map(|m| m.total),
                    memory_used_bytes: memory.as_ref().map(|m| m.used),
                    power_watts: device.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
                    power_limit_watts: device.enforced_power_limit().ok().map(|mw| f64::from(mw) / 1000.0),
                    energy_joules: energy,
                })
            })
            .collect()
    }
}

/// The driver installs `libnvidia-ml.so.1`; the unversioned name exists
/// only where development files are, so the versioned one is tried first.
fn open_nvml() -> Result<Nvml, NvmlError> {
    Nvml::builder()
        .lib_path(OsStr::new("libnvidia-ml.so.1"))
        .init()
        .or_else(|_| Nvml::init())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_no_monitor() {
        let error = GpuMonitor::open(&Gpus::none("no driver here")).unwrap_err();
        assert!(error.to_string().contains("no driver here"), "{error}");
    }
}
