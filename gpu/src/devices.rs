//! The CUDA devices this process may use, numbered as the driver numbers
//! them: `CUDA_VISIBLE_DEVICES` applies, so ordinal 0 is the first device it
//! lists, as in every CUDA program. Each device carries the UUID NVML knows
//! it by (`GPU-…`), which is how its readings are found.

use cudarc::driver::{result, sys};

use crate::{GpuError, call, driver};

/// One visible CUDA device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gpu {
    /// The CUDA ordinal in this process.
    pub ordinal: i32,
    /// As NVML and nvidia-smi print it: `GPU-` and the 16 bytes in hex groups.
    pub uuid: String,
    pub name: String,
    pub total_memory: u64,
}

/// The visible devices, or why there are none.
#[derive(Debug, Clone)]
pub struct Gpus {
    devices: Vec<Gpu>,
    /// Why `devices` is empty (no driver, no device, a failed call).
    absent: Option<String>,
}

impl Gpus {
    /// Asks the driver. Never fails: a machine without a GPU has none, and
    /// the reason is kept for the errors that need one.
    pub fn discover() -> Gpus {
        match enumerate() {
            Ok(devices) if devices.is_empty() => Gpus::none(no_device_reason()),
            Ok(devices) => Gpus { devices, absent: None },
            Err(error) => Gpus::none(error.to_string()),
        }
    }

    /// Exactly `devices`, as a list to decide placements from; nothing is
    /// opened (what discovery returns on a machine with these devices).
    pub fn listed(devices: Vec<Gpu>) -> Gpus {
        Gpus { devices, absent: None }
    }

    /// No device, for `reason`.
    pub fn none(reason: impl Into<String>) -> Gpus {
        Gpus {
            devices: Vec::new(),
            absent: Some(reason.into()),
        }
    }

    pub fn devices(&self) -> &[Gpu] {
        &self.devices
    }

    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }

    /// The visible ordinals, ascending.
    pub fn ordinals(&self) -> Vec<i32> {
        self.devices.iter().map(|d| d.ordinal).collect()
    }

    pub fn get(&self, ordinal: i32) -> Option<&Gpu> {
        self.devices.iter().find(|d| d.ordinal == ordinal)
    }

    /// Why there is no device (`None` when there are some).
    pub fn absent_reason(&self) -> Option<&str> {
        self.absent.as_deref()
    }
}

fn enumerate() -> Result<Vec<Gpu>, GpuError> {
    driver()?;
    let count = call("cuDeviceGetCount", result::device::get_count())?;
    (0..count)
        .map(|ordinal| {
            let device = call("cuDeviceGet", result::device::get(ordinal))?;
            let uuid = call("cuDeviceGetUuid_v2", device_uuid(device))?;
            // SAFETY: `device` came from cuDeviceGet.
            let total = call("cuDeviceTotalMem", unsafe { result::device::total_mem(device) })?;
            Ok(Gpu {
                ordinal,
                uuid: uuid_text(&uuid),
                name: call("cuDeviceGetName", result::device::get_name(device))?,
                total_memory: total as u64,
            })
        })
        .collect()
}

/// The device's UUID through `cuDeviceGetUuid_v2`, which every driver since
/// CUDA 11.4 has; cudarc's wrapper calls the older name at this API level.
fn device_uuid(device: sys::CUdevice) -> Result<sys::CUuuid, result::DriverError> {
    let mut uuid = std::mem::MaybeUninit::<sys::CUuuid>::uninit();
    // SAFETY: `uuid` is written by the call before it is read.
    unsafe {
        sys::cuDeviceGetUuid_v2(uuid.as_mut_ptr(), device).result()?;
        Ok(uuid.assume_init())
    }
}

fn no_device_reason() -> String {
    match std::env::var("CUDA_VISIBLE_DEVICES") {
        Ok(list) => format!("the CUDA driver sees no device (CUDA_VISIBLE_DEVICES='{list}')"),
        Err(_) => "the CUDA driver sees no device".to_string(),
    }
}

/// NVML's spelling of a device UUID: `GPU-` then 8-4-4-4-12 hex digits.
fn uuid_text(uuid: &sys::CUuuid) -> String {
    let b: Vec<u8> = uuid.bytes.iter().map(|&c| c as u8).collect();
    format_uuid(&b)
}

fn format_uuid(b: &[u8]) -> String {
    let hex = |range: std::ops::Range<usize>| b[range].iter().map(|x| format!("{x:02x}")).collect::<String>();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        hex(0..4),
        hex(4..6),
        hex(6..8),
        hex(8..10),
        hex(10..16)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_are_spelled_as_nvml_spells_them() {
        let bytes: Vec<u8> = (0u8..16).map(|i| i * 17).collect();
        assert_eq!(format_uuid(&bytes), "GPU-00112233-4455-6677-8899-aabbccddeeff");
    }

    #[test]
    fn no_device_keeps_its_reason() {
        let gpus = Gpus::none("no driver");
        assert!(gpus.is_empty());
        assert_eq!(gpus.absent_reason(), Some("no driver"));
        assert_eq!(gpus.ordinals(), Vec::<i32>::new());
    }

    /// On any machine: either devices with NVML-style UUIDs, or a reason.
    /// Without a GPU it must not panic (cudarc panics on a missing libcuda
    /// when asked directly).
    #[test]
    fn discovery_never_panics_and_always_explains() {
        let gpus = Gpus::discover();
        if gpus.is_empty() {
            assert!(gpus.absent_reason().is_some_and(|r| !r.is_empty()));
        } else {
            for (i, gpu) in gpus.devices().iter().enumerate() {
                assert_eq!(gpu.ordinal, i as i32);
                assert!(gpu.uuid.starts_with("GPU-") && gpu.uuid.len() == 40, "{}", gpu.uuid);
            }
        }
    }
}
