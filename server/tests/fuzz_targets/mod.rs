//! The fuzz targets: every decoder that sees client bytes, fed arbitrary
//! bytes, with the properties each must keep.
//!
//! Shared by the coverage-guided fuzzers (`server/fuzz`, cargo-fuzz on
//! nightly) and by `tests/fuzz_regressions.rs`, which replays the committed
//! corpus seeds and a bounded random walk on every `cargo test`. Properties:
//!
//! - no panic, whatever the bytes;
//! - every error is the client's (invalid argument, unsupported, or the
//!   memory budget), never an internal one;
//! - memory stays bounded: the peak allocated while decoding is at most a
//!   small multiple of the input (plus a fixed allowance), measured by the
//!   counting allocator each harness installs ([`CountingAllocator`]).

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use nereid_proto::footprint::footprint;
use nereid_proto::inference::ModelInferRequest;
use nereid_server::datatype::DataType;
use nereid_server::error::{Error, ErrorKind};
use nereid_server::http::body::SizeLimit;
use nereid_server::http::{compression, infer_codec, json_tensor};
use nereid_server::memory_budget::{MemoryBudget, Reservation};
use nereid_server::model::normalize::normalize;
use nereid_server::model_config::{file_names, json as config_json, text, validate};
use nereid_server::tensor::{Tensor, count_bytes_elements};
use prost::Message;

/// A fuzz target: takes any bytes, panics only when a property breaks.
pub type Target = fn(&[u8]);

/// The targets, by the names the fuzzers and the corpus folders use.
pub const TARGETS: [(&str, Target); 11] = [
    ("http_infer_body", http_infer_body),
    ("json_tensor_data", json_tensor_data),
    ("grpc_infer_request", grpc_infer_request),
    ("grpc_stream_messages", grpc_stream_messages),
    ("control_body", control_body),
    ("generate_body", generate_body),
    ("gateway_request", gateway_request),
    ("bytes_elements", bytes_elements),
    ("decompress", decompress),
    ("config_pbtxt", config_pbtxt),
    ("config_json", config_json),
];

/// How much a decoder may allocate beyond a multiple of its input: the
/// fixed cost of a few small structures.
const ALLOWANCE: usize = 1 << 20;
/// The multiple: JSON data "1," (2 bytes) becomes 8 bytes of INT64 or FP64,
/// plus the body itself and the decoder's bookkeeping.
const FACTOR: usize = 16;
/// The decompression limit the `decompress` target runs with.
const INFLATE_LIMIT: usize = 1 << 20;

/// A global allocator that counts live bytes and their peak.
pub struct CountingAllocator;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the
// counters only observe the sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: same contract as the caller's.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            if new_size >= layout.size() {
                let live = LIVE.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size - layout.size();
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        new
    }
}

/// Runs one target on `data`, checking that its peak allocation stays within
/// `FACTOR * data.len() + extra + ALLOWANCE`. Meaningful only in a process
/// whose global allocator is [`CountingAllocator`] and which runs one input
/// at a time.
pub fn run(target: Target, data: &[u8], extra: usize) {
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    target(data);
    let grown = PEAK.load(Ordering::Relaxed).saturating_sub(base);
    let bound = FACTOR * data.len() + extra + ALLOWANCE;
    assert!(
        grown <= bound,
        "decoding {} bytes allocated {grown} bytes at peak (bound {bound})",
        data.len()
    );
}

/// Extra memory a target may use beyond the multiple of its input.
pub fn extra_allowance(name: &str) -> usize {
    if name == "decompress" { 2 * INFLATE_LIMIT } else { 0 }
}

/// Loads what every target uses once (descriptor pools, lazies), so that
/// one-time setup is not counted against the first input.
pub fn warm_up() {
    for (_, target) in TARGETS {
        target(b"");
        target(b"{}");
    }
    let _ = config_json::from_json("{\"name\":\"x\"}");
    let _ = text::parse("name: \"x\"");
}

fn client_error(e: &Error, what: &str) {
    assert!(
        matches!(
            e.kind(),
            ErrorKind::InvalidArgument | ErrorKind::Unsupported | ErrorKind::ResourceExhausted
        ),
        "{what}: a client's bytes caused a {:?} error: {e}",
        e.kind()
    );
}

/// A model every decoded request is normalized against: two inputs, one
/// batching, one fixed-shape BYTES.
fn model() -> nereid_proto::inference::ModelConfig {
    text::parse(
        r#"name: "m" max_batch_size: 8
           input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "S" data_type: TYPE_STRING dims: [ 2 ] optional: true } ]
           output [ { name: "B" data_type: TYPE_FP32 dims: [ -1 ] } ]"#,
    )
    .expect("the fuzz model config parses")
}

