//! A batch staged for a device: each input's pieces (one per request, see
//! [`crate::batch::assemble`]) gathered into one host buffer, then copied
//! to the device once per input, so a batch of 64 requests costs one
//! transfer per input rather than 64. On a GPU the host buffer is pinned
//! memory, which the copy engine reads directly.
//!
//! The device side is a trait, [`DeviceMemory`]: `nereid-gpu` implements it
//! with CUDA; the tests here with host memory. The gather and the copy are
//! part of the backend's input phase, so they count as `compute_input`.
//! Buffers are kept per input
//! and reused from batch to batch, grown to the largest batch seen and
//! never past [`MAX_STAGED_BYTES`] per input.
//!
//! Only fixed-size types are staged: BYTES tensors stay on the host (a
//! backend reads their elements there).

use crate::backend::BatchInput;
use crate::error::{Error, ErrorKind, Result};

/// The most bytes one input of one batch may stage, host and device each:
/// far above any batch the request limits admit (the HTTP and gRPC bodies
/// are bounded below it), so it guards the device, not the clients.
pub const MAX_STAGED_BYTES: usize = 4 << 30;

/// Where a staged input lives on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceBuffer {
    /// The device's ordinal.
    pub device: i32,
    /// The device address of the first byte.
    pub address: u64,
    pub len: usize,
}

/// Host staging and device memory for one instance's inputs, slot by slot
/// (one slot per input of the model, in config order).
pub trait DeviceMemory: Send {
    /// Host memory for `slot` of at least `len` bytes, to gather into.
    fn host(&mut self, slot: usize, len: usize) -> Result<&mut [u8]>;

    /// Copies the first `len` bytes of `slot`'s host memory to the device
    /// and returns where they are; they stay there until the slot is
    /// staged again.
    fn upload(&mut self, slot: usize, len: usize) -> Result<DeviceBuffer>;
}

/// Stages batches into `M`.
pub struct Stager<M> {
    memory: M,
}

impl<M: DeviceMemory> Stager<M> {
    pub fn new(memory: M) -> Self {
        Stager { memory }
    }

    /// Stages every fixed-size input of `inputs` (slot `i` for input `i`):
    /// where each now is on the device, `None` for a BYTES input.
    pub fn stage(&mut self, inputs: &[BatchInput]) -> Result<Vec<Option<DeviceBuffer>>> {
        inputs
            .iter()
            .enumerate()
            .map(|(slot, input)| {
                if input.datatype.byte_size().is_none() {
                    return Ok(None);
                }
                let len = input.byte_len();
                if len > MAX_STAGED_BYTES {
                    return Err(Error::new(
                        ErrorKind::ResourceExhausted,
                        format!(
                            "input '{}' of the batch has {len} bytes; at most {MAX_STAGED_BYTES} are staged for the device",
                            input.name
                        ),
                    ));
                }
                let host = self.memory.host(slot, len)?;
                if host.len() < len {
                    return Err(Error::internal(format!(
                        "staging for input '{}' gave {} bytes, {len} needed",
                        input.name,
                        host.len()
                    )));
                }
                input.copy_into(&mut host[..len]);
                self.memory.upload(slot, len).map(Some)
            })
            .collect()
    }

    #[cfg(test)]
    fn memory(&self) -> &M {
        &self.memory
    }
}

/// CUDA: pinned host buffers, one transfer per input on the instance's stream.
impl DeviceMemory for nereid_gpu::DeviceStaging {
    fn host(&mut self, slot: usize, len: usize) -> Result<&mut [u8]> {
        nereid_gpu::DeviceStaging::host(self, slot, len).map_err(|e| Error::internal(format!("staging a batch: {e}")))
    }

