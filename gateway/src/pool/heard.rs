//! A byte stream that notes whether the peer has sent anything on it.
//!
//! A pod's first bytes on an HTTP/2 connection are its preface, which h2
//! (behind nereid-server's cork) flushes before it reads the gateway's.
//! So a connection that failed before the pod said anything carried no
//! request the pod ran: it sat in the pod's listen backlog, or the pod
//! closed it unread, and every request on it may go to another pod.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, ReadBuf};

/// The stream, and the flag its first received byte sets.
pub struct Heard<T> {
    io: T,
    heard: Arc<AtomicBool>,
}

impl<T> Heard<T> {
    pub fn new(io: T) -> Self {
        Heard {
            io,
            heard: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Set once the peer's first byte has been read.
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.heard)
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Heard<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.heard.store(true, Ordering::Release);
        }
        Poll::Ready(Ok(()))
    }
}

crate::write_through::write_through!(Heard);

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn only_a_received_byte_sets_the_flag() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut stream = Heard::new(ours);
        let heard = stream.flag();
        stream.write_all(b"preface").await.unwrap();
        let mut buf = [0u8; 7];
        theirs.read_exact(&mut buf).await.unwrap();
        assert!(!heard.load(Ordering::Acquire), "writing is not hearing");
        theirs.write_all(b"settings").await.unwrap();
        let mut buf = [0u8; 8];
        stream.read_exact(&mut buf).await.unwrap();
        assert!(heard.load(Ordering::Acquire));
    }

    #[tokio::test]
    async fn an_end_of_stream_is_not_hearing() {
        let (ours, theirs) = tokio::io::duplex(64);
        let mut stream = Heard::new(ours);
        let heard = stream.flag();
        drop(theirs);
        let mut buf = Vec::new();
        stream.read_to_end(&mut buf).await.unwrap();
        assert!(!heard.load(Ordering::Acquire));
    }
}
