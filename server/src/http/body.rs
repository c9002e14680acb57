//! Reading a request body within its limits: size, time and the server's
//! memory budget.
//!
//! The body is read frame by frame, so an oversized body is refused while it
//! streams in and never buffered whole; every frame is reserved in the
//! [`MemoryBudget`](crate::memory_budget::MemoryBudget) before it is kept
//! (all at once when `Content-Length` announces the size, so a request that
//! cannot fit is refused before its first byte is read); a client that
//! trickles its body is cut off after the body timeout. A compressed body is
//! inflated under the same size limit and budget.

use std::task::Poll;
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, header};
use http_body_util::BodyExt;

use super::compression;
use crate::error::{Error, Result};
use crate::memory_budget::{Exhausted, Reservation};

/// The limits every request body is read under.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body, before and after decompression (`--http-max-input-size`).
    pub max_size: usize,
    /// Longest time from the request's headers to its last body byte.
    pub timeout: Duration,
    /// Which limit `max_size` is, for the refusal.
    pub kind: SizeLimit,
}

/// The limit a body is held to, named in its refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeLimit {
    /// An inference request's (`--http-max-input-size`).
    Input,
    /// A control request's (model repository, settings, shared memory):
    /// fixed, and far smaller, because its JSON is read into values.
    Control,
}

impl SizeLimit {
    /// The refusal of a body (or its inflated form) over `limit` bytes.
    pub fn refusal(self, inflated: bool, limit: usize) -> Error {
        let what = if inflated {
            "decompressed request size"
        } else {
            "request size"
        };
        Error::invalid(match self {
            SizeLimit::Input => format!(
                "{what} exceeds the maximum allowed input size of {limit} bytes. Use --http-max-input-size to increase the limit."
            ),
            SizeLimit::Control => {
                format!(
                    "{what} exceeds the maximum of {limit} bytes of a control request (repository, settings, shared memory)"
                )
            }
        })
    }
}

/// A body as it arrived: its bytes, and how they are compressed.
pub struct Received {
    pub bytes: Bytes,
    pub encoding: Option<compression::Encoding>,
}

impl Received {
    /// The body inflated (within `max_size`, the inflated bytes added to
    /// `reservation`), or as it is when it was not compressed. CPU-heavy for
    /// a large compressed body: callers run it where decoding runs.
    pub fn inflate(self, limits: BodyLimits, reservation: &mut Reservation) -> Result<Bytes> {
        match self.encoding {
            Some(encoding) => compression::decompress(encoding, &self.bytes, limits.max_size, limits.kind, reservation),
            None => Ok(self.bytes),
        }
    }
}

/// Reads the whole body, inflating it if it was compressed. The bytes held
/// are added to `reservation`.
pub async fn read(body: Body, headers: &HeaderMap, limits: BodyLimits, reservation: &mut Reservation) -> Result<Bytes> {
    receive(body, headers, limits, reservation)
        .await?
        .inflate(limits, reservation)
}

/// Reads the whole body as it was sent; the bytes held are added to `reservation`.
pub async fn receive<B>(
    body: B,
    headers: &HeaderMap,
    limits: BodyLimits,
    reservation: &mut Reservation,
) -> Result<Received>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let encoding = compression::content_encoding(headers.get(header::CONTENT_ENCODING).and_then(|v| v.to_str().ok()))?;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    // The clock starts only if the body has to be waited for: a small one
    // has usually arrived with its headers, and then costs no timer.
    let mut collecting = std::pin::pin!(collect(body, announced, limits, reservation));
    let read = match futures::poll!(collecting.as_mut()) {
        Poll::Ready(read) => read,
        Poll::Pending => match tokio::time::timeout(limits.timeout, collecting).await {
            Ok(read) => read,
            Err(_) => {
                return Err(Error::invalid(format!(
                    "the request body did not arrive within {} s (--http-body-timeout-secs)",
                    limits.timeout.as_secs()
                )));
            }
        },
    };
    Ok(Received { bytes: read?, encoding })
}

