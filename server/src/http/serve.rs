//! Serving a hyper service on accepted connections, HTTP/1.1 or HTTP/2:
//! the HTTP port's ([`super::PortService`]) or the metrics port's router.
//!
//! Our own loop over hyper rather than `axum::serve`, for the limits a
//! production server needs and axum does not expose: HTTP/1.1's header read
//! timeout (a client trickling its headers, or idling between requests, is
//! disconnected), HTTP/2's stream cap and keep-alive, and connections from
//! the shared [`Acceptor`] (connection cap, TLS, handshake deadline).

use std::future::Future;
use std::time::Duration;

use futures::StreamExt;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;

use crate::transport::Acceptor;

/// How long an HTTP/2 client has to answer a keep-alive PING.
pub const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(20);

/// HTTP/1.1 read buffer per connection (hyper's default is ~400 KiB). Body
/// bytes are copied out of it at once, so a bigger buffer only saves a few
/// reads per megabyte, while a thousand connections would hold 400 MiB
/// outside the memory budget.
pub const READ_BUFFER: usize = 64 << 10;

/// Protocol limits of the HTTP port.
#[derive(Debug, Clone, Copy)]
pub struct HttpServeOptions {
    /// For HTTP/1.1: the whole request head must arrive within this time,
    /// which also closes a connection idle between requests for as long.
    pub header_read_timeout: Duration,
    /// For HTTP/2: streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// For HTTP/2: a PING after this much silence; no answer within
    /// [`KEEPALIVE_TIMEOUT`] closes the connection.
    pub keepalive: Duration,
}

/// Serves until `shutdown` resolves, then stops accepting and lets the open
/// connections finish their requests.
pub async fn serve<S, B>(
    acceptor: Acceptor,
    service: S,
    options: HttpServeOptions,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let graceful = GracefulShutdown::new();
    let mut connections = std::pin::pin!(acceptor.into_stream());
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let connection = tokio::select! {
            next = connections.next() => match next {
                Some(connection) => connection,
                None => break,
            },
            () = &mut shutdown => break,
        };
        let http2 = connection.http2;
        let service = service.clone();
        let io = TokioIo::new(connection);
        if http2 {
            let conn = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(options.max_concurrent_streams)
                .keep_alive_interval(Some(options.keepalive))
                .keep_alive_timeout(KEEPALIVE_TIMEOUT)
                .serve_connection(io, service);
            tokio::spawn(graceful.watch(conn));
        } else {
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .max_buf_size(READ_BUFFER)
                .header_read_timeout(options.header_read_timeout)
                .serve_connection(io, service);
            tokio::spawn(graceful.watch(conn));
        }
    }
    graceful.shutdown().await;
    Ok(())
}
