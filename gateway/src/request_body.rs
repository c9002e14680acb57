//! Reading a client's request body: whole (it can then be sent again on a
//! retry by cloning the chunk list: reference counts, not data), or only
//! until its first chunks name the model (a stream, passed on as it comes).
//! Chunks are `Bytes` handed on as they came: nothing is joined or copied.

use bytes::Bytes;
use http_body::Body;
use http_body_util::BodyExt;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a client's body could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("the request body is larger than the gateway's limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("reading the request body: {0}")]
    Client(BoxError),
}

/// Reads the chunks of `body` while `more` says more are needed (given the
/// chunks so far and their total length), up to `limit` bytes. Returns the
/// chunks and the body, which is `None` when it ended.
pub async fn read_while<B>(
    mut body: B,
    limit: usize,
    mut more: impl FnMut(&[Bytes], usize) -> bool,
) -> Result<(Vec<Bytes>, Option<B>), ReadError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut chunks = Vec::new();
    let mut total = 0;
    while more(&chunks, total) {
        let Some(frame) = body.frame().await else {
            return Ok((chunks, None));
        };
        // Trailers of a request are not part of KServe or gRPC requests: dropped.
        if let Ok(data) = frame.map_err(|e| ReadError::Client(e.into()))?.into_data() {
            total += data.len();
            if total > limit {
                return Err(ReadError::TooLarge { limit });
            }
            if !data.is_empty() {
                chunks.push(data);
            }
        }
    }
    let ended = body.is_end_stream();
    Ok((chunks, (!ended).then_some(body)))
}
