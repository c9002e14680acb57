//! ModelInfer, the one call paid for on every inference, answered without
//! tonic's router and codec.
//!
//! Behind the same layers as every other call (in-flight count, restricted
//! protocols, memory budget and body timeout), a unary ModelInfer is read,
//! decoded, run and encoded here: the request message is decoded straight
//! from the HTTP/2 frame it came in (no copy into a decode buffer when it
//! fits one frame), and the answer is one buffer written once, followed by
//! the `grpc-status` trailers. tonic's generic unary path (its router,
//! streaming decoder, encoder body and four nested body adapters) cost 17
//! of the 71 heap allocations of an identity call and a tenth to a quarter
//! of its CPU (docs/benchmarks-log.md, entry 11). Every other call, and a
//! ModelInfer whose message is compressed (`grpc-encoding`), goes to tonic
//! as before, so the two paths answer the same: the handler is shared, and
//! the framing errors below carry tonic's codes and words.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use futures::future::Either;
use http::{HeaderMap, HeaderValue};
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use nereid_proto::frame::{self, FrameError, PREFIX_LEN, Prefix};
use nereid_proto::inference::ModelInferRequest;
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::metadata::{GRPC_CONTENT_TYPE, MetadataMap};
use tower::{Layer, Service};

use crate::server::InferenceServer;

/// The call this module answers.
const PATH: &str = "/inference.GRPCInferenceService/ModelInfer";

#[derive(Clone)]
pub struct ModelInferLayer {
    server: Arc<InferenceServer>,
    max_message_size: usize,
}

impl ModelInferLayer {
    /// `max_message_size` bounds the request and the response, as tonic's
    /// decoding and encoding limits do for the other calls.
    pub fn new(server: Arc<InferenceServer>, max_message_size: usize) -> Self {
        ModelInferLayer {
            server,
            max_message_size,
        }
    }
}

impl<S> Layer<S> for ModelInferLayer {
    type Service = ModelInferService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ModelInferService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Clone)]
pub struct ModelInferService<S> {
    inner: S,
    layer: ModelInferLayer,
}

type Answer = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

impl<S> Service<http::Request<Body>> for ModelInferService<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Either<S::Future, Answer>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != PATH || is_compressed(request.headers()) {
            return Either::Left(self.inner.call(request));
        }
        let layer = self.layer.clone();
        Either::Right(Box::pin(async move {
            Ok(answer(&layer.server, layer.max_message_size, request)
                .await
                .unwrap_or_else(Status::into_http))
        }))
    }
}

/// A message compressed with anything but `identity`: tonic knows which
/// encodings this server takes and how to refuse the others.
fn is_compressed(headers: &HeaderMap) -> bool {
    headers
        .get("grpc-encoding")
        .is_some_and(|encoding| encoding.as_bytes() != b"identity")
}

async fn answer(
    server: &InferenceServer,
    max_message_size: usize,
    request: http::Request<Body>,
) -> Result<http::Response<Body>, Status> {
    let (parts, body) = request.into_parts();
    let (message, trailers) = read_message(body, max_message_size).await?;
    // As every other call's: its decoded size admitted first (this runs in
    // the budget layer's allowance), then a message that does not parse is
    // INTERNAL, as with tonic's prost decoder.
    nereid_proto::codec::admit::<ModelInferRequest>(&message)?;
    let message = ModelInferRequest::decode(message).map_err(|e| Status::internal(e.to_string()))?;
    let mut headers = parts.headers;
    if let Some(trailers) = trailers {
        headers.extend(trailers);
    }
    let request = tonic::Request::from_parts(MetadataMap::from_headers(headers), parts.extensions, message);
    let (metadata, reply, extensions) = super::infer(server, request).await?.into_parts();
    let data = encode(&reply, max_message_size)?;
    let mut response = http::Response::new(Body::new(UnaryBody {
        data: Some(data),
        trailers: true,
    }));
    *response.version_mut() = http::Version::HTTP_2;
    *response.headers_mut() = metadata.into_headers();
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, GRPC_CONTENT_TYPE);
    *response.extensions_mut() = extensions;
    Ok(response)
}

