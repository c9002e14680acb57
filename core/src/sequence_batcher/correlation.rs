//! A request's place in a sequence: its correlation id and its START and
//! END flags, from the request parameters both front ends carry
//! (`sequence_id`, `sequence_start`, `sequence_end`, as tritonclient sends
//! them).

use std::fmt;

use bytes::Bytes;

use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::parameter::{Parameter, Parameters};

/// A sequence's id: a number or a string, as the client chose.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CorrelationId {
    Number(u64),
    Text(String),
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorrelationId::Number(n) => write!(f, "{n}"),
            // Escaped: the id is the client's text, and it goes into logs.
            CorrelationId::Text(s) => write!(f, "'{}'", s.escape_debug()),
        }
    }
}

impl CorrelationId {
    /// The id as one element of a CORRID control tensor of `datatype`
    /// (checked against the id's kind by [`Flags::of`]).
    pub fn element(&self, datatype: DataType) -> Bytes {
        match (self, datatype) {
            (CorrelationId::Number(n), DataType::Uint32 | DataType::Int32) => {
                Bytes::copy_from_slice(&(*n as u32).to_le_bytes())
            }
            (CorrelationId::Number(n), _) => Bytes::copy_from_slice(&n.to_le_bytes()),
            (CorrelationId::Text(s), _) => {
                let mut out = Vec::with_capacity(4 + s.len());
                out.extend_from_slice(&(s.len() as u32).to_le_bytes());
                out.extend_from_slice(s.as_bytes());
                Bytes::from(out)
            }
        }
    }
}

/// What a request says about its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flags {
    pub id: CorrelationId,
    pub start: bool,
    pub end: bool,
}

/// The longest string sequence id: a UUID is 36 bytes. Live and recently
/// released ids are kept (4096 of the latter), so their length is memory
/// the server holds after the request is gone.
pub const MAX_ID_BYTES: usize = 256;

