//! Triton's tensor datatypes and their three spellings: the wire name
//! (`"INT32"`), the model-config enum (`TYPE_INT32`) and the element size.
//!
//! Shared by the server and the benchmark tools, so both speak of the same
//! types with the same names.

use std::str::FromStr;

/// A tensor element type as the KServe v2 protocol names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    Bool,
    Uint8,
    Uint16,
    Uint32,
    Uint64,
    Int8,
    Int16,
    Int32,
    Int64,
    Fp16,
    Bf16,
    Fp32,
    Fp64,
    /// Variable-length byte strings, each serialized as a 4-byte
    /// little-endian length followed by the bytes.
    Bytes,
}

impl DataType {
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Bf16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
    ];

    /// The name used on the wire (`datatype` in KServe v2 requests).
    pub fn as_wire(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Bf16 => "BF16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
        }
    }

    /// Parses a wire name; `None` for anything Triton does not define.
    pub fn from_wire(name: &str) -> Option<DataType> {
        DataType::ALL.into_iter().find(|t| t.as_wire() == name)
    }

    /// The value of `inference.DataType` in model_config.proto.
    pub fn to_config(self) -> i32 {
        match self {
            DataType::Bool => 1,
            DataType::Uint8 => 2,
            DataType::Uint16 => 3,
            DataType::Uint32 => 4,
            DataType::Uint64 => 5,
            DataType::Int8 => 6,
            DataType::Int16 => 7,
            DataType::Int32 => 8,
            DataType::Int64 => 9,
            DataType::Fp16 => 10,
            DataType::Fp32 => 11,
            DataType::Fp64 => 12,
            DataType::Bytes => 13,
            DataType::Bf16 => 14,
        }
    }

    /// Inverse of [`DataType::to_config`]; `None` for TYPE_INVALID and unknown values.
    pub fn from_config(value: i32) -> Option<DataType> {
        DataType::ALL.into_iter().find(|t| t.to_config() == value)
    }

    /// Size of one element in bytes; `None` for BYTES, whose elements vary.
    pub fn byte_size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }
}

/// Lenient parsing for people typing flags: any case, and the config
/// spelling (`TYPE_FP32`, `TYPE_STRING`) too. Protocol decoding uses the
/// strict [`DataType::from_wire`].
impl FromStr for DataType {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let upper = s.trim().to_ascii_uppercase();
        let name = upper.strip_prefix("TYPE_").unwrap_or(&upper);
        let name = if name == "STRING" { "BYTES" } else { name };
        DataType::from_wire(name).ok_or_else(|| format!("unknown datatype '{s}'"))
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_wire())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_and_config_names_round_trip() {
        for t in DataType::ALL {
            assert_eq!(DataType::from_wire(t.as_wire()), Some(t));
            assert_eq!(DataType::from_config(t.to_config()), Some(t));
        }
        assert_eq!(DataType::from_wire("int32"), None);
        assert_eq!(DataType::from_config(0), None);
        assert_eq!(DataType::Int32.to_config(), 8);
        assert_eq!(DataType::Bytes.to_config(), 13);
        assert_eq!(DataType::Bf16.to_config(), 14);
    }

    #[test]
    fn lenient_parsing_for_flags() {
        assert_eq!("fp16".parse::<DataType>(), Ok(DataType::Fp16));
        assert_eq!("TYPE_STRING".parse::<DataType>(), Ok(DataType::Bytes));
        assert_eq!("TYPE_INT64".parse::<DataType>(), Ok(DataType::Int64));
        assert!("FP8".parse::<DataType>().is_err());
    }

    #[test]
    fn sizes() {
        assert_eq!(DataType::Fp16.byte_size(), Some(2));
        assert_eq!(DataType::Fp64.byte_size(), Some(8));
        assert_eq!(DataType::Bool.byte_size(), Some(1));
        assert_eq!(DataType::Bytes.byte_size(), None);
    }
}
