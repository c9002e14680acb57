//! Triton's generate extension: `/generate` and `/generate_stream`.
//!
//! A text-oriented form of inference for generative models. The request is
//! one flat JSON object whose keys are the model's inputs (a value or an
//! array each, shaped by the model's dims), plus `id` and `parameters`; the
//! response is one flat object of the outputs (a value for one element, an
//! array for more) with `model_name`, `model_version` and `id`.
//!
//! `/generate` answers once. `/generate_stream` sends each response of the
//! request as a server-sent event (`data: {...}`), so a decoupled model's
//! responses arrive as the model makes them. The status is the first
//! response's, as in Triton: an error before it is an ordinary JSON error;
//! an error after it is an event `data: {"error": "..."}` that ends the
//! stream. A client that goes away cancels the request.

use std::convert::Infallible;
use std::fmt;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{RawPathParams, State};
use axum::response::IntoResponse;
use bytes::Bytes;
use futures::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, header};
use nereid_proto::inference::{ModelConfig, ModelInput};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::infer::ReservedBody;
use super::request_json::{JsonParameters, MAX_TENSORS};
use super::{AppState, HandlerResult, body, json_tensor, model_path};
use crate::error::{Error, Result};
use crate::memory_budget::Reservation;
use crate::model_config::input_datatype;
use crate::parameter::Parameters;
use crate::request::{self, InferRequest};
use crate::response::InferResponse;
use crate::server::parse_version;
use crate::tensor::Tensor;

/// `POST /v2/models/{m}[/versions/{v}]/generate`: one response.
pub(super) async fn generate(
    State(s): State<AppState>,
    p: RawPathParams,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    let request = receive(&s, &p, &headers, body).await?;
    let response = if s.server.is_decoupled(&request.model_name, request.model_version) {
        let model = request.model_name.clone();
        let mut responses = s.server.infer_stream(request)?;
        let first = responses.next().await.transpose()?;
        if responses.next().await.transpose()?.is_some() {
            return Err(Error::unsupported(format!(
                "model '{model}' answered with more than one response, which /generate cannot return: use /generate_stream"
            ))
            .into());
        }
        first.ok_or_else(|| Error::internal(format!("model '{model}' ended the request without a response")))?
    } else {
        s.server.infer(request).await?
    };
    let (json, reservation) = response_json(&response, s.options.budget.reservation())?;
    Ok((
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        Body::new(ReservedBody::new(json, reservation)),
    )
        .into_response())
}

/// `POST /v2/models/{m}[/versions/{v}]/generate_stream`: every response,
/// as server-sent events.
pub(super) async fn generate_stream(
    State(s): State<AppState>,
    p: RawPathParams,
    headers: HeaderMap,
    body: Body,
) -> HandlerResult {
    let request = receive(&s, &p, &headers, body).await?;
    let events: Body = if s.server.is_decoupled(&request.model_name, request.model_version) {
        let mut responses = s.server.infer_stream(request)?;
        // The status is the first response's.
        let first = responses.next().await.transpose()?;
        let budget = &s.options.budget;
        let first = first
            .map(|r| response_json(&r, budget.reservation()))
            .transpose()?
            .map(|(json, _)| event(&json));
        let budget = Arc::clone(budget);
        let rest =
            responses.map(
                move |response| match response.and_then(|r| response_json(&r, budget.reservation())) {
                    Ok((json, _)) => (event(&json), true),
                    Err(e) => (error_event(&e), false),
                },
            );
        Body::from_stream(events_until_error(first, rest))
    } else {
        let response = s.server.infer(request).await?;
        Body::from(event(&response_json(&response, s.options.budget.reservation())?.0))
    };
    Ok((
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        )],
        events,
    )
        .into_response())
}

