//! Reading a client's request body: whole (it can then be sent again on a
//! retry by cloning the chunk list: reference counts, not data), or only
//! until its first chunks name the model (a stream, passed on as it comes).
//! Chunks are `Bytes` handed on as they came: nothing is joined or copied.
//!
//! Every read is bounded three ways ([`crate::limits`]): its size, the time
//! it may take, and the gateway's budget of bytes buffered at once, which
//! each chunk is charged to before it is kept.

use std::time::Duration;

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;

use crate::limits::flag;
use crate::memory_budget::{Charge, OverBudget};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The bounds on one body read.
#[derive(Clone, Copy, Debug)]
pub struct BodyLimits {
    pub max_bytes: usize,
    /// What sets `max_bytes`, for the refusal.
    pub max_bytes_flag: &'static str,
    /// How long the body may take to arrive.
    pub timeout: Duration,
}

/// Why a client's body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the request body is larger than the gateway's limit of {limit} bytes ({flag})")]
    TooLarge { limit: usize, flag: &'static str },
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    #[error(
        "the request body did not arrive whole within {} s ({flag})",
        .after.as_secs(),
        flag = flag::BODY_TIMEOUT
    )]
    TimedOut { after: Duration },
    #[error("reading the request body: {0}")]
    Client(BoxError),
}

/// Reads the chunks of `body` while `more` says more are needed (given the
/// chunks so far and their total length), within `limits`, charging each
/// chunk to `charge` before it is kept. Returns the chunks and the body,
/// which is `None` when it ended.
pub async fn read_while<B>(
    body: B,
    limits: BodyLimits,
    charge: &mut Charge,
    more: impl FnMut(&[Bytes], usize) -> bool,
) -> Result<(Vec<Bytes>, Option<B>), ReadError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let read = read_chunks(body, Vec::new(), limits, charge, more);
    tokio::time::timeout(limits.timeout, read)
        .await
        .unwrap_or_else(|_| Err(ReadError::TimedOut { after: limits.timeout }))
}

/// Reads the rest of `body` after the `chunks` [`read_while`] read of it
/// (and charged to `charge`), as if in the same read: its size counted
/// from the first chunk, and done by `deadline`, when that read began plus
/// `limits.timeout`. Returns every chunk, the first read's first.
pub async fn read_rest<B>(
    body: B,
    chunks: Vec<Bytes>,
    limits: BodyLimits,
    deadline: tokio::time::Instant,
    charge: &mut Charge,
) -> Result<Vec<Bytes>, ReadError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let read = read_chunks(body, chunks, limits, charge, |_, _| true);
    match tokio::time::timeout_at(deadline, read).await {
        Ok(read) => read.map(|(chunks, _)| chunks),
        Err(_) => Err(ReadError::TimedOut { after: limits.timeout }),
    }
}

