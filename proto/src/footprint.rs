//! What a protobuf message will cost in memory once decoded, read from its
//! wire bytes before anything is decoded.
//!
//! The wire size says little about the decoded size: an empty entry of a
//! repeated message field is 2 bytes on the wire and a whole struct (plus
//! its share of the vector's growth) in memory, about 312 bytes for a
//! ModelInferRequest input, so a 48 MiB message of empty inputs asked prost
//! for 5 GiB and aborted the server. [`footprint`] walks the wire format
//! with the message's schema and adds up, for every field occurrence, what
//! prost will allocate for it: the struct of each element of a repeated
//! message field and each map entry (twice, for vector and table growth),
//! the bytes of strings and byte fields (their handle only for fields
//! decoded as `bytes::Bytes`, which point into the received buffer), and
//! the elements of packed scalars. It is an upper bound, not a guess, so a
//! budget that admits it admits what the decode will really hold.
//!
//! Bytes that do not parse end the walk: prost fails at the same place and
//! holds at most what was counted before it.

use std::collections::HashMap;
use std::sync::LazyLock;

use prost_reflect::{Kind, MessageDescriptor};

/// Nesting that ends the walk (prost's own recursion limit is 100).
const MAX_DEPTH: u32 = 100;

/// Bytes of a `Vec`, `String` or `Bytes` handle, of a map's table, and of
/// an integer or an `Option` tag: generous, so the estimate stays a bound.
const HANDLE: usize = 32;
const TABLE: usize = 48;
const WORD: usize = 8;

/// Vectors and tables grow by doubling: what one holds at most, per element.
const GROWTH: usize = 2;

/// What prost may allocate to report a message that does not parse: its
/// error, and the path of fields to the failure (an entry per level, up to
/// its recursion limit). Every message is counted this much to start with.
const FAILURE: usize = 8 << 10;

/// Fields prost decodes as `bytes::Bytes`, slices of the received buffer
/// (proto/build.rs): their payload is not copied.
const ZERO_COPY: [&str; 2] = [
    "inference.ModelInferRequest.raw_input_contents",
    "inference.ModelInferResponse.raw_output_contents",
];

/// Why a message cannot be admitted, before anything is decoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FootprintError {
    #[error("no message type '{0}' is known to this build")]
    UnknownType(String),
}

/// The heap bytes decoding `wire` as the message type `full_name` will hold
/// at most (the bytes of `wire` itself not included).
/// [`footprint`] for the message type `M`, with its full name; no string is
/// built (this runs for every message the server decodes).
pub fn footprint_of<M: prost::Name + 'static>(wire: &[u8]) -> Result<(usize, &'static str), FootprintError> {
    let schema: &'static Schema = &SCHEMA;
    let type_id = std::any::TypeId::of::<M>();
    let known = schema
        .by_type
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .get(&type_id)
        .copied();
    let (index, full_name) = match known {
        Some(found) => found,
        None => {
            let name = M::full_name();
            let (full_name, index) = schema
                .by_name
                .get_key_value(name.as_str())
                .ok_or(FootprintError::UnknownType(name))?;
            let found = (*index, full_name.as_str());
            schema
                .by_type
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .insert(type_id, found);
            found
        }
    };
    let mut total = FAILURE;
    walk(schema, index, wire, &mut 0, wire.len(), 0, &mut total);
    Ok((total, full_name))
}

pub fn footprint(full_name: &str, wire: &[u8]) -> Result<usize, FootprintError> {
    let schema = &*SCHEMA;
    let index = *schema
        .by_name
        .get(full_name)
        .ok_or_else(|| FootprintError::UnknownType(full_name.to_string()))?;
    let mut total = FAILURE;
    walk(schema, index, wire, &mut 0, wire.len(), 0, &mut total);
    Ok(total)
}

