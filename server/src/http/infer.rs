//! The infer endpoint: body in under the limits, inflate and decode (off
//! the I/O threads when that is costly), infer, encode and compress (the
//! same), and the answer counted in the memory budget until it has been sent.
//!
//! [`infer`] is reached straight from the port's service
//! ([`super::port`]) for almost every request, and through the axum route
//! ([`route`]) for the rest (percent-encoded model names).

use std::fmt::Write as _;
use std::sync::LazyLock;

use axum::extract::{RawPathParams, Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, header};

use super::error::HttpError;
use super::{AppState, AppStateInner, body, compression, infer_codec, model_path};
use crate::error::Error;
use crate::memory_budget::Reservation;
use crate::request;
use crate::server::parse_version;

/// Bodies at least this large are decoded (and responses at least this
/// large encoded) on the blocking pool, not on the I/O threads: parsing
/// megabytes of JSON would stall every other connection on that thread.
const OFFLOAD_BYTES: usize = 64 << 10;

/// The headers an answer may carry beyond the standard ones, made once:
/// naming a header by a `&str` would allocate its name on every insert.
const HEADER_LENGTH: HeaderName = HeaderName::from_static(infer_codec::HEADER_LENGTH);
const QUEUE_DEPTH: HeaderName = HeaderName::from_static(nereid_proto::QUEUE_DEPTH_HEADER);

/// The axum route's handler (the port's service takes the common case
/// itself; see [`super::port`]).
pub(super) async fn route(State(s): State<AppState>, params: RawPathParams, request: Request) -> Response {
    let (model, version) = model_path(&params);
    let (parts, body) = request.into_parts();
    match infer(&s, model, version, &parts.headers, body).await {
        Ok(answer) => {
            let mut response = Response::new(axum::body::Body::new(answer.body));
            *response.headers_mut() = answer.headers;
            response
        }
        Err(e) => HttpError(e).into_response(),
    }
}

/// An infer answer: its headers, and its body.
pub(super) struct Answer {
    pub headers: HeaderMap,
    pub body: ReservedBody,
}

/// Infers with the request `body` for `model` (and `version_text`, "" for
/// the server's choice), as the path named them.
pub(super) async fn infer<B>(
    s: &AppStateInner,
    model: &str,
    version_text: &str,
    headers: &HeaderMap,
    body: B,
) -> Result<Answer, Error>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let version = parse_version(version_text)?;
    // As in Triton, an unknown model is reported before the body is read.
    let found = s.server.model(model, version_text)?;
    let mut reservation = s.options.budget.reservation();
    let received = body::receive(body, headers, s.options.body, &mut reservation).await?;
    let announced_header = headers.get(&HEADER_LENGTH).cloned();
    // What decoding costs: inflating, or parsing the JSON (the whole body;
    // with binary tensors only a header, and the tensors are not copied).
    let json_length = announced_header
        .as_ref()
        .and_then(|v| v.to_str().ok()?.trim().parse::<usize>().ok())
        .unwrap_or(received.bytes.len());
    let large = received.encoding.is_some() || json_length >= OFFLOAD_BYTES;
    let limits = s.options.body;
    let decode = move |model: &str| {
        let body = received.inflate(limits, &mut reservation)?;
        let header_length = header_length(announced_header.as_ref(), body.len())?;
        infer_codec::decode(model, version, body, header_length, reservation)
    };
    let decoded = if large {
        let model_name = model.to_string();
        offload(move || decode(&model_name)).await?
    } else {
        decode(model)?
    };
    let binary_outputs = decoded.binary_outputs;
    let mut request = decoded.request;
    request.trace_parent = request::trace_parent(super::trace_parent(headers));
    let response = s.server.infer_on(&found, request).await?;
    drop(found);
    let output_bytes: usize = response.outputs.iter().map(|t| t.data.len()).sum();
    let queue_depth = response.queue_depth;
    let compress = compression::accepted(headers.get(header::ACCEPT_ENCODING).and_then(|v| v.to_str().ok()));
    // The answer is reserved at its worst case before it is written, then
    // counted at what it holds until it has been sent. A refusal wastes the
    // inference, but the budget holds.
    let mut held = s.options.budget.reservation();
    held.grow(infer_codec::max_encoded_size(&response, &binary_outputs, compress))
        .map_err(|e| Error::from(e).context(format_args!("the answer of model '{}' as JSON", response.model_name)))?;
    let encode = move || {
        let encoded = infer_codec::encode(&response, &binary_outputs, compress);
        (encoded.header_length, encoded.allocated, encoded.body)
    };
    let (binary_header, allocated, body) = if output_bytes >= OFFLOAD_BYTES {
        offload(move || Ok(encode())).await?
    } else {
        encode()
    };

    let mut reply = HeaderMap::with_capacity(4);
    let content_type = match binary_header {
        Some(_) => "application/octet-stream",
        None => "application/json",
    };
    reply.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    if let Some(n) = binary_header {
        reply.insert(HEADER_LENGTH, number(n));
    }
    if let Some(encoding) = compress {
        reply.insert(header::CONTENT_ENCODING, HeaderValue::from_static(encoding.as_str()));
    }
    if let Some(depth) = queue_depth {
        reply.insert(QUEUE_DEPTH, number(depth as usize));
    }
    held.shrink_to(allocated);
    Ok(Answer {
        headers: reply,
        body: ReservedBody::new(body, held),
    })
}