async fn read_chunks<B>(
    mut body: B,
    mut chunks: Vec<Bytes>,
    limits: BodyLimits,
    charge: &mut Charge,
    mut more: impl FnMut(&[Bytes], usize) -> bool,
) -> Result<(Vec<Bytes>, Option<B>), ReadError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut total: usize = chunks.iter().map(Bytes::len).sum();
    while more(&chunks, total) {
        let Some(frame) = body.frame().await else {
            return Ok((chunks, None));
        };
        // Trailers of a request are not part of KServe or gRPC requests: dropped.
        if let Ok(data) = frame.map_err(|e| ReadError::Client(e.into()))?.into_data() {
            total += data.len();
            if total > limits.max_bytes {
                return Err(ReadError::TooLarge {
                    limit: limits.max_bytes,
                    flag: limits.max_bytes_flag,
                });
            }
            if !data.is_empty() {
                charge.add(data.len())?;
                chunks.push(data);
            }
        }
    }
    let ended = body.is_end_stream();
    Ok((chunks, (!ended).then_some(body)))
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::{Full, StreamBody};

    use super::*;
    use crate::memory_budget::MemoryBudget;

    const LIMITS: BodyLimits = BodyLimits {
        max_bytes: 100,
        max_bytes_flag: "--max-body-bytes",
        timeout: Duration::from_secs(60),
    };

    #[tokio::test]
    async fn every_kept_chunk_is_charged_until_the_charge_is_dropped() {
        let budget = MemoryBudget::new(50);
        let mut charge = Charge::new(&budget);
        let body = Full::new(Bytes::from_static(&[1; 40]));
        let (chunks, rest) = read_while(body, LIMITS, &mut charge, |_, _| true).await.unwrap();
        assert_eq!((chunks.concat().len(), rest.is_none()), (40, true));
        assert_eq!(budget.held(), 40);

        let mut other = Charge::new(&budget);
        let body = Full::new(Bytes::from_static(&[2; 20]));
        let refused = read_while(body, LIMITS, &mut other, |_, _| true).await.unwrap_err();
        assert!(matches!(refused, ReadError::OverBudget(_)), "{refused}");
        assert!(refused.to_string().contains("--max-in-flight-bytes"), "{refused}");
        drop((charge, other));
        assert_eq!(budget.held(), 0);
    }

    #[tokio::test]
    async fn a_body_too_large_names_its_limit() {
        let budget = MemoryBudget::new(1 << 20);
        let mut charge = Charge::new(&budget);
        let body = Full::new(Bytes::from_static(&[1; 101]));
        let refused = read_while(body, LIMITS, &mut charge, |_, _| true).await.unwrap_err();
        assert_eq!(
            refused.to_string(),
            "the request body is larger than the gateway's limit of 100 bytes (--max-body-bytes)"
        );
    }

    #[tokio::test]
    async fn a_body_read_in_two_steps_has_the_limits_of_one() {
        let budget = MemoryBudget::new(1 << 20);
        let chunk = |byte: u8| Ok::<_, Infallible>(http_body::Frame::data(Bytes::from(vec![byte; 40])));
        let body = || StreamBody::new(futures::stream::iter([chunk(1), chunk(2), chunk(3)]));
        let deadline = || tokio::time::Instant::now() + LIMITS.timeout;

        // 120 bytes in all: over the limit of 100, counted from the first.
        let mut charge = Charge::new(&budget);
        let (first, rest) = read_while(body(), LIMITS, &mut charge, |chunks, _| chunks.is_empty())
            .await
            .unwrap();
        assert_eq!(first.len(), 1);
        let refused = read_rest(rest.unwrap(), first, LIMITS, deadline(), &mut charge)
            .await
            .unwrap_err();
        assert!(matches!(refused, ReadError::TooLarge { limit: 100, .. }), "{refused}");
        drop(charge);
        assert_eq!(budget.held(), 0);

        // Within it: every chunk, in order, all charged.
        let limits = BodyLimits {
            max_bytes: 120,
            ..LIMITS
        };
        let mut charge = Charge::new(&budget);
        let (first, rest) = read_while(body(), limits, &mut charge, |chunks, _| chunks.is_empty())
            .await
            .unwrap();
        let chunks = read_rest(rest.unwrap(), first, limits, deadline(), &mut charge)
            .await
            .unwrap();
        assert_eq!(chunks.iter().map(|c| c[0]).collect::<Vec<_>>(), [1, 2, 3]);
        assert_eq!(budget.held(), 120);
    }

    #[tokio::test]
    async fn a_body_that_stops_short_times_out() {
        let budget = MemoryBudget::new(1 << 20);
        let mut charge = Charge::new(&budget);
        // One chunk, then nothing, and no end.
        let first = futures::stream::iter([Ok::<_, Infallible>(http_body::Frame::data(Bytes::from_static(b"abc")))]);
        let body = StreamBody::new(futures::StreamExt::chain(first, futures::stream::pending()));
        let limits = BodyLimits {
            timeout: Duration::from_millis(10),
            ..LIMITS
        };
        let refused = read_while(body, limits, &mut charge, |_, _| true).await.unwrap_err();
        assert!(matches!(refused, ReadError::TimedOut { .. }), "{refused}");
        assert!(refused.to_string().contains("--body-timeout-secs"), "{refused}");
        drop(charge);
        assert_eq!(budget.held(), 0);
    }
}
