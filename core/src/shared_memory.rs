//! Triton's system shared memory extension: a client that shares the
//! server's host registers POSIX shared memory objects as named regions,
//! then passes tensors through them instead of the socket: an input with
//! the parameters `shared_memory_region`, `shared_memory_byte_size` (and
//! `shared_memory_offset`) is read from the region, an output asked for
//! with them is written into it, and the answer carries the parameters
//! instead of the data.
//!
//! A region is `[offset, offset + byte_size)` of the object `key`; a tensor
//! names a range of its region. Every range is checked against the region
//! (a client never reads or writes outside what it registered), and the
//! object must belong to the server's own user. Unregistering removes the
//! name at once; a request that already read its inputs is not affected,
//! and one whose output region went away meanwhile fails with that reason.
//!
//! - [`object`]: the shared memory object, read and written at offsets.
//! - [`cuda`]: CUDA shared memory: device memory shared through CUDA IPC
//!   handles. A tensor names a region of either kind; CUDA regions are
//!   looked up first.

pub mod cuda;
mod object;
mod table;

use std::sync::Arc;

use bytes::Bytes;

use self::object::SharedObject;
use self::table::{Region, RegionTable};
use crate::error::{Error, Result};
use crate::parameter::{Parameter, Parameters};

/// What every parameter that places a tensor in a region starts with.
pub const PREFIX: &str = "shared_memory_";
/// The parameters that place a tensor in a region.
pub const REGION: &str = "shared_memory_region";
pub const BYTE_SIZE: &str = "shared_memory_byte_size";
pub const OFFSET: &str = "shared_memory_offset";

/// A registered region, as status reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionStatus {
    pub name: String,
    pub key: String,
    pub offset: usize,
    pub byte_size: usize,
}

/// Where a tensor is in shared memory: a range of a named region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorRegion {
    pub region: String,
    pub byte_size: usize,
    pub offset: usize,
}

impl TensorRegion {
    /// The tensor's region from its parameters; `None` when it names none.
    pub fn from_parameters(tensor: &str, parameters: &Parameters) -> Result<Option<TensorRegion>> {
        let Some(region) = parameters.get(REGION) else {
            return Ok(None);
        };
        let region = region
            .as_str()
            .ok_or_else(|| Error::invalid(format!("'{REGION}' of tensor '{tensor}' must be a string")))?;
        let size = |key: &str, required: bool| -> Result<usize> {
            match parameters.get(key) {
                None if required => Err(Error::invalid(format!(
                    "tensor '{tensor}' names shared memory region '{region}' without '{key}'"
                ))),
                None => Ok(0),
                Some(p) => p.as_i64().and_then(|v| usize::try_from(v).ok()).ok_or_else(|| {
                    Error::invalid(format!("'{key}' of tensor '{tensor}' must be a non-negative integer"))
                }),
            }
        };
        Ok(Some(TensorRegion {
            region: region.to_string(),
            byte_size: size(BYTE_SIZE, true)?,
            offset: size(OFFSET, false)?,
        }))
    }

    /// The parameters an answer carries for an output written here.
    pub fn parameters(&self, written: usize) -> Parameters {
        let mut parameters = Parameters::new();
        parameters.insert(REGION.into(), Parameter::String(self.region.clone()));
        parameters.insert(
            BYTE_SIZE.into(),
            Parameter::Int(i64::try_from(written).unwrap_or(i64::MAX)),
        );
        if self.offset > 0 {
            parameters.insert(
                OFFSET.into(),
                Parameter::Int(i64::try_from(self.offset).unwrap_or(i64::MAX)),
            );
        }
        parameters
    }
}

/// The registered system shared memory regions.
pub struct SharedMemory {
    /// Each region's status and its object, open (shared with reads in flight).
    regions: RegionTable<RegionStatus, SharedObject>,
}

impl Default for SharedMemory {
    fn default() -> Self {
        SharedMemory {
            regions: RegionTable::new(""),
        }
    }
}

impl std::fmt::Debug for SharedMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedMemory").finish_non_exhaustive()
    }
}

impl SharedMemory {
    /// Registers `[offset, offset + byte_size)` of the object `key` as `name`.
    pub fn register(&self, name: &str, key: &str, offset: usize, byte_size: usize) -> Result<()> {
        self.regions.check_new(name)?;
        let end = offset
            .checked_add(byte_size)
            .ok_or_else(|| Error::invalid("offset + byte_size is too large"))?;
        let object = SharedObject::open(key, end)?;
        let status = RegionStatus {
            name: name.to_string(),
            key: key.to_string(),
            offset,
            byte_size,
        };
        self.regions.insert(name, status, object)?;
        tracing::debug!(region = %name, %key, offset, byte_size, "shared memory region registered");
        Ok(())
    }

    /// Unregisters `name` (every region when `None`). An unknown name is
    /// not an error, as in Triton.
    pub fn unregister(&self, name: Option<&str>) {
        self.regions.unregister(name);
    }

    /// The regions (`name`'s alone when given; an unknown one is an error).
    pub fn status(&self, name: Option<&str>) -> Result<Vec<RegionStatus>> {
        self.regions.status(name, unknown)
    }

    /// A copy of a tensor's bytes from its region.
    pub fn read(&self, place: &TensorRegion) -> Result<Bytes> {
        let (region, at) = self.locate(place, place.byte_size)?;
        let data = region.memory.read(at, place.byte_size).ok_or_else(|| shrank(place))?;
        Ok(Bytes::from(data))
    }

