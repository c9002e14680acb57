//! A tensor as the core sees it: a name, a datatype, a shape and its bytes.
//!
//! The data is always the tensor's raw little-endian, row-major contents, the
//! layout Triton's binary extension and gRPC `raw_*_contents` use. BYTES
//! tensors keep Triton's serialized form too (each element a 4-byte
//! little-endian length, then the bytes), so every front end can hand the
//! body slice it received straight to the core without re-encoding.

use bytes::Bytes;

use crate::datatype::DataType;
use crate::error::{Error, Result};

#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: DataType,
    pub shape: Vec<i64>,
    pub data: Bytes,
}

impl Tensor {
    pub fn new(name: impl Into<String>, datatype: DataType, shape: Vec<i64>, data: Bytes) -> Self {
        Tensor {
            name: name.into(),
            datatype,
            shape,
            data,
        }
    }

    /// Number of elements the shape describes.
    pub fn element_count(&self) -> Result<usize> {
        element_count(&self.shape).map_err(|e| e.context(format!("tensor '{}'", self.name)))
    }

    /// Checks that the data holds exactly as many elements as the shape says.
    pub fn check_data_size(&self) -> Result<()> {
        let count = self.element_count()?;
        match self.datatype.byte_size() {
            Some(size) => {
                let expected = count
                    .checked_mul(size)
                    .ok_or_else(|| Error::invalid(format!("tensor '{}' is too large", self.name)))?;
                if self.data.len() != expected {
                    return Err(Error::invalid(format!(
                        "unexpected byte size for input '{}': expected {expected} bytes for shape {:?} of {}, got {}",
                        self.name,
                        self.shape,
                        self.datatype,
                        self.data.len()
                    )));
                }
                Ok(())
            }
            None => {
                let found =
                    count_bytes_elements(&self.data).map_err(|e| e.context(format!("input '{}'", self.name)))?;
                if found != count {
                    return Err(Error::invalid(format!(
                        "unexpected number of string elements for input '{}': expected {count} for shape {:?}, got {found}",
                        self.name, self.shape
                    )));
                }
                Ok(())
            }
        }
    }
}

/// Product of the dims; rejects negative dims and overflow.
pub fn element_count(shape: &[i64]) -> Result<usize> {
    let mut count: usize = 1;
    for &dim in shape {
        let dim =
            usize::try_from(dim).map_err(|_| Error::invalid(format!("shape {shape:?} has a negative dimension")))?;
        count = count
            .checked_mul(dim)
            .ok_or_else(|| Error::invalid(format!("shape {shape:?} is too large")))?;
    }
    Ok(count)
}

/// Iterates over the elements of a serialized BYTES tensor.
pub fn bytes_elements(mut data: &[u8]) -> impl Iterator<Item = Result<&[u8]>> {
    std::iter::from_fn(move || {
        if data.is_empty() {
            return None;
        }
        if data.len() < 4 {
            data = &[];
            return Some(Err(Error::invalid(
                "truncated BYTES element: fewer than 4 bytes left for its length",
            )));
        }
        let len = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
        let rest = &data[4..];
        if rest.len() < len {
            let have = rest.len();
            data = &[];
            return Some(Err(Error::invalid(format!(
                "truncated BYTES element: length says {len} bytes, {have} left"
            ))));
        }
        let (element, tail) = rest.split_at(len);
        data = tail;
        Some(Ok(element))
    })
}

/// Counts the elements of a serialized BYTES tensor, checking that it is well formed.
pub fn count_bytes_elements(data: &[u8]) -> Result<usize> {
    bytes_elements(data).try_fold(0usize, |n, e| e.map(|_| n + 1))
}

/// Appends one element to a serialized BYTES tensor.
pub fn push_bytes_element(out: &mut Vec<u8>, element: &[u8]) -> Result<()> {
    let len = u32::try_from(element.len()).map_err(|_| Error::invalid("a BYTES element is longer than 4 GiB"))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(element);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serialize(elements: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in elements {
            push_bytes_element(&mut out, e).unwrap();
        }
        out
    }

    #[test]
    fn bytes_round_trip() {
        let data = serialize(&[b"", b"abc", "h\u{e9}llo".as_bytes(), &[0xff, 0x00]]);
        let back: Vec<&[u8]> = bytes_elements(&data).collect::<Result<_>>().unwrap();
        assert_eq!(back, vec![&b""[..], b"abc", "h\u{e9}llo".as_bytes(), &[0xff, 0x00]]);
        assert_eq!(count_bytes_elements(&data).unwrap(), 4);
    }

    #[test]
    fn truncated_bytes_are_rejected() {
        let mut data = serialize(&[b"abcd"]);
        data.pop();
        let err = count_bytes_elements(&data).unwrap_err();
        assert!(err.message().contains("truncated"), "{err}");
        let err = count_bytes_elements(&[1, 0]).unwrap_err();
        assert!(err.message().contains("truncated"), "{err}");
    }

    #[test]
    fn data_size_is_checked() {
        let t = Tensor::new("X", DataType::Int32, vec![2, 2], Bytes::from(vec![0u8; 16]));
        t.check_data_size().unwrap();
        let t = Tensor::new("X", DataType::Int32, vec![2, 3], Bytes::from(vec![0u8; 16]));
        let err = t.check_data_size().unwrap_err();
        assert!(err.message().contains("'X'"), "{err}");
        let t = Tensor::new("S", DataType::Bytes, vec![2], Bytes::from(serialize(&[b"a"])));
        assert!(t.check_data_size().is_err());
        let t = Tensor::new("S", DataType::Bytes, vec![1], Bytes::from(serialize(&[b"a"])));
        t.check_data_size().unwrap();
    }

    #[test]
    fn element_count_rejects_bad_shapes() {
        assert_eq!(element_count(&[]).unwrap(), 1);
        assert_eq!(element_count(&[3, 0]).unwrap(), 0);
        assert!(element_count(&[-1, 2]).is_err());
        assert!(element_count(&[i64::MAX, i64::MAX]).is_err());
    }
}