/// Reads the whole body of a unary call and returns its message (the
/// bytes after the prefix) and the trailers, if the client sent any.
/// A message that arrived in one frame is a slice of it.
async fn read_message(mut body: Body, limit: usize) -> Result<(Bytes, Option<HeaderMap>), Status> {
    let mut first = Bytes::new();
    let mut joined: Option<BytesMut> = None;
    let mut length = None;
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let data = match frame?.into_data() {
            Ok(data) => data,
            Err(frame) => {
                trailers = frame.into_trailers().ok();
                continue;
            }
        };
        match &mut joined {
            Some(buffer) => buffer.extend_from_slice(&data),
            None if first.is_empty() => first = data,
            None => {
                let mut buffer = BytesMut::with_capacity(first.len() + data.len());
                buffer.extend_from_slice(&first);
                buffer.extend_from_slice(&data);
                joined = Some(buffer);
            }
        }
        if length.is_none() {
            let received = joined.as_deref().unwrap_or(&first);
            // Refused as soon as the prefix is in, before the rest is held.
            if let Some(prefix) = Prefix::read(received) {
                length = Some(checked_length(prefix, limit)?);
            }
        }
    }
    let received = joined.map_or(first, BytesMut::freeze);
    let Some(length) = length else {
        return Err(match received.is_empty() {
            true => Status::internal("Missing request message."),
            false => Status::internal("Unexpected EOF decoding stream."),
        });
    };
    if received.len() - PREFIX_LEN < length {
        return Err(Status::internal("Unexpected EOF decoding stream."));
    }
    Ok((received.slice(PREFIX_LEN..PREFIX_LEN + length), trailers))
}

/// Checks a message's prefix and returns the message's length.
fn checked_length(prefix: Prefix, limit: usize) -> Result<usize, Status> {
    match prefix.flag {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ));
        }
        flag => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {flag} (valid flags are 0 and 1), while sending request"
            )));
        }
    }
    let length = prefix.length;
    if length > limit {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found {length} bytes, the limit is: {limit} bytes"
        )));
    }
    Ok(length)
}

/// The answer's prefix and message in one buffer.
fn encode(reply: &impl Message, limit: usize) -> Result<Bytes, Status> {
    frame::encode_within(reply, limit).map_err(|e| match e {
        FrameError::OverLimit { length, limit } => Status::out_of_range(format!(
            "Error, encoded message length too large: found {length} bytes, the limit is: {limit} bytes"
        )),
        FrameError::TooLarge(length) => Status::resource_exhausted(format!(
            "Cannot return body with more than 4GB of data but got {length} bytes"
        )),
        FrameError::Encode(e) => Status::internal(format!("Error encoding: {e}")),
    })
}

/// A unary answer: its one message, then `grpc-status: 0`.
struct UnaryBody {
    data: Option<Bytes>,
    trailers: bool,
}

