//! The KServe v2 tensor datatypes the load generator can produce.
//!
//! Only what nereid-perf needs: the wire name, the fixed element size (for
//! sizing raw buffers) and parsing. `BYTES` has no fixed size; its elements are
//! each a 4-byte little-endian length followed by the bytes, as in Triton's
//! binary tensor extension and gRPC `raw_input_contents`.

use std::fmt;
use std::str::FromStr;

/// A KServe v2 datatype, named as on the wire (`FP32`, `BYTES`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
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
    Fp32,
    Fp64,
    Bytes,
}

const ALL: [(DataType, &str); 13] = [
    (DataType::Bool, "BOOL"),
    (DataType::Uint8, "UINT8"),
    (DataType::Uint16, "UINT16"),
    (DataType::Uint32, "UINT32"),
    (DataType::Uint64, "UINT64"),
    (DataType::Int8, "INT8"),
    (DataType::Int16, "INT16"),
    (DataType::Int32, "INT32"),
    (DataType::Int64, "INT64"),
    (DataType::Fp16, "FP16"),
    (DataType::Fp32, "FP32"),
    (DataType::Fp64, "FP64"),
    (DataType::Bytes, "BYTES"),
];

impl DataType {
    /// The wire name, e.g. `FP32`.
    pub fn as_str(self) -> &'static str {
        ALL.iter().find(|(d, _)| *d == self).map(|(_, s)| *s).unwrap_or("BYTES")
    }

    /// Bytes per element, or `None` for `BYTES` (variable length).
    pub fn element_size(self) -> Option<usize> {
        Some(match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => 1,
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 => 2,
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => 4,
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => 8,
            DataType::Bytes => return None,
        })
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DataType {
    type Err = String;

    /// Accepts the wire names, case-insensitively, and Triton's config
    /// spelling (`TYPE_FP32`, `TYPE_STRING`) for convenience.
    fn from_str(s: &str) -> Result<Self, String> {
        let upper = s.trim().to_ascii_uppercase();
        let name = upper.strip_prefix("TYPE_").unwrap_or(&upper);
        let name = if name == "STRING" { "BYTES" } else { name };
        ALL.iter()
            .find(|(_, n)| *n == name)
            .map(|(d, _)| *d)
            .ok_or_else(|| format!("unknown datatype '{s}'"))
    }
}

#[cfg(test)]
mod tests {
    use super::DataType;

    #[test]
    fn parses_wire_and_config_names() {
        assert_eq!("FP32".parse::<DataType>(), Ok(DataType::Fp32));
        assert_eq!("fp16".parse::<DataType>(), Ok(DataType::Fp16));
        assert_eq!("TYPE_STRING".parse::<DataType>(), Ok(DataType::Bytes));
        assert_eq!("TYPE_INT64".parse::<DataType>(), Ok(DataType::Int64));
        assert!("FP8".parse::<DataType>().is_err());
    }

    #[test]
    fn names_round_trip_and_sizes() {
        for dt in [DataType::Bool, DataType::Uint8, DataType::Int32, DataType::Bytes] {
            assert_eq!(dt.as_str().parse::<DataType>(), Ok(dt));
        }
        assert_eq!(DataType::Fp32.element_size(), Some(4));
        assert_eq!(DataType::Bool.element_size(), Some(1));
        assert_eq!(DataType::Bytes.element_size(), None);
    }
}
