//! The first bytes of a connection, read under a deadline and then
//! replayed to the protocol as if they had never been read.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};

/// What every HTTP/2 connection starts with (RFC 9113, 3.4).
pub const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Reads until the bytes read either are the whole HTTP/2 preface or
/// cannot be its start (so HTTP/1.1 after the first differing byte).
/// Returns what was read; empty when the peer closed first.
pub async fn read_until_decided<IO: AsyncRead + Unpin>(io: &mut IO) -> io::Result<Bytes> {
    let mut read = BytesMut::with_capacity(H2_PREFACE.len());
    while read.len() < H2_PREFACE.len() && H2_PREFACE.starts_with(&read) {
        let mut chunk = [0u8; 24];
        let want = H2_PREFACE.len() - read.len();
        let n = io.read(&mut chunk[..want]).await?;
        if n == 0 {
            break;
        }
        read.extend_from_slice(&chunk[..n]);
    }
    Ok(read.freeze())
}

/// An IO whose reads return `prefix` first, then the inner stream.
#[derive(Debug)]
pub struct Prefixed<IO> {
    prefix: Bytes,
    inner: IO,
}

impl<IO> Prefixed<IO> {
    pub fn new(prefix: Bytes, inner: IO) -> Self {
        Prefixed { prefix, inner }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.prefix.is_empty() {
            let n = self.prefix.len().min(buf.remaining());
            buf.put_slice(&self.prefix[..n]);
            self.prefix.advance(n);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn decides_on_the_first_differing_byte_and_replays_it() {
        let (mut client, mut server) = tokio::io::duplex(64);
        client.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
        let read = read_until_decided(&mut server).await.unwrap();
        assert!(!read.is_empty() && !read.starts_with(H2_PREFACE));
        let mut replayed = Prefixed::new(read, server);
        let mut line = [0u8; 16];
        replayed.read_exact(&mut line).await.unwrap();
        assert_eq!(&line, b"GET / HTTP/1.1\r\n");
    }

    #[tokio::test]
    async fn reads_the_whole_h2_preface() {
        let (mut client, mut server) = tokio::io::duplex(64);
        for byte in H2_PREFACE {
            client.write_all(&[*byte]).await.unwrap();
        }
        client.write_all(b"frames").await.unwrap();
        let read = read_until_decided(&mut server).await.unwrap();
        assert_eq!(&read[..], H2_PREFACE);
        drop(client);
        let mut rest = Vec::new();
        Prefixed::new(Bytes::new(), server)
            .read_to_end(&mut rest)
            .await
            .unwrap();
        assert_eq!(rest, b"frames");
    }
}