/// The HTTP infer body: JSON header, binary extension, JSON data; then the
/// core's request checks. The first byte says where the JSON header ends
/// (0: no Inference-Header-Content-Length).
pub fn http_infer_body(data: &[u8]) {
    let Some((&split, body)) = data.split_first() else {
        return;
    };
    let header_length = (split > 0).then(|| usize::from(split).min(body.len()));
    let budget = MemoryBudget::new(64 * data.len() + (1 << 20));
    let decoded = infer_codec::decode(
        "m",
        None,
        Bytes::copy_from_slice(body),
        header_length,
        budget.reservation(),
    );
    match decoded {
        Ok(decoded) => {
            let mut request = decoded.request;
            let id = std::mem::take(&mut request.id);
            if let Err(e) = normalize(&model(), "m", &id, request) {
                client_error(&e, "normalize");
            }
        }
        Err(e) => client_error(&e, "http decode"),
    }
}

/// JSON tensor data for every datatype. Byte 0 picks the datatype, bytes
/// 1..3 the element count, the rest is the `data` text.
pub fn json_tensor_data(data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    let datatypes = DataType::ALL;
    let datatype = datatypes[usize::from(data[0]) % datatypes.len()];
    let expected = usize::from(u16::from_le_bytes([data[1], data[2]]));
    let Ok(text) = std::str::from_utf8(&data[3..]) else {
        return;
    };
    let Ok(raw) = serde_json::from_str::<&serde_json::value::RawValue>(text) else {
        return;
    };
    if let Err(e) = json_tensor::decode("X", datatype, raw, expected, &mut Reservation::default()) {
        client_error(&e, "json data");
    }
}

/// Runs `f`, returning what it allocated at its peak, without losing the
/// peak of the run around it.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let outer = PEAK.load(Ordering::Relaxed);
    let base = LIVE.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    let peak = PEAK.load(Ordering::Relaxed);
    PEAK.fetch_max(outer, Ordering::Relaxed);
    (out, peak.saturating_sub(base))
}

/// A protobuf message decoded as the server's codec does: its decoded size
/// (nereid_proto::footprint) admitted against `budget` first. Checks the
/// estimate holds: prost never allocates more than it said.
fn admitted<M: Message + Default + prost::Name>(wire: &Bytes, budget: &mut Reservation) -> Option<M> {
    let name = M::full_name();
    let estimate = footprint(&name, wire).expect("a known message type");
    if let Err(e) = budget.grow(estimate) {
        client_error(&Error::from(e), "admission");
        return None;
    }
    let (decoded, peak) = peak_of(|| M::decode(wire.clone()));
    assert!(
        peak <= estimate,
        "{name}: prost allocated {peak} bytes decoding {} wire bytes; footprint said {estimate}",
        wire.len()
    );
    decoded.ok()
}

/// Converts a decoded ModelInferRequest and puts it through the checks.
fn convert_and_check(message: ModelInferRequest) {
    match nereid_server::grpc::convert::request(message) {
        Ok(mut request) => {
            let id = std::mem::take(&mut request.id);
            if let Err(e) = normalize(&model(), "m", &id, request) {
                client_error(&e, "normalize");
            }
        }
        Err(e) => client_error(&e, "grpc convert"),
    }
}

/// The decode budget of the gRPC targets: what the memory property allows
/// beyond the input.
fn grpc_budget(data: &[u8]) -> std::sync::Arc<MemoryBudget> {
    MemoryBudget::new((FACTOR - 2) * data.len() + ALLOWANCE / 2)
}

/// A gRPC ModelInferRequest as protobuf bytes (ModelInfer's message),
/// admitted by its decoded size, decoded, then into the core request and
/// through the request checks.
pub fn grpc_infer_request(data: &[u8]) {
    let wire = Bytes::copy_from_slice(data);
    let budget = grpc_budget(data);
    if let Some(message) = admitted::<ModelInferRequest>(&wire, &mut budget.reservation()) {
        convert_and_check(message);
    }
}

/// A ModelStreamInfer request body: gRPC frames (a 5-byte prefix, then a
/// ModelInferRequest) one after another, each admitted, decoded and
/// converted in turn as the stream's reader does, under one budget.
pub fn grpc_stream_messages(data: &[u8]) {
    use nereid_proto::frame::{PREFIX_LEN, Prefix};
    let body = Bytes::copy_from_slice(data);
    let budget = grpc_budget(data);
    let mut at = 0;
    while let Some(prefix) = Prefix::read(&body[at..]) {
        let start = at + PREFIX_LEN;
        let Some(end) = start.checked_add(prefix.length).filter(|end| *end <= body.len()) else {
            return; // the stream ends inside a message: tonic's error
        };
        if prefix.flag != 0 {
            return; // compressed without an encoding: refused by framing
        }
        let mut reservation = budget.reservation();
        match admitted::<ModelInferRequest>(&body.slice(start..end), &mut reservation) {
            Some(message) => convert_and_check(message),
            None => return,
        }
        at = end;
    }
}