/// What decoding one field occurrence allocates.
#[derive(Debug, Clone, Copy)]
enum Shape {
    /// A scalar of `size` bytes in memory; `varint`: how it is packed.
    Scalar { size: usize, varint: bool, list: bool },
    /// A string or byte field (`copied`: its payload is copied out).
    Bytes { copied: bool, list: bool },
    /// A message (by index), as a list element, a map entry or one value.
    Message { index: usize, list: bool, map: bool },
}

struct MessageSchema {
    /// By field number, sorted.
    fields: Vec<(u32, Shape)>,
    /// The struct's own size, an upper bound.
    size: usize,
}

struct Schema {
    messages: Vec<MessageSchema>,
    by_name: HashMap<String, usize>,
    /// Each Rust type looked up so far, with its full name: after the first
    /// message of a type, found without building a string.
    by_type: std::sync::RwLock<HashMap<std::any::TypeId, (usize, &'static str)>>,
}

static SCHEMA: LazyLock<Schema> =
    LazyLock::new(|| Schema::of(&crate::descriptor_pool().all_messages().collect::<Vec<_>>()));

impl Schema {
    fn of(all: &[MessageDescriptor]) -> Schema {
        let by_name: HashMap<String, usize> = all
            .iter()
            .enumerate()
            .map(|(i, m)| (m.full_name().to_string(), i))
            .collect();
        let mut messages: Vec<MessageSchema> = all
            .iter()
            .map(|message| {
                let mut fields: Vec<(u32, Shape)> = message
                    .fields()
                    .map(|field| {
                        let list = field.is_list();
                        let shape = match field.kind() {
                            Kind::Message(m) => Shape::Message {
                                index: by_name[m.full_name()],
                                list,
                                map: field.is_map(),
                            },
                            Kind::String => Shape::Bytes { copied: true, list },
                            Kind::Bytes => Shape::Bytes {
                                copied: !ZERO_COPY.contains(&field.full_name()),
                                list,
                            },
                            Kind::Bool => Shape::Scalar {
                                size: 1,
                                varint: true,
                                list,
                            },
                            Kind::Double | Kind::Fixed64 | Kind::Sfixed64 => Shape::Scalar {
                                size: 8,
                                varint: false,
                                list,
                            },
                            Kind::Float | Kind::Fixed32 | Kind::Sfixed32 => Shape::Scalar {
                                size: 4,
                                varint: false,
                                list,
                            },
                            Kind::Int32 | Kind::Uint32 | Kind::Sint32 | Kind::Enum(_) => Shape::Scalar {
                                size: 4,
                                varint: true,
                                list,
                            },
                            Kind::Int64 | Kind::Uint64 | Kind::Sint64 => Shape::Scalar {
                                size: 8,
                                varint: true,
                                list,
                            },
                        };
                        (field.number(), shape)
                    })
                    .collect();
                fields.sort_by_key(|(number, _)| *number);
                MessageSchema { fields, size: 0 }
            })
            .collect();
        for index in 0..messages.len() {
            let size = struct_size(&messages, index, &mut Vec::new());
            messages[index].size = size;
        }
        Schema {
            messages,
            by_name,
            by_type: Default::default(),
        }
    }
}

/// A struct's size: its fields side by side, a nested message inline (a
/// recursive one behind a pointer, as prost boxes it).
fn struct_size(messages: &[MessageSchema], index: usize, open: &mut Vec<usize>) -> usize {
    if open.contains(&index) {
        return WORD;
    }
    open.push(index);
    let mut size = WORD;
    for (_, shape) in &messages[index].fields {
        size += match *shape {
            Shape::Scalar { list: true, .. } | Shape::Bytes { .. } => HANDLE,
            Shape::Scalar { size, .. } => size.max(WORD),
            Shape::Message { map: true, .. } => TABLE,
            Shape::Message { list: true, .. } => HANDLE,
            Shape::Message { index, .. } => WORD + struct_size(messages, index, open),
        };
    }
    open.pop();
    size
}

/// Adds what decoding `wire[*pos..limit]` as message `index` allocates to
/// `total`, the cursor left where prost's would be; `false` where prost
/// fails (the walk stops: prost holds at most what was counted).
///
/// It follows prost's reading, not the message's nesting: prost checks an
/// element's length only against what is left of the *whole* buffer, and
/// whether a message ended at its boundary only once it has read past it.
/// So a packed field or a string whose length runs past its enclosing
/// message is read (and allocated) whole before the error: counted here
/// the same way.
fn walk(
    schema: &Schema,
    index: usize,
    wire: &[u8],
    pos: &mut usize,
    limit: usize,
    depth: u32,
    total: &mut usize,
) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    let fields = &schema.messages[index].fields;
    let add = |total: &mut usize, bytes: usize| *total = total.saturating_add(bytes);
    while *pos < limit {
        let Some(key) = varint(wire, pos) else { return false };
        let number = (key >> 3) as u32;
        if number == 0 {
            return false; // prost: "invalid tag value: 0"
        }
        let shape = fields
            .binary_search_by_key(&number, |(n, _)| *n)
            .ok()
            .map(|i| fields[i].1);
        match key & 7 {
            0 => {
                if varint(wire, pos).is_none() {
                    return false;
                }
                if let Some(Shape::Scalar { size, list: true, .. }) = shape {
                    add(total, GROWTH * size);
                }
            }
            wire_type @ (1 | 5) => {
                let width = if wire_type == 1 { 8 } else { 4 };
                if wire.len() - *pos < width {
                    return false;
                }
                *pos += width;
                if let Some(Shape::Scalar { size, list: true, .. }) = shape {
                    add(total, GROWTH * size);
                }
            }
            2 => {
                let Some(length) = varint(wire, pos).and_then(|l| usize::try_from(l).ok()) else {
                    return false;
                };
                if wire.len() - *pos < length {
                    return false; // prost: "buffer underflow"
                }
                let end = *pos + length;
                match shape {
                    // Unknown fields are skipped, not kept.
                    None => *pos = end,
                    Some(Shape::Bytes { copied, list }) => {
                        add(total, if copied { length } else { 0 });
                        if list {
                            add(total, GROWTH * HANDLE);
                        }
                        *pos = end;
                    }
                    Some(Shape::Scalar {
                        size,
                        varint: packed_varints,
                        ..
                    }) => {
                        // The last element may run past the end (then prost fails).
                        let count = match packed_varints {
                            true => wire[*pos..end].iter().filter(|b| **b < 0x80).count() + 1,
                            false => length.div_ceil(size.max(1)),
                        };
                        add(total, GROWTH * size * count);
                        *pos = end;
                    }
                    Some(Shape::Message {
                        index: nested,
                        list,
                        map,
                    }) => {
                        let own = schema.messages[nested].size;
                        if map {
                            add(total, GROWTH * (own + 1));
                        } else if list {
                            add(total, GROWTH * own);
                        }
                        if !walk(schema, nested, wire, pos, end, depth + 1, total) {
                            return false;
                        }
                    }
                }
            }
            // A group prost skips (it keeps nothing of it) and goes on after.
            3 => {
                if !skip_group(wire, pos, number, depth + 1) {
                    return false;
                }
            }
            // An end of group outside one, and wire types that do not exist.
            _ => return false,
        }
    }
    // prost: "delimited length exceeded" when a field ran past the end.
    *pos == limit
}

