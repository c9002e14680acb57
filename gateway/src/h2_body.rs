//! Bodies on the gateway's own HTTP/2 streams, driven through the `h2`
//! crate directly: a pod's answer, a gRPC client's request.
//!
//! The gateway speaks h2 itself on its gRPC port and to every pod, rather
//! than through hyper, because what a proxy hop costs is mostly its
//! writes: hyper sends a request's HEADERS and DATA from two tasks, and so
//! in two writes, and each write to a loopback or pod socket costs a
//! wake-up on the other side. Queued on the h2 stream from one task, a
//! whole request or answer leaves in one write.

use std::future::poll_fn;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};

/// A received body: its data chunks, then its trailers.
#[derive(Debug)]
pub struct H2Body {
    stream: RecvStream,
    /// Whether every data chunk was read (the trailers come next).
    data_done: bool,
}

impl H2Body {
    pub fn new(stream: RecvStream) -> Self {
        H2Body {
            stream,
            data_done: false,
        }
    }

    /// The next data chunk. Its flow-control window is given back as soon
    /// as it arrives: the gateway holds a chunk only until it has passed it
    /// on, and what it may hold at once is bounded by the window itself.
    pub fn poll_chunk(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, h2::Error>>> {
        if self.data_done {
            return Poll::Ready(None);
        }
        let chunk = ready!(self.stream.poll_data(cx));
        match &chunk {
            Some(Ok(data)) => {
                // Fails only for a stream already reset, which the next
                // poll reports.
                let _ = self.stream.flow_control().release_capacity(data.len());
            }
            Some(Err(_)) | None => self.data_done = true,
        }
        Poll::Ready(chunk)
    }

    pub async fn chunk(&mut self) -> Option<Result<Bytes, h2::Error>> {
        poll_fn(|cx| self.poll_chunk(cx)).await
    }

    /// The trailers, once every chunk was read.
    pub async fn trailers(&mut self) -> Result<Option<HeaderMap>, h2::Error> {
        poll_fn(|cx| self.stream.poll_trailers(cx)).await
    }

    pub fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
    }
}

impl Body for H2Body {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        let this = self.get_mut();
        if let Some(chunk) = ready!(this.poll_chunk(cx)) {
            return Poll::Ready(Some(chunk.map(Frame::data)));
        }
        this.stream
            .poll_trailers(cx)
            .map(|trailers| trailers.transpose().map(|t| t.map(Frame::trailers)))
    }

    fn is_end_stream(&self) -> bool {
        self.stream.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// What came first: the next chunk of a body being passed on, or a reset
/// of the stream it is passed on to.
pub enum Next {
    Chunk(Option<Result<Bytes, h2::Error>>),
    Reset,
}

/// Polls `body` for its next chunk and, while none is there, `reset` (the
/// other stream's `poll_reset`), so that a peer that went away stops the
/// passing on even while the body is silent.
pub fn next_or_reset(
    cx: &mut Context<'_>,
    body: &mut H2Body,
    reset: impl FnOnce(&mut Context<'_>) -> Poll<Result<h2::Reason, h2::Error>>,
) -> Poll<Next> {
    if let Poll::Ready(chunk) = body.poll_chunk(cx) {
        return Poll::Ready(Next::Chunk(chunk));
    }
    reset(cx).map(|_| Next::Reset)
}

/// Sends `data` as fast as the peer's window allows, waiting for it to
/// open: a slow reader holds the writer back instead of filling the
/// gateway's memory. (A whole request or answer, bounded in size, is
/// queued at once instead, so that it leaves in one write.)
pub async fn send_paced(stream: &mut SendStream<Bytes>, mut data: Bytes) -> Result<(), h2::Error> {
    while !data.is_empty() {
        stream.reserve_capacity(data.len());
        let granted = match poll_fn(|cx| stream.poll_capacity(cx)).await {
            Some(granted) => granted?,
            // The stream can send no more: the peer reset or closed it.
            None => return Err(h2::Reason::CANCEL.into()),
        };
        if granted > 0 {
            let piece = data.split_to(granted.min(data.len()));
            stream.send_data(piece, false)?;
        }
    }
    Ok(())
}