/// A control endpoint's body (repository index, load and unload, settings,
/// shared-memory registration): its members, and each value in every
/// shape an endpoint reads, a load's `parameters` one level down.
pub fn control_body(data: &[u8]) {
    use nereid_server::http::control_json::{self as json, Kind, Members};
    let members = match Members::of_body(data) {
        Ok(members) => members,
        Err(e) => return client_error(&e, "control body"),
    };
    for (key, value) in &members.0 {
        let _ = (
            json::as_bool(value),
            json::as_i64(value),
            json::as_u64(value),
            json::as_string(value),
        );
        let _ = json::as_strings(value);
        let _ = json::shown(value);
        if json::kind(value) == Kind::Object {
            match Members::of_value(key, value) {
                Ok(inner) => {
                    for (_, value) in &inner.0 {
                        let _ = json::as_string(value);
                    }
                }
                Err(e) => client_error(&e, "control object"),
            }
        }
    }
}

/// The generate extension's body (`/generate`, `/generate_stream`) for a
/// model with a text, a variable and a fixed-shape input.
pub fn generate_body(data: &[u8]) {
    static CONFIG: std::sync::LazyLock<nereid_proto::inference::ModelConfig> = std::sync::LazyLock::new(|| {
        text::parse(
            r#"name: "g" max_batch_size: 0
               input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] },
                       { name: "IN" data_type: TYPE_INT32 dims: [ -1 ] optional: true },
                       { name: "GRID" data_type: TYPE_FP32 dims: [ 2, 3 ] optional: true } ]
               output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]"#,
        )
        .expect("the generate model config parses")
    });
    let budget = MemoryBudget::new(64 * data.len() + (1 << 20));
    if let Err(e) = nereid_server::http::generate::decode(&CONFIG, data, budget.reservation()) {
        client_error(&e, "generate");
    }
}

/// What nereid-gateway reads of a request to route it: the model in an
/// HTTP path (byte 0 even), or in the first gRPC message of a body (odd).
pub fn gateway_request(data: &[u8]) {
    let Some((&which, rest)) = data.split_first() else {
        return;
    };
    if which % 2 == 0 {
        if let Ok(path) = std::str::from_utf8(rest) {
            let _ = nereid_gateway::model_name::from_http_path(path);
        }
    } else if let Ok(Some(name)) = nereid_gateway::model_name::from_grpc_message(rest)
        && !name.is_empty()
    {
        assert!(
            rest.windows(name.len()).any(|w| w == name.as_bytes()),
            "a name not in the message"
        );
    }
}

/// Serialized BYTES tensors: counting, and checking against a shape.
pub fn bytes_elements(data: &[u8]) {
    if let Err(e) = count_bytes_elements(data) {
        client_error(&e, "bytes count");
    }
    let claimed = i64::from(data.first().copied().unwrap_or(0));
    let tensor = Tensor::new("S", DataType::Bytes, vec![claimed], Bytes::copy_from_slice(data));
    if let Err(e) = tensor.check_data_size() {
        client_error(&e, "bytes size");
    }
}

/// gzip (even first byte) or deflate bodies, inflated under a limit.
pub fn decompress(data: &[u8]) {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let encoding = if which % 2 == 0 {
        compression::Encoding::Gzip
    } else {
        compression::Encoding::Deflate
    };
    if let Err(e) = compression::decompress(
        encoding,
        body,
        INFLATE_LIMIT,
        SizeLimit::Input,
        &mut Reservation::default(),
    ) {
        client_error(&e, "decompress");
    }
}

/// config.pbtxt text, then the checks a loaded config goes through.
pub fn config_pbtxt(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match text::parse(text) {
        Ok(config) => check_config(&config),
        Err(e) => client_error(&e, "pbtxt"),
    }
}

/// The repository API's JSON config override, and as a merge patch.
pub fn config_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match config_json::from_json(text) {
        Ok(config) => check_config(&config),
        Err(e) => client_error(&e, "json config"),
    }
    if let Err(e) = config_json::merge_patch(&model(), text) {
        client_error(&e, "json patch");
    }
}

fn check_config(config: &nereid_proto::inference::ModelConfig) {
    if let Err(e) = file_names::check(config) {
        client_error(&e, "file names");
    }
    if let Err(e) = validate::validate(config) {
        client_error(&e, "validate");
    }
}
