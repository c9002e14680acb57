//! A model's inputs and outputs, read from the ONNX file's protobuf without
//! loading it.
//!
//! Auto-complete and the config check need only the graph's signature.
//! Creating an ONNX Runtime session for that parses every initializer, which
//! for a large model costs as much as the instance's own session (bench
//! log 27: 1 s for 200 MiB); the load would pay it twice. This walks the
//! protobuf wire format instead, seeking over node lists and initializer
//! data, so it reads a few kilobytes of any model.
//!
//! What it reports matches ONNX Runtime's session inputs and outputs: graph
//! inputs that an initializer of the same name feeds are not inputs (models
//! before IR version 4 list every initializer as an input), a symbolic or
//! unknown dimension is -1, and a non-tensor value (sequence, map,
//! optional) has no datatype.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read, Seek};
use std::path::Path;

use nereid_core::datatype::DataType;
use nereid_core::error::{Error, Result};
use nereid_core::model_config::autocomplete::{ModelSignature, TensorSignature};

/// The largest input or output description read into memory. Real ones are
/// a name and a few dimensions; a larger one means the file is not ONNX.
const MAX_VALUE_INFO_BYTES: u64 = 1 << 20;

// Protobuf wire types; groups (3 and 4, deprecated) are refused.
const WIRE_VARINT: u8 = 0;
const WIRE_FIXED64: u8 = 1;
const WIRE_LEN: u8 = 2;
const WIRE_FIXED32: u8 = 5;

// Field numbers in onnx.proto.
const MODEL_GRAPH: u32 = 7;
const GRAPH_INITIALIZER: u32 = 5;
const GRAPH_INPUT: u32 = 11;
const GRAPH_OUTPUT: u32 = 12;
const GRAPH_SPARSE_INITIALIZER: u32 = 15;
const TENSOR_NAME: u32 = 8;
const SPARSE_TENSOR_VALUES: u32 = 1;
const VALUE_INFO_NAME: u32 = 1;
const VALUE_INFO_TYPE: u32 = 2;
const TYPE_TENSOR: u32 = 1;
const TYPE_TENSOR_ELEM_TYPE: u32 = 1;
const TYPE_TENSOR_SHAPE: u32 = 2;
const SHAPE_DIM: u32 = 1;
const DIM_VALUE: u32 = 1;

/// Reads the signature of the ONNX model in `path`.
pub fn read(path: &Path) -> Result<ModelSignature> {
    let file =
        File::open(path).map_err(|e| Error::invalid(format!("failed to open ONNX model '{}': {e}", path.display())))?;
    let length = file
        .metadata()
        .map_err(|e| Error::invalid(format!("failed to read ONNX model '{}': {e}", path.display())))?
        .len();
    let mut reader = Reader {
        inner: BufReader::with_capacity(64 * 1024, file),
        position: 0,
    };
    signature(&mut reader, length).map_err(|e| {
        Error::invalid(format!(
            "failed to read ONNX model '{}': not a valid ONNX protobuf: {e}",
            path.display()
        ))
    })
}

fn signature<R: Read + Seek>(reader: &mut Reader<R>, length: u64) -> std::result::Result<ModelSignature, String> {
    let mut graph = None;
    while reader.position < length {
        let (field, wire) = reader.tag()?;
        if field == MODEL_GRAPH && wire == WIRE_LEN {
            let size = reader.varint()?;
            let end = reader.end_of(size, length)?;
            // A repeated message field merges; ONNX writes the graph once.
            graph = Some(read_graph(reader, end)?);
        } else {
            reader.skip(wire, length)?;
        }
    }
    let graph = graph.ok_or("the file has no graph (is it an ONNX model?)")?;
    let inputs = graph
        .inputs
        .into_iter()
        .filter(|input| !graph.initializers.contains(&input.name))
        .collect();
    Ok(ModelSignature {
        inputs,
        outputs: graph.outputs,
    })
}

#[derive(Default)]
struct Graph {
    inputs: Vec<TensorSignature>,
    outputs: Vec<TensorSignature>,
    initializers: HashSet<String>,
}