    /// Writes an output's bytes into its region; they must fit its range.
    pub fn write(&self, place: &TensorRegion, output: &str, data: &[u8]) -> Result<()> {
        if data.len() > place.byte_size {
            return Err(too_large(place, output, data.len()));
        }
        let (region, at) = self.locate(place, data.len())?;
        if region.memory.write(at, data) {
            Ok(())
        } else {
            Err(shrank(place))
        }
    }

    /// The region and where `place` starts in its object, once `place`'s
    /// range (of `count` bytes) is checked to lie inside the region.
    fn locate(&self, place: &TensorRegion, count: usize) -> Result<(Arc<Region<RegionStatus, SharedObject>>, usize)> {
        let region = self.regions.get(&place.region).ok_or_else(|| unknown(&place.region))?;
        let end = place.offset.checked_add(count);
        if end.is_none_or(|end| end > region.status.byte_size) {
            return Err(out_of_bounds(place, count));
        }
        let at = region.status.offset + place.offset;
        Ok((region, at))
    }
}

/// An output larger than the range its request gave it in a region.
pub(crate) fn too_large(place: &TensorRegion, output: &str, len: usize) -> Error {
    Error::invalid(format!(
        "output '{output}' has {len} bytes, more than the {} given in shared memory region '{}'",
        place.byte_size, place.region
    ))
}

/// The most regions registered at once: each holds an open descriptor.
/// Triton's clients register one or two per tensor they place.
pub const MAX_REGIONS: usize = 1024;

/// The range was inside the region, but the object no longer has it: its
/// owner made it smaller after registering it.
fn shrank(place: &TensorRegion) -> Error {
    Error::invalid(format!(
        "shared memory region '{}' is smaller than when it was registered: its object was truncated",
        place.region
    ))
}

fn unknown(name: &str) -> Error {
    Error::invalid(format!("Unable to find system shared memory region: '{name}'"))
}

fn out_of_bounds(place: &TensorRegion, count: usize) -> Error {
    Error::invalid(format!(
        "{count} bytes at offset {} are outside shared memory region '{}'",
        place.offset, place.region
    ))
}

#[cfg(test)]
mod tests {
    use super::object::testing::Object;
    use super::*;

    fn place(region: &str, offset: usize, byte_size: usize) -> TensorRegion {
        TensorRegion {
            region: region.into(),
            byte_size,
            offset,
        }
    }

    #[test]
    fn a_region_is_a_range_of_its_object_and_tensors_stay_inside_it() {
        let key = format!("/nereid-shm-test-{}", std::process::id());
        let _object = Object::create(&key, 128);
        let shm = SharedMemory::default();
        // Bytes 32..96 of the object.
        shm.register("r", &key, 32, 64).unwrap();
        shm.write(&place("r", 8, 16), "OUT", &[7u8; 16]).unwrap();
        assert_eq!(shm.read(&place("r", 8, 16)).unwrap(), Bytes::from(vec![7u8; 16]));
        // Another region over the same object sees the bytes at their place.
        shm.register("whole", &key, 0, 128).unwrap();
        assert_eq!(shm.read(&place("whole", 40, 16)).unwrap(), Bytes::from(vec![7u8; 16]));
        // Outside the region, even inside the object: refused.
        let e = shm.read(&place("r", 56, 16)).unwrap_err();
        assert_eq!(
            e.message(),
            "16 bytes at offset 56 are outside shared memory region 'r'"
        );
        let e = shm.write(&place("r", 0, 4), "OUT", &[0u8; 8]).unwrap_err();
        assert!(e.message().contains("has 8 bytes, more than the 4 given"), "{e}");
        assert_eq!(shm.status(Some("r")).unwrap()[0].offset, 32);
        let e = shm.register("r", &key, 0, 8).unwrap_err();
        assert_eq!(e.message(), "shared memory region 'r' already in manager");
        shm.unregister(Some("r"));
        let e = shm.read(&place("r", 0, 4)).unwrap_err();
        assert_eq!(e.message(), "Unable to find system shared memory region: 'r'");
        assert_eq!(shm.status(None).unwrap().len(), 1);
        shm.unregister(None);
        assert!(shm.status(None).unwrap().is_empty());
    }

    #[test]
    fn a_region_larger_than_its_object_is_refused() {
        let key = format!("/nereid-shm-small-{}", std::process::id());
        let _object = Object::create(&key, 16);
        let e = SharedMemory::default().register("r", &key, 8, 16).unwrap_err();
        assert!(e.message().contains("no object of at least 24 bytes"), "{e}");
    }

    #[test]
    fn tensor_parameters_name_the_region_and_its_size() {
        let mut p = Parameters::new();
        assert_eq!(TensorRegion::from_parameters("X", &p).unwrap(), None);
        p.insert(REGION.into(), Parameter::String("in".into()));
        let e = TensorRegion::from_parameters("X", &p).unwrap_err();
        assert!(e.message().contains("without 'shared_memory_byte_size'"), "{e}");
        p.insert(BYTE_SIZE.into(), Parameter::Int(64));
        p.insert(OFFSET.into(), Parameter::Int(16));
        assert_eq!(
            TensorRegion::from_parameters("X", &p).unwrap(),
            Some(place("in", 16, 64))
        );
        p.insert(OFFSET.into(), Parameter::Int(-1));
        assert!(TensorRegion::from_parameters("X", &p).is_err());
    }
}