/// The first event, then the rest up to and including the first error.
fn events_until_error(
    first: Option<Bytes>,
    rest: impl Stream<Item = (Bytes, bool)> + Send + 'static,
) -> impl Stream<Item = std::result::Result<Bytes, Infallible>> + Send + 'static {
    let rest = rest.scan(true, |going, (bytes, ok)| {
        let item = going.then_some(bytes);
        *going = ok;
        futures::future::ready(item)
    });
    futures::stream::iter(first).chain(rest).map(Ok)
}

fn event(json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(json.len() + 8);
    out.extend_from_slice(b"data: ");
    out.extend_from_slice(json);
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

fn error_event(error: &Error) -> Bytes {
    let json = serde_json::to_vec(&serde_json::json!({ "error": error.message() })).expect("an error serializes");
    event(&json)
}

/// Reads and decodes a generate request for the model in the path.
async fn receive(s: &AppState, p: &RawPathParams, headers: &HeaderMap, body: Body) -> Result<InferRequest> {
    let (model, version_text) = model_path(p);
    let version = parse_version(version_text)?;
    // As for infer, an unknown model is reported before the body is read.
    let config = s.server.model_config(model, version_text)?;
    let mut reservation = s.options.budget.reservation();
    let received = body::receive(body, headers, s.options.body, &mut reservation).await?;
    let body = received.inflate(s.options.body, &mut reservation)?;
    let mut request = decode(&config, &body, reservation)?;
    request.model_name = model.to_string();
    request.model_version = version;
    request.trace_parent = request::trace_parent(super::trace_parent(headers));
    Ok(request)
}

/// The generate JSON object as an inference request of `config`'s model
/// (`/generate` and `/generate_stream` alike).
pub fn decode(config: &ModelConfig, body: &[u8], mut reservation: Reservation) -> Result<InferRequest> {
    let parsed: GenerateJson<'_> = serde_json::from_slice(body)
        .map_err(|e| Error::invalid(format!("failed to parse the generate request JSON: {e}")))?;
    let batching = config.max_batch_size > 0;
    let mut inputs = Vec::with_capacity(parsed.inputs.len());
    for (name, value) in parsed.inputs {
        let Some(input) = config.input.iter().find(|i| i.name == name) else {
            let known: Vec<&str> = config.input.iter().map(|i| i.name.as_str()).collect();
            return Err(Error::invalid(format!(
                "unexpected key '{name}' in the generate request for model '{}': not one of its inputs ({}), 'id' or 'parameters'",
                config.name,
                known.join(", ")
            )));
        };
        let datatype =
            input_datatype(input).ok_or_else(|| Error::internal(format!("input '{name}' has no valid data_type")))?;
        let elements = json_tensor::count_elements(&name, value)?;
        let shape = shape_for(input, batching, elements)?;
        let data = json_tensor::decode(&name, datatype, value, elements, &mut reservation)?;
        inputs.push(Tensor::new(name, datatype, shape, data));
    }
    Ok(InferRequest {
        id: parsed.id.unwrap_or_default(),
        inputs,
        parameters: parsed.parameters,
        reservation,
        ..InferRequest::default()
    })
}

/// The shape of `elements` values for `input`: its dims (behind a batch of
/// one when the model batches), the first variable dim taking whatever the
/// fixed ones leave and any other variable dim 1.
fn shape_for(input: &ModelInput, batching: bool, elements: usize) -> Result<Vec<i64>> {
    let fixed: i64 = input.dims.iter().filter(|d| **d >= 0).product();
    let variable = input.dims.iter().any(|d| *d < 0);
    let elements = i64::try_from(elements).unwrap_or(i64::MAX);
    let fill = match (variable, fixed) {
        (true, f) if f > 0 && elements % f == 0 => elements / f,
        (false, f) if f == elements => 0,
        _ => {
            return Err(Error::invalid(format!(
                "input '{}' has {elements} elements, which its dims {:?} cannot hold",
                input.name, input.dims
            )));
        }
    };
    let mut filled = false;
    let mut shape: Vec<i64> = Vec::with_capacity(input.dims.len() + 1);
    if batching {
        shape.push(1);
    }
    for d in &input.dims {
        shape.push(match *d {
            d if d >= 0 => d,
            _ if !filled => {
                filled = true;
                fill
            }
            _ => 1,
        });
    }
    Ok(shape)
}

/// The generate response object: the outputs by name, each a value when
/// it has one element and a flat array otherwise. Written straight from
/// the tensors (a JSON value tree cost tens of bytes per element), into a
/// buffer reserved in the budget at its worst case first.
fn response_json(response: &InferResponse, mut reservation: Reservation) -> Result<(Bytes, Reservation)> {
    let text = |t: &str| 6 * t.len() + 4;
    let mut worst = 64 + text(&response.model_name) + text(&response.id);
    for tensor in &response.outputs {
        worst = worst
            .saturating_add(text(&tensor.name))
            .saturating_add(json_tensor::max_json_len(tensor.datatype, tensor.data.len()));
    }
    reservation
        .grow(worst)
        .map_err(|e| Error::from(e).context(format_args!("the answer of model '{}' as JSON", response.model_name)))?;
    let mut out = Vec::with_capacity(worst);
    serde_json::to_writer(&mut out, &ResponseJson(response)).map_err(|e| Error::internal(e.to_string()))?;
    reservation.shrink_to(out.len());
    Ok((Bytes::from(out), reservation))
}

struct ResponseJson<'a>(&'a InferResponse);