fn read_graph<R: Read + Seek>(reader: &mut Reader<R>, end: u64) -> std::result::Result<Graph, String> {
    let mut graph = Graph::default();
    while reader.position < end {
        let (field, wire) = reader.tag()?;
        match (field, wire) {
            (GRAPH_INPUT | GRAPH_OUTPUT, WIRE_LEN) => {
                let size = reader.varint()?;
                if size > MAX_VALUE_INFO_BYTES {
                    return Err(format!("a graph input or output takes {size} bytes"));
                }
                reader.end_of(size, end)?;
                let bytes = reader.bytes(size)?;
                let value = value_info(&bytes)?;
                if field == GRAPH_INPUT {
                    graph.inputs.push(value);
                } else {
                    graph.outputs.push(value);
                }
            }
            (GRAPH_INITIALIZER, WIRE_LEN) => {
                let size = reader.varint()?;
                let tensor_end = reader.end_of(size, end)?;
                graph.initializers.insert(tensor_name(reader, tensor_end)?);
            }
            (GRAPH_SPARSE_INITIALIZER, WIRE_LEN) => {
                // A sparse initializer's name is its values tensor's.
                let size = reader.varint()?;
                let sparse_end = reader.end_of(size, end)?;
                while reader.position < sparse_end {
                    let (field, wire) = reader.tag()?;
                    if field == SPARSE_TENSOR_VALUES && wire == WIRE_LEN {
                        let size = reader.varint()?;
                        let values_end = reader.end_of(size, sparse_end)?;
                        graph.initializers.insert(tensor_name(reader, values_end)?);
                    } else {
                        reader.skip(wire, sparse_end)?;
                    }
                }
            }
            _ => reader.skip(wire, end)?,
        }
    }
    if reader.position != end {
        return Err("the graph overruns its length".into());
    }
    Ok(graph)
}

/// A TensorProto's name, seeking over its data.
fn tensor_name<R: Read + Seek>(reader: &mut Reader<R>, end: u64) -> std::result::Result<String, String> {
    let mut name = String::new();
    while reader.position < end {
        let (field, wire) = reader.tag()?;
        if field == TENSOR_NAME && wire == WIRE_LEN {
            let size = reader.varint()?;
            if size > MAX_VALUE_INFO_BYTES {
                return Err(format!("an initializer's name takes {size} bytes"));
            }
            reader.end_of(size, end)?;
            name = string(reader.bytes(size)?)?;
        } else {
            reader.skip(wire, end)?;
        }
    }
    Ok(name)
}