async fn collect<B>(body: B, announced: Option<u64>, limits: BodyLimits, reservation: &mut Reservation) -> Result<Bytes>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let limit = limits.max_size;
    let too_large = || limits.kind.refusal(false, limit);
    // The announced size is reserved up front: a body that cannot fit is
    // refused before any of it is kept. Frames beyond it (a lying client)
    // are reserved as they come.
    //
    // A refused body is still read to its end (within the size limit and the
    // timeout), but discarded: a server that answers while the client is
    // still sending closes a socket with unread data, the kernel resets the
    // connection, and the client sees a reset instead of the 503.
    let mut refused: Option<Exhausted> = None;
    let mut prepaid = match announced {
        Some(n) if n > limit as u64 => return Err(too_large()),
        Some(n) => match reservation.grow(n as usize) {
            Ok(()) => n as usize,
            Err(e) => {
                refused = Some(e);
                0
            }
        },
        None => 0,
    };
    let expected = prepaid;
    let mut total = 0usize;
    // A body that arrives as one frame is kept as it is, without a copy.
    let mut first: Option<Bytes> = None;
    let mut buffer = BytesMut::new();
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Error::invalid(format!("failed to read the request body: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue; // trailers
        };
        total += data.len();
        if total > limit {
            return Err(too_large());
        }
        if refused.is_some() {
            continue;
        }
        let unpaid = data.len().saturating_sub(prepaid);
        prepaid -= data.len() - unpaid;
        if let Err(e) = reservation.grow(unpaid) {
            refused = Some(e);
            first = None;
            buffer = BytesMut::new();
            continue;
        }
        match first.take() {
            None if buffer.is_empty() => first = Some(data),
            Some(head) => {
                buffer.reserve(expected.max(head.len() + data.len()));
                buffer.extend_from_slice(&head);
                buffer.extend_from_slice(&data);
            }
            None => buffer.extend_from_slice(&data),
        }
    }
    match refused {
        Some(e) => Err(e.into()),
        None => Ok(first.unwrap_or_else(|| buffer.freeze())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory_budget::MemoryBudget;
    use futures::stream;

    fn limits(max_size: usize) -> BodyLimits {
        BodyLimits {
            max_size,
            timeout: Duration::from_secs(5),
            kind: SizeLimit::Input,
        }
    }

    fn chunked(chunks: Vec<&'static [u8]>) -> Body {
        Body::from_stream(stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, std::io::Error>(Bytes::from_static(c))),
        ))
    }

    #[tokio::test]
    async fn reads_and_reserves_every_byte() {
        let budget = MemoryBudget::new(100);
        let mut reservation = budget.reservation();
        let body = read(
            chunked(vec![b"hello ", b"world"]),
            &HeaderMap::new(),
            limits(64),
            &mut reservation,
        )
        .await
        .unwrap();
        assert_eq!(body, "hello world");
        assert_eq!(reservation.bytes(), 11);
    }

    #[tokio::test]
    async fn an_announced_body_that_cannot_fit_is_refused_before_reading() {
        let budget = MemoryBudget::new(10);
        let mut reservation = budget.reservation();
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_LENGTH, "11".parse().unwrap());
        let e = read(Body::from("hello world"), &headers, limits(64), &mut reservation)
            .await
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::ResourceExhausted);
        assert!(e.message().contains("--max-in-flight-bytes"), "{e}");
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn oversized_bodies_are_refused_while_streaming() {
        let mut reservation = Reservation::default();
        let e = read(
            chunked(vec![b"0123456789", b"0123456789"]),
            &HeaderMap::new(),
            limits(15),
            &mut reservation,
        )
        .await
        .unwrap_err();
        assert!(e.message().contains("maximum allowed input size of 15 bytes"), "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickling_body_times_out() {
        let slow = Body::from_stream(stream::unfold(0, |n| async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            (n < 100).then(|| (Ok::<_, std::io::Error>(Bytes::from_static(b"x")), n + 1))
        }));
        let e = read(slow, &HeaderMap::new(), limits(1000), &mut Reservation::default())
            .await
            .unwrap_err();
        assert!(e.message().contains("did not arrive within 5 s"), "{e}");
    }
}