impl Flags {
    /// Reads the sequence parameters of a request to `model`, whose CORRID
    /// control (if any) takes `corrid` elements.
    pub fn of(parameters: &Parameters, model: &str, corrid: Option<(&str, DataType)>) -> Result<Flags> {
        let missing = || {
            Error::invalid(format!(
                "inference request to model '{model}' must specify a non-zero or non-empty correlation ID"
            ))
        };
        let id = match parameters.get("sequence_id") {
            None => return Err(missing()),
            Some(Parameter::Int(0) | Parameter::Uint(0)) => return Err(missing()),
            Some(Parameter::String(s)) if s.is_empty() => return Err(missing()),
            Some(Parameter::Int(n)) => CorrelationId::Number(u64::try_from(*n).map_err(|_| {
                Error::invalid(format!(
                    "sequence_id of a request to model '{model}' must not be negative, got {n}"
                ))
            })?),
            Some(Parameter::Uint(n)) => CorrelationId::Number(*n),
            Some(Parameter::String(s)) if s.len() > MAX_ID_BYTES => {
                return Err(Error::invalid(format!(
                    "sequence_id of a request to model '{model}' is {} bytes; a string id may have at most {MAX_ID_BYTES}",
                    s.len()
                )));
            }
            Some(Parameter::String(s)) => CorrelationId::Text(s.clone()),
            Some(other) => {
                return Err(Error::invalid(format!(
                    "sequence_id of a request to model '{model}' must be an unsigned integer or a string, got {other:?}"
                )));
            }
        };
        if let Some((input, datatype)) = corrid {
            match (&id, datatype) {
                (CorrelationId::Text(_), DataType::Bytes) => {}
                (CorrelationId::Number(_), DataType::Bytes) => {
                    return Err(Error::invalid(format!(
                        "sequence_id of a request to model '{model}' must be a string: its CORRID control input '{input}' is TYPE_STRING, got {id}"
                    )));
                }
                (CorrelationId::Text(_), _) => {
                    return Err(Error::invalid(format!(
                        "sequence_id of a request to model '{model}' must be an integer: its CORRID control input '{input}' is {datatype}, got {id}"
                    )));
                }
                (CorrelationId::Number(n), DataType::Int32) if *n > i32::MAX as u64 => {
                    return Err(Error::invalid(format!(
                        "sequence_id {n} does not fit the INT32 CORRID control input '{input}' of model '{model}'"
                    )));
                }
                (CorrelationId::Number(n), DataType::Uint32) if *n > u64::from(u32::MAX) => {
                    return Err(Error::invalid(format!(
                        "sequence_id {n} does not fit the UINT32 CORRID control input '{input}' of model '{model}'"
                    )));
                }
                (CorrelationId::Number(n), DataType::Int64) if *n > i64::MAX as u64 => {
                    return Err(Error::invalid(format!(
                        "sequence_id {n} does not fit the INT64 CORRID control input '{input}' of model '{model}'"
                    )));
                }
                (CorrelationId::Number(_), _) => {}
            }
        }
        let flag = |name: &str| match parameters.get(name) {
            None => Ok(false),
            Some(Parameter::Bool(b)) => Ok(*b),
            Some(other) => Err(Error::invalid(format!(
                "parameter '{name}' of a request to model '{model}' must be a boolean, got {other:?}"
            ))),
        };
        Ok(Flags {
            id,
            start: flag("sequence_start")?,
            end: flag("sequence_end")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, Parameter)]) -> Parameters {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn flags_come_from_the_parameters() {
        let p = params(&[
            ("sequence_id", Parameter::Int(42)),
            ("sequence_start", Parameter::Bool(true)),
        ]);
        let flags = Flags::of(&p, "m", None).unwrap();
        assert_eq!(
            (flags.id.clone(), flags.start, flags.end),
            (CorrelationId::Number(42), true, false)
        );
        let text = params(&[("sequence_id", Parameter::String("call-7".into()))]);
        assert_eq!(
            Flags::of(&text, "m", Some(("CORRID", DataType::Bytes))).unwrap().id,
            CorrelationId::Text("call-7".into())
        );
        assert_eq!(
            CorrelationId::Number(5).element(DataType::Uint64),
            Bytes::from(5u64.to_le_bytes().to_vec())
        );
        assert_eq!(
            CorrelationId::Number(5).element(DataType::Int32),
            Bytes::from(5i32.to_le_bytes().to_vec())
        );
        assert_eq!(
            &CorrelationId::Text("ab".into()).element(DataType::Bytes)[..],
            b"\x02\0\0\0ab"
        );
    }

    #[test]
    fn bad_ids_and_flags_are_named() {
        for (p, corrid, needle) in [
            (params(&[]), None, "must specify a non-zero or non-empty correlation ID"),
            (params(&[("sequence_id", Parameter::Int(0))]), None, "non-zero"),
            (
                params(&[("sequence_id", Parameter::String(String::new()))]),
                None,
                "non-empty",
            ),
            (
                params(&[("sequence_id", Parameter::Int(-3))]),
                None,
                "must not be negative",
            ),
            (
                params(&[("sequence_id", Parameter::String("x".repeat(MAX_ID_BYTES + 1)))]),
                None,
                "a string id may have at most 256",
            ),
            (
                params(&[("sequence_id", Parameter::Bool(true))]),
                None,
                "unsigned integer or a string",
            ),
            (
                params(&[("sequence_id", Parameter::Int(3))]),
                Some(("C", DataType::Bytes)),
                "must be a string",
            ),
            (
                params(&[("sequence_id", Parameter::String("x".into()))]),
                Some(("C", DataType::Uint64)),
                "must be an integer",
            ),
            (
                params(&[("sequence_id", Parameter::Uint(u64::MAX))]),
                Some(("C", DataType::Int32)),
                "does not fit",
            ),
            (
                params(&[("sequence_id", Parameter::Int(1)), ("sequence_end", Parameter::Int(1))]),
                None,
                "'sequence_end' of a request to model 'm' must be a boolean",
            ),
        ] {
            let e = Flags::of(&p, "m", corrid).unwrap_err();
            assert!(e.message().contains(needle), "{e}");
        }
    }
}