/// Numbers below this are header values made once: the JSON header's length
/// of a small answer and a queue's depth nearly always are, and making a
/// value from a number allocates.
const SMALL_NUMBERS: usize = 1024;

/// `n` as a header value.
fn number(n: usize) -> HeaderValue {
    static SMALL: LazyLock<Vec<HeaderValue>> = LazyLock::new(|| {
        // One text of all of them, kept for the process's life: a value
        // over static text is cloned without touching a reference count.
        let mut text = String::new();
        let mut ends = Vec::with_capacity(SMALL_NUMBERS);
        for n in 0..SMALL_NUMBERS {
            let _ = write!(text, "{n}");
            ends.push(text.len());
        }
        let text: &'static str = Box::leak(text.into_boxed_str());
        let mut start = 0;
        ends.into_iter()
            .map(|end| {
                let value = HeaderValue::from_static(&text[start..end]);
                start = end;
                value
            })
            .collect()
    });
    match SMALL.get(n) {
        Some(value) => value.clone(),
        None => HeaderValue::from(n),
    }
}

/// Runs CPU-heavy codec work on the blocking pool.
async fn offload<T: Send + 'static>(work: impl FnOnce() -> Result<T, Error> + Send + 'static) -> Result<T, Error> {
    tokio::task::spawn_blocking(work)
        .await
        .unwrap_or_else(|e| Err(Error::internal(format!("decoding failed: {e}"))))
}

/// A response body that keeps its bytes counted in the memory budget until sent.
pub(super) struct ReservedBody {
    data: Option<Bytes>,
    _reservation: Reservation,
}

impl ReservedBody {
    pub(super) fn new(data: Bytes, reservation: Reservation) -> Self {
        ReservedBody {
            data: Some(data),
            _reservation: reservation,
        }
    }
}

impl http_body::Body for ReservedBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Ready(self.get_mut().data.take().map(|d| Ok(http_body::Frame::data(d))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

/// Parses `Inference-Header-Content-Length` against the body length.
fn header_length(value: Option<&HeaderValue>, body_len: usize) -> Result<Option<usize>, Error> {
    let Some(value) = value else {
        return Ok(None);
    };
    let text = value.to_str().unwrap_or("").trim();
    let n: i64 = text
        .parse()
        .map_err(|_| Error::invalid(format!("Unable to parse Inference-Header-Content-Length, got: {text}")))?;
    if n < 0 || n as u64 > body_len as u64 {
        return Err(Error::invalid(format!(
            "inference header size should be in range (0, {body_len}), got: {n}"
        )));
    }
    Ok(Some(n as usize))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_become_their_decimal_text() {
        for n in [0, 7, 10, 99, 100, 1023, 1024, 65_536, usize::MAX] {
            assert_eq!(number(n).to_str().unwrap(), n.to_string(), "{n}");
        }
    }

    #[test]
    fn the_inference_header_length_must_fit_the_body() {
        let value = |s: &'static str| HeaderValue::from_static(s);
        assert_eq!(header_length(None, 10).unwrap(), None);
        assert_eq!(header_length(Some(&value(" 4 ")), 10).unwrap(), Some(4));
        let e = header_length(Some(&value("11")), 10).unwrap_err();
        assert!(e.message().contains("range (0, 10), got: 11"), "{e}");
        let e = header_length(Some(&value("x")), 10).unwrap_err();
        assert!(
            e.message().contains("Unable to parse Inference-Header-Content-Length"),
            "{e}"
        );
    }
}
