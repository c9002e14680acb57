//! A byte stream whose small writes wait until the HTTP/2 connection driving
//! it has done everything it can in one turn, then leave in one write.
//!
//! h2 writes a DATA frame's payload straight from its buffer (vectored, not
//! copied) and flushes before it encodes the next frame, so a gRPC answer,
//! HEADERS + DATA + trailers, takes two writes however it was queued. Each
//! write to a socket is a system call here and a segment and a wake-up on
//! the other side. Corked, h2's writes are gathered (copied: what is held
//! is small) and the driver sends them when the connection's poll returns
//! ([`Cork::drive`]). A write of [`LIMIT`] or more, with nothing held, goes
//! straight to the stream, so a large tensor is never copied.
//!
//! The one flush that is honoured at once is the first: h2 flushes its
//! connection preface (SETTINGS) before it reads the peer's, so a server's
//! preface is on the wire before it has read any request. A client that
//! has heard nothing on a connection therefore knows that the server ran
//! nothing from it (nereid-gateway retries those requests elsewhere).
//!
//! Both halves live on the connection's task (h2's stream handles on other
//! tasks never touch the socket), so the lock around the stream is never
//! contended; it is there because the driver and h2 both hold the stream.
//!
//! Used by the gateway on both sides of its hop and by nereid-server on
//! every HTTP/2 connection it serves.

use std::future::{Future, poll_fn};
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// What is held before writing anyway, and the size of a write that is
/// never held.
pub const LIMIT: usize = 64 << 10;

struct State<T> {
    io: T,
    held: BytesMut,
    /// Why an uncorking write failed: the next read or write says it to h2.
    broken: Option<io::Error>,
    /// Whether the stream was flushed once (the preface went out).
    flushed: bool,
}

/// The stream, for h2 (or hyper) to read and write.
pub struct Corked<T> {
    state: Arc<Mutex<State<T>>>,
}

/// The handle the connection's driver sends the held writes with.
pub struct Cork<T>(Arc<Mutex<State<T>>>);

/// A stream split into the two.
pub fn cork<T>(io: T) -> (Corked<T>, Cork<T>) {
    let state = Arc::new(Mutex::new(State {
        io,
        held: BytesMut::with_capacity(16 << 10),
        broken: None,
        flushed: false,
    }));
    (
        Corked {
            state: Arc::clone(&state),
        },
        Cork(state),
    )
}

impl<T: AsyncWrite + Unpin> State<T> {
    /// Writes out everything held, then flushes the stream (a TLS stream
    /// may keep records it could not write yet until it is flushed).
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            match ready!(Pin::new(&mut self.io).poll_write(cx, &self.held))? {
                0 => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                written => self.held.advance(written),
            }
        }
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn take_broken(&mut self) -> io::Result<()> {
        match self.broken.take() {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    /// Holds `bufs` (returning their length), or, when they are large and
    /// nothing is held, writes them straight out.
    fn poll_write(&mut self, cx: &mut Context<'_>, bufs: &[IoSlice<'_>]) -> Poll<io::Result<usize>> {
        self.take_broken()?;
        let length: usize = bufs.iter().map(|b| b.len()).sum();
        if self.held.len() + length > LIMIT {
            ready!(self.poll_drain(cx))?;
        }
        if length >= LIMIT {
            return Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        }
        for buf in bufs {
            self.held.extend_from_slice(buf);
        }
        Poll::Ready(Ok(length))
    }
}

impl<T: AsyncWrite + Unpin> Cork<T> {
    /// Polls `future` (the HTTP/2 connection, or its handshake) and, each
    /// time it returns, writes out what it queued.
    pub async fn drive<F: Future + Unpin>(&self, future: &mut F) -> F::Output {
        poll_fn(|cx| {
            let polled = Pin::new(&mut *future).poll(cx);
            let mut state = self.0.lock();
            if let Poll::Ready(Err(error)) = state.poll_drain(cx) {
                // h2 hears of it on its next read or write, now.
                state.broken = Some(error);
                cx.waker().wake_by_ref();
            }
            polled
        })
        .await
    }
}

impl<T: AsyncRead + AsyncWrite + Unpin> AsyncRead for Corked<T> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let mut state = self.state.lock();
        state.take_broken()?;
        Pin::new(&mut state.io).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Corked<T> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.state.lock().poll_write(cx, &[IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.state.lock().poll_write(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    /// Holds on: [`Cork::drive`] writes once the connection's turn is over.
    /// The first flush (the preface's) goes out at once.
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.state.lock();
        state.take_broken()?;
        if !state.flushed {
            ready!(state.poll_drain(cx))?;
            state.flushed = true;
        }
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.state.lock();
        ready!(state.poll_drain(cx))?;
        Pin::new(&mut state.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(address), listener.accept());
        (client.unwrap(), accepted.unwrap().0)
    }

    #[tokio::test]
    async fn small_writes_wait_for_the_driver_and_large_ones_do_not() {
        let (ours, mut theirs) = pair().await;
        let (mut corked, cork) = cork(ours);
        // The first flush is the preface's: it goes out at once.
        corked.write_all(b"preface").await.unwrap();
        corked.flush().await.unwrap();
        let mut buf = [0u8; 64];
        let read = theirs.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..read], b"preface");

        corked.write_all(b"headers ").await.unwrap();
        corked.write_all(b"and data").await.unwrap();
        corked.flush().await.unwrap();
        let early = tokio::time::timeout(std::time::Duration::from_millis(50), theirs.read(&mut buf)).await;
        assert!(early.is_err(), "nothing is sent before the driver's turn ends");

        cork.drive(&mut std::future::ready(())).await;
        let read = theirs.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..read], b"headers and data");

        // A large write is not held back behind what is: both arrive, in order.
        corked.write_all(b"small ").await.unwrap();
        let large = vec![7u8; LIMIT];
        corked.write_all(&large).await.unwrap();
        cork.drive(&mut std::future::ready(())).await;
        let mut received = vec![0u8; 6 + LIMIT];
        theirs.read_exact(&mut received).await.unwrap();
        assert_eq!(&received[..6], b"small ");
        assert!(received[6..].iter().all(|&b| b == 7));

        // Reads pass through.
        theirs.write_all(b"answer").await.unwrap();
        let read = corked.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..read], b"answer");
    }

    #[tokio::test]
    async fn shutdown_sends_what_is_held_first() {
        let (ours, mut theirs) = pair().await;
        let (mut corked, _cork) = cork(ours);
        corked.write_all(b"goaway").await.unwrap();
        corked.shutdown().await.unwrap();
        let mut received = Vec::new();
        theirs.read_to_end(&mut received).await.unwrap();
        assert_eq!(received, b"goaway");
    }
}