    fn upload(&mut self, slot: usize, len: usize) -> Result<DeviceBuffer> {
        let address = nereid_gpu::DeviceStaging::upload(self, slot, len)
            .map_err(|e| Error::internal(format!("copying a batch to GPU {}: {e}", self.ordinal())))?;
        Ok(DeviceBuffer {
            device: self.ordinal(),
            address,
            len,
        })
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::datatype::DataType;

    /// Host memory behind the trait: the "device" copy is a second host
    /// buffer per slot, whose address the buffer reports.
    #[derive(Default)]
    struct HostMemory {
        staging: Vec<Vec<u8>>,
        device: Vec<Vec<u8>>,
        uploads: usize,
    }

    impl DeviceMemory for HostMemory {
        fn host(&mut self, slot: usize, len: usize) -> Result<&mut [u8]> {
            if self.staging.len() <= slot {
                self.staging.resize_with(slot + 1, Vec::new);
                self.device.resize_with(slot + 1, Vec::new);
            }
            let buffer = &mut self.staging[slot];
            if buffer.len() < len {
                buffer.resize(len, 0);
            }
            Ok(buffer.as_mut_slice())
        }

        fn upload(&mut self, slot: usize, len: usize) -> Result<DeviceBuffer> {
            self.uploads += 1;
            self.device[slot] = self.staging[slot][..len].to_vec();
            Ok(DeviceBuffer {
                device: 0,
                address: self.device[slot].as_ptr() as u64,
                len,
            })
        }
    }

    fn input(name: &str, datatype: DataType, rows: &[&[u8]], width: i64) -> BatchInput {
        BatchInput {
            name: name.into(),
            datatype,
            shape: vec![rows.len() as i64, width],
            parts: rows.iter().map(|r| Bytes::copy_from_slice(r)).collect(),
        }
    }

    #[test]
    fn each_input_is_gathered_once_and_copied_once_in_request_order() {
        let a: Vec<u8> = (0..8).collect();
        let b: Vec<u8> = (100..108).collect();
        let batch = vec![
            input("X", DataType::Fp32, &[&a, &b], 2),
            input("Y", DataType::Uint8, &[&[1, 2], &[3, 4]], 2),
        ];
        let mut stager = Stager::new(HostMemory::default());
        let staged = stager.stage(&batch).unwrap();
        assert_eq!(stager.memory().uploads, 2);
        assert_eq!(staged.len(), 2);
        // The device copy holds what the CPU path's one buffer holds.
        for (i, staged) in staged.iter().enumerate() {
            let buffer = staged.expect("a fixed-size input is staged");
            assert_eq!(stager.memory().device[i], batch[i].contiguous().to_vec());
            assert_eq!(buffer.len, batch[i].byte_len());
        }
    }

    #[test]
    fn buffers_are_reused_and_a_smaller_batch_copies_only_its_bytes() {
        let mut stager = Stager::new(HostMemory::default());
        let big = [input("X", DataType::Uint8, &[&[1; 4], &[2; 4], &[3; 4]], 4)];
        stager.stage(&big).unwrap();
        let small = [input("X", DataType::Uint8, &[&[9; 4]], 4)];
        let staged = stager.stage(&small).unwrap();
        assert_eq!(staged[0].map(|b| b.len), Some(4));
        assert_eq!(stager.memory().device[0], vec![9; 4]);
        // The host buffer kept its size; its tail is the earlier batch's.
        assert_eq!(stager.memory().staging[0].len(), 12);
    }

    #[test]
    fn bytes_inputs_stay_on_the_host() {
        let mut stager = Stager::new(HostMemory::default());
        let batch = [
            input("TEXT", DataType::Bytes, &[&[1, 0, 0, 0, b'a']], 1),
            input("X", DataType::Uint8, &[&[5]], 1),
        ];
        let staged = stager.stage(&batch).unwrap();
        assert_eq!(staged.iter().map(Option::is_some).collect::<Vec<_>>(), [false, true]);
        assert_eq!(stager.memory().uploads, 1);
        // Slot 1 for the second input: slots follow the inputs' order.
        assert_eq!(stager.memory().device[1], vec![5]);
    }
}
