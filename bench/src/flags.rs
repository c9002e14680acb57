//! Parsers for the compact `NAME:...` flag values shared by the binaries.
//!
//! Kept apart from clap so they are plain functions with unit tests; clap
//! calls them through `value_parser`.

use crate::datatype::DataType;

/// `--shape NAME:d1,d2,...`: an input name and its dimensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeFlag {
    pub name: String,
    pub dims: Vec<i64>,
}

/// `--datatype NAME:FP32`: an input name and its datatype.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatatypeFlag {
    pub name: String,
    pub datatype: DataType,
}

/// `--input NAME:DATATYPE:d1,d2` (nereid-echo): a tensor's full signature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorFlag {
    pub name: String,
    pub datatype: DataType,
    pub dims: Vec<i64>,
}

/// Splits `NAME:rest` at the last `:`, so names may themselves contain `:`
/// (TensorFlow-style `input:0`).
fn split_name(s: &str) -> Result<(&str, &str), String> {
    match s.rsplit_once(':') {
        Some((name, rest)) if !name.is_empty() => Ok((name, rest)),
        _ => Err(format!("expected NAME:VALUE, got '{s}'")),
    }
}

/// Parses `d1,d2,...`; `-1` (variable) is allowed, other negatives are not.
/// An empty string is a scalar (no dimensions).
pub fn parse_dims(s: &str) -> Result<Vec<i64>, String> {
    if s.trim().is_empty() {
        return Ok(Vec::new());
    }
    s.split(',')
        .map(|d| {
            let d = d.trim();
            match d.parse::<i64>() {
                Ok(v) if v >= -1 => Ok(v),
                _ => Err(format!("invalid dimension '{d}' in '{s}'")),
            }
        })
        .collect()
}

pub fn parse_shape_flag(s: &str) -> Result<ShapeFlag, String> {
    let (name, dims) = split_name(s)?;
    let dims = parse_dims(dims)?;
    if dims.contains(&-1) {
        return Err(format!("--shape '{s}' must give concrete dimensions"));
    }
    Ok(ShapeFlag {
        name: name.to_string(),
        dims,
    })
}

pub fn parse_datatype_flag(s: &str) -> Result<DatatypeFlag, String> {
    let (name, dt) = split_name(s)?;
    Ok(DatatypeFlag {
        name: name.to_string(),
        datatype: dt.parse()?,
    })
}

pub fn parse_tensor_flag(s: &str) -> Result<TensorFlag, String> {
    let mut parts = s.splitn(3, ':');
    let (Some(name), Some(dt), Some(dims)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(format!("expected NAME:DATATYPE:d1,d2,..., got '{s}'"));
    };
    if name.is_empty() {
        return Err(format!("empty tensor name in '{s}'"));
    }
    Ok(TensorFlag {
        name: name.to_string(),
        datatype: dt.parse()?,
        dims: parse_dims(dims)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shape_flags() {
        assert_eq!(
            parse_shape_flag("INPUT0:1,16").unwrap(),
            ShapeFlag {
                name: "INPUT0".into(),
                dims: vec![1, 16]
            }
        );
        assert_eq!(parse_shape_flag("in:0:4").unwrap().name, "in:0");
        assert_eq!(parse_shape_flag("scalar:").unwrap().dims, Vec::<i64>::new());
        assert!(parse_shape_flag("INPUT0:-1,16").is_err());
        assert!(parse_shape_flag("INPUT0:a").is_err());
        assert!(parse_shape_flag("16").is_err());
    }

    #[test]
    fn datatype_and_tensor_flags() {
        assert_eq!(parse_datatype_flag("X:fp16").unwrap().datatype, DataType::Fp16);
        assert!(parse_datatype_flag("X:FLOAT").is_err());
        let t = parse_tensor_flag("INPUT0:FP32:-1,256").unwrap();
        assert_eq!(t.name, "INPUT0");
        assert_eq!(t.datatype, DataType::Fp32);
        assert_eq!(t.dims, vec![-1, 256]);
        assert!(parse_tensor_flag("INPUT0:FP32").is_err());
        assert!(parse_tensor_flag("INPUT0:FP32:-2").is_err());
    }
}
