//! Which protocol a client speaks on the HTTP port, from its first bytes:
//! HTTP/2 by prior knowledge begins with the connection preface, anything
//! else is HTTP/1.x.
//!
//! hyper-util's `auto` builder does the same inside itself; the gateway
//! does it here so that the wait for the first bytes is bounded
//! (`--handshake-timeout-secs`, by the caller) and so that each protocol
//! gets its own timeouts ([`crate::connection_clock`]). The bytes read to
//! decide are read again first ([`Rewind`]).

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpStream;

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// Reads until the first bytes decide the protocol (one read, almost
/// always: an HTTP/1 method differs from the preface by its second byte at
/// the latest), and returns it with the stream. An end before that is
/// `UnexpectedEof`.
pub async fn protocol(stream: TcpStream) -> io::Result<(Protocol, Rewind<TcpStream>)> {
    let mut first = [0u8; PREFACE.len()];
    let mut filled = 0;
    let protocol = loop {
        stream.readable().await?;
        match stream.try_read(&mut first[filled..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(read) => filled += read,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => continue,
            Err(error) => return Err(error),
        }
        if let Some(protocol) = decide(&first[..filled]) {
            break protocol;
        }
    };
    Ok((protocol, Rewind::new(Bytes::copy_from_slice(&first[..filled]), stream)))
}

/// The protocol `first` says, or `None` while it could still be the start
/// of the preface.
fn decide(first: &[u8]) -> Option<Protocol> {
    if !PREFACE.starts_with(first) {
        Some(Protocol::Http1)
    } else if first.len() == PREFACE.len() {
        Some(Protocol::Http2)
    } else {
        None
    }
}

/// A stream whose first bytes, already read, are read again.
pub struct Rewind<T> {
    first: Bytes,
    io: T,
}

impl<T> Rewind<T> {
    pub fn new(first: Bytes, io: T) -> Self {
        Rewind { first, io }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Rewind<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.first.is_empty() && buf.remaining() > 0 {
            let length = self.first.len().min(buf.remaining());
            buf.put_slice(&self.first[..length]);
            self.first.advance(length);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

crate::write_through::write_through!(Rewind);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_bytes_decide() {
        assert_eq!(decide(b""), None);
        assert_eq!(decide(b"G"), Some(Protocol::Http1));
        assert_eq!(decide(b"P"), None);
        assert_eq!(decide(b"PO"), Some(Protocol::Http1));
        assert_eq!(decide(b"PUT /v2"), Some(Protocol::Http1));
        assert_eq!(decide(&PREFACE[..23]), None);
        assert_eq!(decide(PREFACE), Some(Protocol::Http2));
    }

    #[tokio::test]
    async fn the_bytes_read_to_decide_are_read_again() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};

        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let client = tokio::spawn(async move {
            let mut stream = TcpStream::connect(address).await.unwrap();
            stream.write_all(b"GET /v2 HTTP/1.1\r\n\r\n").await.unwrap();
            stream
        });
        let (stream, _) = listener.accept().await.unwrap();
        let (protocol, mut rewound) = protocol(stream).await.unwrap();
        assert_eq!(protocol, Protocol::Http1);
        let mut head = [0u8; 20];
        rewound.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"GET /v2 HTTP/1.1\r\n\r\n");
        drop(client.await.unwrap());
    }
}
