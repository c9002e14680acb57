//! The accept loop both front ends share.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::either::Either;

use super::preface::{Prefixed, read_until_decided};
use super::tls::ReloadingTls;

/// What every connection of one listener is held to.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once; one more is closed at once.
    pub max_connections: usize,
    /// From accept to the end of the TLS handshake and the first bytes.
    pub handshake_timeout: Duration,
}

/// A plain or TLS byte stream.
type Transport = Either<TcpStream, Box<TlsStream<TcpStream>>>;

/// The address a request's connection came from, in the request's
/// extensions (for the few decisions that depend on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer(pub SocketAddr);

impl Peer {
    /// Whether the client is on the server's own host (loopback, IPv4 or 6).
    pub fn is_local(&self) -> bool {
        self.0.ip().to_canonical().is_loopback()
    }
}

/// One accepted connection, ready for a protocol: its first bytes read (and
/// replayed), its place under the connection cap held until it is dropped.
#[derive(Debug)]
pub struct Connection {
    io: Prefixed<Transport>,
    /// Whether the client speaks HTTP/2 (its preface, or ALPN `h2`).
    pub http2: bool,
    pub remote: Option<SocketAddr>,
    pub local: Option<SocketAddr>,
    _permit: OwnedSemaphorePermit,
}

/// Accepts connections on one listener under [`ConnectionLimits`].
pub struct Acceptor {
    listener: TcpListener,
    limits: ConnectionLimits,
    tls: Option<Arc<ReloadingTls>>,
    slots: Arc<Semaphore>,
    /// Which port this is, for log lines.
    name: &'static str,
}

impl Acceptor {
    pub fn new(
        name: &'static str,
        listener: TcpListener,
        limits: ConnectionLimits,
        tls: Option<Arc<ReloadingTls>>,
    ) -> Self {
        Acceptor {
            listener,
            limits,
            tls,
            slots: Arc::new(Semaphore::new(limits.max_connections.clamp(1, Semaphore::MAX_PERMITS))),
            name,
        }
    }

    /// Connections in the order their handshakes finish. Each handshake
    /// runs on its own task, so a slow client never holds up the others.
    /// The stream ends when the listener fails for good.
    pub fn into_stream(self) -> impl Stream<Item = Connection> + Send + 'static {
        let (tx, rx) = mpsc::channel::<Connection>(64);
        tokio::spawn(self.run(tx));
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }

    async fn run(self, ready: mpsc::Sender<Connection>) {
        loop {
            let (tcp, remote) = tokio::select! {
                accepted = self.listener.accept() => match accepted {
                    Ok(accepted) => accepted,
                    Err(e) if is_per_connection(&e) => continue,
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(port = self.name, error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                },
                () = ready.closed() => return,
            };
            let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() else {
                tracing::debug!(port = self.name, %remote, "connection closed at once: the port is at its connection cap");
                drop(tcp);
                continue;
            };
            let _ = tcp.set_nodelay(true);
            let tls = self.tls.clone();
            let limits = self.limits;
            let ready = ready.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(limits.handshake_timeout, handshake(tcp, tls, permit)).await {
                    Ok(Ok(Some(connection))) => {
                        let _ = ready.send(connection).await;
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => tracing::debug!(%remote, error = %e, "handshake failed"),
                    Err(_) => tracing::debug!(%remote, "closed: nothing sent within the handshake timeout"),
                }
            });
        }
    }
}

/// Errors that concern one connection only (the listener is fine).
fn is_per_connection(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset | io::ErrorKind::Interrupted
    )
}

/// TLS if configured, then the first bytes. `None` when the client left.
async fn handshake(
    tcp: TcpStream,
    tls: Option<Arc<ReloadingTls>>,
    permit: OwnedSemaphorePermit,
) -> io::Result<Option<Connection>> {
    let remote = tcp.peer_addr().ok();
    let local = tcp.local_addr().ok();
    let (mut stream, alpn_h2) = match tls {
        None => (Either::Left(tcp), None),
        Some(tls) => {
            let tls = TlsAcceptor::from(tls.config()).accept(tcp).await?;
            let alpn = tls.get_ref().1.alpn_protocol().map(|p| p == b"h2");
            (Either::Right(Box::new(tls)), alpn)
        }
    };
    let (prefix, http2) = match alpn_h2 {
        // ALPN decided; nothing to read ahead.
        Some(h2) => (Bytes::new(), h2),
        None => {
            let first = read_until_decided(&mut stream).await?;
            if first.is_empty() {
                return Ok(None);
            }
            let h2 = &first[..] == super::preface::H2_PREFACE;
            (first, h2)
        }
    };
    Ok(Some(Connection {
        io: Prefixed::new(prefix, stream),
        http2,
        remote,
        local,
        _permit: permit,
    }))
}

impl AsyncRead for Connection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Connection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}