impl serde::Serialize for ResponseJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> std::result::Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let response = self.0;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("model_name", &response.model_name)?;
        map.serialize_entry("model_version", &response.model_version.to_string())?;
        if !response.id.is_empty() {
            map.serialize_entry("id", &response.id)?;
        }
        for tensor in &response.outputs {
            let data = json_tensor::Data {
                datatype: tensor.datatype,
                data: &tensor.data,
            };
            if data.len() == 1 {
                // One element: the value itself, not a list of one.
                let list = serde_json::to_string(&data).map_err(serde::ser::Error::custom)?;
                let one =
                    RawValue::from_string(list[1..list.len() - 1].to_string()).map_err(serde::ser::Error::custom)?;
                map.serialize_entry(&tensor.name, &one)?;
            } else {
                map.serialize_entry(&tensor.name, &data)?;
            }
        }
        map.end()
    }
}

/// The request object: `id`, `parameters`, and every other key an input
/// (its JSON text kept raw until the shape is known, as for infer).
struct GenerateJson<'a> {
    id: Option<String>,
    parameters: Parameters,
    inputs: Vec<(String, &'a RawValue)>,
}

impl<'de: 'a, 'a> serde::Deserialize<'de> for GenerateJson<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        struct ObjectVisitor<'a>(std::marker::PhantomData<&'a ()>);

        impl<'de: 'a, 'a> Visitor<'de> for ObjectVisitor<'a> {
            type Value = GenerateJson<'a>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of inputs, with optional 'id' and 'parameters'")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Self::Value, A::Error> {
                let mut out = GenerateJson {
                    id: None,
                    parameters: Parameters::new(),
                    inputs: Vec::new(),
                };
                while let Some(key) = map.next_key::<String>()? {
                    match key.as_str() {
                        "id" => out.id = Some(map.next_value()?),
                        "parameters" => out.parameters = map.next_value::<JsonParameters>()?.0,
                        _ if out.inputs.iter().any(|(k, _)| *k == key) => {
                            return Err(de::Error::custom(format!("input '{key}' appears more than once")));
                        }
                        _ if out.inputs.len() == MAX_TENSORS => {
                            return Err(de::Error::custom(format!("more than {MAX_TENSORS} inputs")));
                        }
                        _ => {
                            let value = map.next_value()?;
                            out.inputs.push((key, value));
                        }
                    }
                }
                Ok(out)
            }
        }

        deserializer.deserialize_map(ObjectVisitor(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::datatype::DataType;
    use crate::model_config::text::parse;
    use serde_json::Value;

    fn config(max_batch_size: i32) -> ModelConfig {
        parse(&format!(
            r#"name: "m" max_batch_size: {max_batch_size}
               input [ {{ name: "text_input" data_type: TYPE_STRING dims: [ 1 ] }},
                       {{ name: "IN" data_type: TYPE_INT32 dims: [ -1 ] }},
                       {{ name: "GRID" data_type: TYPE_FP32 dims: [ 2, -1 ] }} ]
               output [ {{ name: "OUT" data_type: TYPE_INT32 dims: [ -1 ] }} ]"#
        ))
        .unwrap()
    }

    #[test]
    fn keys_become_inputs_shaped_by_the_dims() {
        let body = br#"{"id": "r1", "text_input": "hello", "IN": [1, 2, 3], "GRID": [[1, 2, 3], [4, 5, 6]], "parameters": {"stream": true}}"#;
        let request = decode(&config(0), body, Reservation::default()).unwrap();
        assert_eq!(request.id, "r1");
        assert_eq!(request.parameters.get("stream").and_then(|p| p.as_bool()), Some(true));
        let shapes: Vec<(&str, &[i64])> = request
            .inputs
            .iter()
            .map(|t| (t.name.as_str(), t.shape.as_slice()))
            .collect();
        assert_eq!(shapes, [("text_input", &[1][..]), ("IN", &[3]), ("GRID", &[2, 3])]);
        assert_eq!(request.inputs[0].datatype, DataType::Bytes);
        assert_eq!(&request.inputs[0].data[4..], b"hello");
        // A batching model sees a batch of one.
        let batched = decode(&config(8), br#"{"IN": 5}"#, Reservation::default()).unwrap();
        assert_eq!(batched.inputs[0].shape, [1, 1]);
    }

    #[test]
    fn bad_requests_name_what_is_wrong() {
        for (body, needle) in [
            (&br#"{"nope": 1}"#[..], "unexpected key 'nope'"),
            (br#"{"GRID": [1, 2, 3]}"#, "input 'GRID' has 3 elements"),
            (br#"{"text_input": ["a", "b"]}"#, "input 'text_input' has 2 elements"),
            (br#"{"IN": "x"}"#, "'IN'"),
            (br#"{"IN": {"a": 1}}"#, "input 'IN'"),
            (br#"{"IN": 1, "IN": 2}"#, "appears more than once"),
            (br#"[1]"#, "failed to parse the generate request"),
        ] {
            let e = decode(&config(0), body, Reservation::default()).unwrap_err();
            assert!(e.message().contains(needle), "{}: {e}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn outputs_are_values_or_arrays() {
        let ints = |v: &[i32]| Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>());
        let response = InferResponse {
            model_name: "m".into(),
            model_version: 1,
            outputs: vec![
                Tensor::new("ONE", DataType::Int32, vec![1], ints(&[7])),
                Tensor::new("MANY", DataType::Int32, vec![1, 2], ints(&[1, 2])),
            ],
            ..InferResponse::default()
        };
        let json: Value = serde_json::from_slice(&response_json(&response, Reservation::default()).unwrap().0).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"model_name": "m", "model_version": "1", "ONE": 7, "MANY": [1, 2]})
        );
    }

    #[test]
    fn a_stream_ends_after_its_first_error() {
        let rest = futures::stream::iter([
            (Bytes::from_static(b"b"), true),
            (Bytes::from_static(b"error"), false),
            (Bytes::from_static(b"never"), true),
        ]);
        let events: Vec<Bytes> = futures::executor::block_on(
            events_until_error(Some(Bytes::from_static(b"a")), rest)
                .map(|e| e.unwrap())
                .collect(),
        );
        assert_eq!(events, [&b"a"[..], b"b", b"error"]);
    }
}