/// Skips a group whose start tag (`number`) was read, as prost does; `false`
/// where prost fails.
fn skip_group(wire: &[u8], pos: &mut usize, number: u32, depth: u32) -> bool {
    if depth > MAX_DEPTH {
        return false;
    }
    loop {
        let Some(key) = varint(wire, pos) else { return false };
        let inner = (key >> 3) as u32;
        if inner == 0 {
            return false;
        }
        let skipped = match key & 7 {
            0 => varint(wire, pos).is_some(),
            wire_type @ (1 | 5) => {
                let width = if wire_type == 1 { 8 } else { 4 };
                let fits = wire.len() - *pos >= width;
                *pos += if fits { width } else { 0 };
                fits
            }
            2 => match varint(wire, pos).and_then(|l| usize::try_from(l).ok()) {
                Some(length) if wire.len() - *pos >= length => {
                    *pos += length;
                    true
                }
                _ => false,
            },
            3 => skip_group(wire, pos, inner, depth + 1),
            4 => return inner == number,
            _ => false,
        };
        if !skipped {
            return false;
        }
    }
}

/// A base-128 varint at `wire[*pos..]`, advancing `pos` past it.
fn varint(wire: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for (i, byte) in wire[*pos..].iter().enumerate().take(10) {
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            *pos += i + 1;
            return Some(value);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::cell::Cell;

    use prost::{Message, Name};

    use super::*;
    use crate::inference::infer_parameter::ParameterChoice;
    use crate::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
    use crate::inference::{InferParameter, InferTensorContents, ModelInferRequest, RepositoryModelLoadRequest};

    /// Counts this thread's allocations at their peak, to hold the estimate
    /// against what prost really takes.
    struct Counting;
    thread_local! {
        static LIVE: Cell<usize> = const { Cell::new(0) };
        static PEAK: Cell<usize> = const { Cell::new(0) };
    }
    #[allow(unsafe_code)]
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            let _ = LIVE.try_with(|live| {
                live.set(live.get() + layout.size());
                let _ = PEAK.try_with(|peak| peak.set(peak.get().max(live.get())));
            });
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(layout.size())));
            unsafe { System.dealloc(ptr, layout) }
        }
    }
    #[global_allocator]
    static ALLOCATOR: Counting = Counting;

    /// The peak bytes prost holds decoding `wire` as `M`.
    fn measured<M: Message + Default>(wire: &bytes::Bytes) -> usize {
        let start = LIVE.with(Cell::get);
        PEAK.with(|peak| peak.set(start));
        let decoded = M::decode(wire.clone());
        let peak = PEAK.with(Cell::get) - start;
        drop(decoded);
        peak
    }

    fn check<M: Message + Default + Name>(message: &M) -> (usize, usize) {
        let wire = bytes::Bytes::from(message.encode_to_vec());
        let estimate = footprint(&M::full_name(), &wire).unwrap();
        let real = measured::<M>(&wire);
        assert!(
            real <= estimate,
            "{}: prost held {real} bytes, the estimate is {estimate}",
            M::full_name()
        );
        (estimate, real)
    }

    #[test]
    fn empty_inputs_cost_their_structs_not_their_two_wire_bytes() {
        let request = ModelInferRequest {
            inputs: vec![InferInputTensor::default(); 10_000],
            ..Default::default()
        };
        let (estimate, real) = check(&request);
        assert_eq!(request.encoded_len(), 20_000);
        assert!(real > 100 * request.encoded_len(), "prost held {real}");
        assert!(estimate <= 4 * real, "{estimate} is too far over {real}");
    }

    #[test]
    fn every_kind_of_field_is_bounded_by_its_estimate() {
        let parameter = |s: &str| InferParameter {
            parameter_choice: Some(ParameterChoice::StringParam(s.into())),
        };
        let input = InferInputTensor {
            name: "INPUT0".into(),
            datatype: "INT32".into(),
            shape: vec![1, 1 << 40, 3],
            parameters: [("a".to_string(), parameter("b")), ("c".to_string(), parameter(""))].into(),
            contents: Some(InferTensorContents {
                int_contents: vec![0; 1000],
                int64_contents: vec![1; 10],
                bytes_contents: vec![vec![]; 500],
                fp32_contents: vec![0.5; 100],
                bool_contents: vec![true; 7],
                ..Default::default()
            }),
        };
        let request = ModelInferRequest {
            model_name: "m".repeat(100),
            id: "x".into(),
            parameters: [("k".to_string(), parameter("v"))].into(),
            inputs: vec![input; 30],
            outputs: vec![InferRequestedOutputTensor::default(); 40],
            raw_input_contents: vec![bytes::Bytes::from(vec![0u8; 4096]); 20],
            ..Default::default()
        };
        check(&request);
        let load = RepositoryModelLoadRequest {
            parameters: (0..1000).map(|i| (i.to_string(), Default::default())).collect(),
            ..Default::default()
        };
        check(&load);
    }

    #[test]
    fn raw_contents_are_counted_as_handles_and_unknown_fields_as_nothing() {
        let request = ModelInferRequest {
            raw_input_contents: vec![bytes::Bytes::from(vec![7u8; 1 << 20])],
            ..Default::default()
        };
        assert!(footprint(ModelInferRequest::full_name().as_str(), &request.encode_to_vec()).unwrap() < FAILURE + 1024);
        // Field 99, length-delimited, 1 MiB: prost skips it.
        let mut unknown = vec![0x9a, 0x06, 0x80, 0x80, 0x40];
        unknown.resize(unknown.len() + (1 << 20), 0);
        assert_eq!(
            footprint(ModelInferRequest::full_name().as_str(), &unknown).unwrap(),
            FAILURE
        );
    }

    #[test]
    fn a_field_that_runs_past_its_message_is_counted_as_prost_reads_it() {
        // An input whose `contents` is 3 bytes long, holding the start of a
        // packed uint64 field 2,000 bytes long: prost reads all of it (it
        // checks lengths against the whole buffer, and the boundary only
        // afterwards), so the estimate must count all of it too. Found by
        // the grpc_infer_request fuzz target.
        let packed = [vec![0x2a, 0xd0, 0x0f], vec![0u8; 2000]].concat();
        let input = [vec![0x2a, 3], packed].concat();
        let mut wire = vec![0x2a];
        wire.extend_from_slice(&[0xd5, 0x0f]); // 2005, the input's length
        wire.extend_from_slice(&input);
        let wire = bytes::Bytes::from(wire);
        assert!(ModelInferRequest::decode(wire.clone()).is_err());
        let estimate = footprint("inference.ModelInferRequest", &wire).unwrap();
        let real = measured::<ModelInferRequest>(&wire);
        assert!(real > 16_000, "prost read the field whole: {real}");
        assert!(real <= estimate, "prost held {real}, the estimate is {estimate}");
    }

    #[test]
    fn a_type_is_found_by_its_rust_type_as_by_its_full_name() {
        let request = ModelInferRequest {
            inputs: vec![InferInputTensor::default(); 3],
            ..Default::default()
        };
        let wire = request.encode_to_vec();
        let by_full_name = footprint("inference.ModelInferRequest", &wire).unwrap();
        assert_eq!(
            footprint_of::<ModelInferRequest>(&wire).unwrap(),
            (by_full_name, "inference.ModelInferRequest")
        );
        let input = InferInputTensor::default().encode_to_vec();
        assert_eq!(
            footprint_of::<InferInputTensor>(&input).unwrap().1,
            "inference.ModelInferRequest.InferInputTensor"
        );
    }

    #[test]
    fn a_broken_message_counts_what_came_before_the_break() {
        let request = ModelInferRequest {
            inputs: vec![InferInputTensor::default(); 100],
            ..Default::default()
        };
        let mut wire = request.encode_to_vec();
        let whole = footprint("inference.ModelInferRequest", &wire).unwrap();
        wire.extend_from_slice(&[0x2a, 0xff]); // an input whose length runs past the end
        assert_eq!(footprint("inference.ModelInferRequest", &wire).unwrap(), whole);
        assert!(matches!(
            footprint("no.Such", &wire),
            Err(FootprintError::UnknownType(_))
        ));
    }
}