impl http_body::Body for UnaryBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if std::mem::take(&mut this.trailers) {
            let mut trailers = HeaderMap::with_capacity(1);
            trailers.insert(Status::GRPC_STATUS, HeaderValue::from_static("0"));
            return Poll::Ready(Some(Ok(Frame::trailers(trailers))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_none() && !self.trailers
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.data.as_ref().map_or(0, |d| d.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use http_body::Body as _;

    use super::*;

    /// `message` framed, with `flag` where the compressed flag goes.
    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut out = frame::frame(message).unwrap().to_vec();
        out[0] = flag;
        out
    }

    /// A body that arrives in the given chunks.
    fn body(chunks: Vec<Vec<u8>>) -> Body {
        let frames = chunks.into_iter().map(|c| Ok::<_, Status>(Frame::data(Bytes::from(c))));
        Body::new(http_body_util::StreamBody::new(futures::stream::iter(frames)))
    }

    async fn read(chunks: Vec<Vec<u8>>, limit: usize) -> Result<Bytes, Status> {
        read_message(body(chunks), limit).await.map(|(m, _)| m)
    }

    #[tokio::test]
    async fn a_message_in_one_frame_is_a_slice_of_it_and_split_ones_are_joined() {
        let whole = framed(0, b"hello");
        let frame = Bytes::from(whole.clone());
        let (message, trailers) = read_message(Body::new(http_body_util::Full::new(frame.clone())), 100)
            .await
            .unwrap();
        assert_eq!(message, &b"hello"[..]);
        assert!(trailers.is_none());
        assert_eq!(message.as_ptr(), frame[PREFIX_LEN..].as_ptr(), "not copied");

        let split = vec![whole[..2].to_vec(), whole[2..6].to_vec(), whole[6..].to_vec()];
        assert_eq!(read(split, 100).await.unwrap(), &b"hello"[..]);
    }

    #[tokio::test]
    async fn framing_errors_carry_tonics_codes() {
        let cases = [
            (vec![], tonic::Code::Internal, "Missing request message."),
            (
                vec![vec![0, 0, 0]],
                tonic::Code::Internal,
                "Unexpected EOF decoding stream.",
            ),
            (
                vec![framed(0, b"hello")[..7].to_vec()],
                tonic::Code::Internal,
                "Unexpected EOF",
            ),
            (
                vec![framed(1, b"x")],
                tonic::Code::Internal,
                "compressed-flag but no grpc-encoding",
            ),
            (
                vec![framed(7, b"x")],
                tonic::Code::Internal,
                "invalid compression flag: 7",
            ),
            (
                vec![framed(0, &[0; 11])],
                tonic::Code::OutOfRange,
                "found 11 bytes, the limit is: 10 bytes",
            ),
        ];
        for (chunks, code, words) in cases {
            let status = read(chunks.clone(), 10).await.unwrap_err();
            assert_eq!(status.code(), code, "{chunks:?}: {status:?}");
            assert!(status.message().contains(words), "{chunks:?}: {status:?}");
        }
    }

    #[tokio::test]
    async fn an_oversized_message_is_refused_before_the_rest_of_it_arrives() {
        // The prefix says 1 MiB; the stream never ends after it.
        let mut prefix = vec![0];
        prefix.extend_from_slice(&(1u32 << 20).to_be_bytes());
        let frames = futures::stream::iter([Ok::<_, Status>(Frame::data(Bytes::from(prefix)))])
            .chain(futures::stream::pending());
        let body = Body::new(http_body_util::StreamBody::new(frames));
        let status = read_message(body, 1024).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::OutOfRange);
    }

    #[tokio::test]
    async fn the_answer_is_its_message_then_status_ok() {
        let reply = nereid_proto::inference::ModelInferResponse {
            model_name: "identity".into(),
            ..Default::default()
        };
        let data = encode(&reply, 1024).unwrap();
        assert_eq!(&data[..PREFIX_LEN], &[0, 0, 0, 0, reply.encoded_len() as u8]);
        let mut body = UnaryBody {
            data: Some(data.clone()),
            trailers: true,
        };
        assert_eq!(body.size_hint().exact(), Some(data.len() as u64));
        let frames = http_body_util::BodyExt::collect(&mut body).await.unwrap();
        assert_eq!(frames.trailers().unwrap()["grpc-status"], "0");
        assert_eq!(frames.to_bytes(), data);
        assert!(body.is_end_stream());

        let status = encode(&reply, 3).unwrap_err();
        assert_eq!(status.code(), tonic::Code::OutOfRange);
    }

    #[test]
    fn only_identity_encoding_stays_here() {
        let mut headers = HeaderMap::new();
        assert!(!is_compressed(&headers));
        headers.insert("grpc-encoding", HeaderValue::from_static("identity"));
        assert!(!is_compressed(&headers));
        headers.insert("grpc-encoding", HeaderValue::from_static("gzip"));
        assert!(is_compressed(&headers));
    }
}