/// A ValueInfoProto: its name, element type and dimensions.
fn value_info(bytes: &[u8]) -> std::result::Result<TensorSignature, String> {
    let mut signature = TensorSignature {
        name: String::new(),
        datatype: None,
        dims: Vec::new(),
    };
    for field in Fields(bytes) {
        match field? {
            (VALUE_INFO_NAME, Value::Bytes(name)) => signature.name = string(name.to_vec())?,
            (VALUE_INFO_TYPE, Value::Bytes(type_proto)) => {
                for field in Fields(type_proto) {
                    // Only a tensor type has a datatype and a shape, as in
                    // ONNX Runtime's value types.
                    if let (TYPE_TENSOR, Value::Bytes(tensor)) = field? {
                        tensor_type(tensor, &mut signature)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(signature)
}

fn tensor_type(bytes: &[u8], signature: &mut TensorSignature) -> std::result::Result<(), String> {
    for field in Fields(bytes) {
        match field? {
            (TYPE_TENSOR_ELEM_TYPE, Value::Varint(code)) => signature.datatype = datatype(code),
            (TYPE_TENSOR_SHAPE, Value::Bytes(shape)) => {
                signature.dims.clear();
                for field in Fields(shape) {
                    if let (SHAPE_DIM, Value::Bytes(dim)) = field? {
                        let mut value = -1;
                        for field in Fields(dim) {
                            if let (DIM_VALUE, Value::Varint(v)) = field? {
                                value = v as i64;
                            }
                        }
                        signature.dims.push(value);
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// TensorProto.DataType's codes.
fn datatype(code: u64) -> Option<DataType> {
    Some(match code {
        1 => DataType::Fp32,
        2 => DataType::Uint8,
        3 => DataType::Int8,
        4 => DataType::Uint16,
        5 => DataType::Int16,
        6 => DataType::Int32,
        7 => DataType::Int64,
        8 => DataType::Bytes,
        9 => DataType::Bool,
        10 => DataType::Fp16,
        11 => DataType::Fp64,
        12 => DataType::Uint32,
        13 => DataType::Uint64,
        16 => DataType::Bf16,
        _ => return None,
    })
}

fn string(bytes: Vec<u8>) -> std::result::Result<String, String> {
    String::from_utf8(bytes).map_err(|_| "a name is not UTF-8".to_string())
}

/// A position-tracking reader over the file, for the outer messages whose
/// contents are mostly skipped.
struct Reader<R> {
    inner: BufReader<R>,
    position: u64,
}

impl<R: Read + Seek> Reader<R> {
    fn byte(&mut self) -> std::result::Result<u8, String> {
        let mut byte = [0u8];
        self.inner
            .read_exact(&mut byte)
            .map_err(|e| format!("truncated at byte {}: {e}", self.position))?;
        self.position += 1;
        Ok(byte[0])
    }

    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = self.byte()?;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(format!("a varint runs past 10 bytes at byte {}", self.position))
    }

    fn tag(&mut self) -> std::result::Result<(u32, u8), String> {
        let tag = self.varint()?;
        let field =
            u32::try_from(tag >> 3).map_err(|_| format!("a field number is out of range at byte {}", self.position))?;
        Ok((field, (tag & 7) as u8))
    }

    /// Where a length-delimited field of `size` bytes ends, refusing one that
    /// would run past its container.
    fn end_of(&self, size: u64, container_end: u64) -> std::result::Result<u64, String> {
        self.position
            .checked_add(size)
            .filter(|end| *end <= container_end)
            .ok_or_else(|| {
                format!(
                    "a field of {size} bytes at byte {} runs past its message",
                    self.position
                )
            })
    }

    fn bytes(&mut self, size: u64) -> std::result::Result<Vec<u8>, String> {
        let mut bytes = vec![0u8; size as usize];
        self.inner
            .read_exact(&mut bytes)
            .map_err(|e| format!("truncated at byte {}: {e}", self.position))?;
        self.position += size;
        Ok(bytes)
    }

    fn skip(&mut self, wire: u8, container_end: u64) -> std::result::Result<(), String> {
        let size = match wire {
            WIRE_VARINT => {
                self.varint()?;
                return Ok(());
            }
            WIRE_FIXED64 => 8,
            WIRE_FIXED32 => 4,
            WIRE_LEN => self.varint()?,
            other => return Err(format!("unsupported wire type {other} at byte {}", self.position)),
        };
        let end = self.end_of(size, container_end)?;
        let offset = i64::try_from(size).map_err(|_| "a field is too long".to_string())?;
        self.inner
            .seek_relative(offset)
            .map_err(|e| format!("failed to seek to byte {end}: {e}"))?;
        self.position = end;
        Ok(())
    }
}

/// A field's value inside a small message held in memory.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// The fields of a message held in memory, in order.
struct Fields<'a>(&'a [u8]);

impl<'a> Fields<'a> {
    fn varint(&mut self) -> std::result::Result<u64, String> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let (&byte, rest) = self.0.split_first().ok_or("a message is truncated")?;
            self.0 = rest;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err("a varint runs past 10 bytes".into())
    }

    fn take(&mut self, size: u64) -> std::result::Result<&'a [u8], String> {
        let size = usize::try_from(size)
            .ok()
            .filter(|s| *s <= self.0.len())
            .ok_or("a message is truncated")?;
        let (taken, rest) = self.0.split_at(size);
        self.0 = rest;
        Ok(taken)
    }

    fn field(&mut self) -> std::result::Result<(u32, Value<'a>), String> {
        let tag = self.varint()?;
        let field = u32::try_from(tag >> 3).map_err(|_| "a field number is out of range".to_string())?;
        let value = match (tag & 7) as u8 {
            WIRE_VARINT => Value::Varint(self.varint()?),
            WIRE_FIXED64 => {
                self.take(8)?;
                Value::Fixed
            }
            WIRE_FIXED32 => {
                self.take(4)?;
                Value::Fixed
            }
            WIRE_LEN => {
                let size = self.varint()?;
                Value::Bytes(self.take(size)?)
            }
            other => return Err(format!("unsupported wire type {other}")),
        };
        Ok((field, value))
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = std::result::Result<(u32, Value<'a>), String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.0.is_empty() {
            return None;
        }
        let field = self.field();
        if field.is_err() {
            // One error ends the walk.
            self.0 = &[];
        }
        Some(field)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    /// A protobuf writer for the few shapes the tests need.
    #[derive(Default)]
    struct Message(Vec<u8>);

    impl Message {
        fn varint(mut self, field: u32, value: u64) -> Self {
            push_varint(&mut self.0, u64::from(field) << 3);
            push_varint(&mut self.0, value);
            self
        }

        fn bytes(mut self, field: u32, value: &[u8]) -> Self {
            push_varint(&mut self.0, (u64::from(field) << 3) | 2);
            push_varint(&mut self.0, value.len() as u64);
            self.0.extend_from_slice(value);
            self
        }

        fn message(self, field: u32, value: Message) -> Self {
            self.bytes(field, &value.0)
        }
    }

    fn push_varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push((value as u8) | 0x80);
            value >>= 7;
        }
        out.push(value as u8);
    }

    fn value_info(name: &str, elem_type: u64, dims: &[Option<i64>]) -> Message {
        let mut shape = Message::default();
        for dim in dims {
            shape = shape.message(
                SHAPE_DIM,
                match dim {
                    Some(v) => Message::default().varint(DIM_VALUE, *v as u64),
                    None => Message::default().bytes(2, b"batch"),
                },
            );
        }
        let tensor = Message::default()
            .varint(TYPE_TENSOR_ELEM_TYPE, elem_type)
            .message(TYPE_TENSOR_SHAPE, shape);
        Message::default()
            .bytes(VALUE_INFO_NAME, name.as_bytes())
            .message(VALUE_INFO_TYPE, Message::default().message(TYPE_TENSOR, tensor))
    }

    fn read_bytes(bytes: &[u8]) -> std::result::Result<ModelSignature, String> {
        let mut reader = Reader {
            inner: BufReader::new(Cursor::new(bytes.to_vec())),
            position: 0,
        };
        signature(&mut reader, bytes.len() as u64)
    }

    fn model() -> Vec<u8> {
        // An initializer with a large raw_data before and after its name, a
        // node, and an old-style graph listing the initializer as an input.
        let weight = Message::default()
            .varint(1, 4)
            .varint(2, 1)
            .bytes(9, &vec![7u8; 100_000])
            .bytes(TENSOR_NAME, b"W");
        let node = Message::default().bytes(1, b"x").bytes(1, b"W").bytes(2, b"y");
        let graph = Message::default()
            .message(1, node)
            .bytes(2, b"g")
            .message(GRAPH_INITIALIZER, weight)
            .message(GRAPH_INPUT, value_info("x", 1, &[None, Some(4)]))
            .message(GRAPH_INPUT, value_info("W", 1, &[Some(4), Some(4)]))
            .message(GRAPH_OUTPUT, value_info("y", 7, &[None, Some(4)]));
        Message::default()
            .varint(1, 8)
            .bytes(2, b"producer")
            .message(MODEL_GRAPH, graph)
            .message(8, Message::default().varint(2, 17))
            .0
    }

    #[test]
    fn reads_inputs_and_outputs_without_initializers() {
        let signature = read_bytes(&model()).unwrap();
        assert_eq!(signature.inputs.len(), 1);
        assert_eq!(signature.inputs[0].name, "x");
        assert_eq!(signature.inputs[0].datatype, Some(DataType::Fp32));
        assert_eq!(signature.inputs[0].dims, vec![-1, 4]);
        assert_eq!(signature.outputs.len(), 1);
        assert_eq!(signature.outputs[0].name, "y");
        assert_eq!(signature.outputs[0].datatype, Some(DataType::Int64));
        assert_eq!(signature.outputs[0].dims, vec![-1, 4]);
    }

    #[test]
    fn a_non_tensor_value_has_no_datatype() {
        let sequence = Message::default().message(4, Message::default());
        let input = Message::default()
            .bytes(VALUE_INFO_NAME, b"s")
            .message(VALUE_INFO_TYPE, sequence);
        let graph = Message::default()
            .message(GRAPH_INPUT, input)
            .message(GRAPH_OUTPUT, value_info("y", 1, &[]));
        let bytes = Message::default().message(MODEL_GRAPH, graph).0;
        let signature = read_bytes(&bytes).unwrap();
        assert_eq!(signature.inputs[0].name, "s");
        assert_eq!(signature.inputs[0].datatype, None);
        assert!(signature.outputs[0].dims.is_empty());
    }

    #[test]
    fn refuses_what_is_not_an_onnx_model() {
        assert!(read_bytes(b"").unwrap_err().contains("no graph"));
        assert!(read_bytes(b"hello, world\n").is_err());
        // Every truncation of a real model fails cleanly or reads a prefix.
        let bytes = model();
        for cut in (0..bytes.len()).step_by(997) {
            let _ = read_bytes(&bytes[..cut]);
        }
        let truncated = &bytes[..bytes.len() - 3];
        assert!(read_bytes(truncated).is_err());
    }

    #[test]
    fn refuses_a_length_past_its_container() {
        // A graph that claims 2^40 bytes.
        let mut bytes = Vec::new();
        push_varint(&mut bytes, (u64::from(MODEL_GRAPH) << 3) | 2);
        push_varint(&mut bytes, 1 << 40);
        assert!(read_bytes(&bytes).unwrap_err().contains("runs past"));
    }
}
