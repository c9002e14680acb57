//! Serving a hyper service on accepted connections, HTTP/1.1 or HTTP/2: the
//! gRPC port's tower stack, the HTTP port's [`crate::http::PortService`],
//! the metrics port's router.
//!
//! Our own loop over hyper rather than `axum::serve` or tonic's server, for
//! what a production server needs and they do not expose: HTTP/1.1's header
//! read timeout (a client trickling its headers, or idling between
//! requests, is disconnected), HTTP/2's stream cap and keep-alive,
//! connections from the shared [`Acceptor`] (connection cap, TLS, handshake
//! deadline), and corked HTTP/2 connections: h2 flushes after each DATA
//! frame it writes, so without the cork a gRPC answer's trailers leave in a
//! second write and wake the client a second time (docs/benchmarks-log.md,
//! entry 12).

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio_util::sync::CancellationToken;

use super::idle::{Activity, Supervised, Tracked};
use super::{Acceptor, Peer};

/// HTTP/1.1 read buffer per connection (hyper's default is ~400 KiB). Body
/// bytes are copied out of it at once, so a bigger buffer only saves a few
/// reads per megabyte, while a thousand connections would hold 400 MiB
/// outside the memory budget.
pub const READ_BUFFER: usize = 64 << 10;

/// Protocol limits of a port.
#[derive(Debug, Clone, Copy)]
pub struct ServeOptions {
    /// HTTP/1.1 is spoken, and the whole request head must arrive within
    /// this time, which also closes a connection idle between requests for
    /// as long. `None` on the gRPC port: a connection that did not open
    /// with HTTP/2's preface is closed.
    pub http1_header_timeout: Option<Duration>,
    /// For HTTP/2: streams one connection may have open at once.
    pub max_concurrent_streams: u32,
    /// For HTTP/2: a PING after this much silence...
    pub keepalive: Duration,
    /// ...and no answer within this closes the connection.
    pub keepalive_timeout: Duration,
    /// For HTTP/2: a connection with no request answering and none started
    /// for this long is drained (`--http2-idle-timeout-secs`)...
    pub http2_idle_timeout: Duration,
    /// ...and its first request must start within this (the handshake
    /// deadline, `--handshake-timeout-secs`).
    pub first_request_timeout: Duration,
    /// For HTTP/2: whether answers carry a `Date` header. HTTP requires it
    /// of an origin server with a clock; gRPC servers (Triton's among them)
    /// send none, and on a small call it is a clock read and a header to
    /// encode per answer.
    pub http2_date_header: bool,
}

/// Serves until `shutdown` resolves, then stops accepting and lets the open
/// connections finish their requests.
pub async fn serve<S, B>(
    acceptor: Acceptor,
    service: S,
    options: ServeOptions,
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
    // Each connection's task holds a clone of `open`: when the last one is
    // gone, the drain below is over.
    let draining = CancellationToken::new();
    let (open, mut closed) = tokio::sync::mpsc::channel::<()>(1);
    // Boxed so that it can be dropped before the drain: that ends the
    // accept loop and closes the listener, so a client that connects now
    // is refused at once and may go elsewhere, instead of sending its
    // requests into the kernel's backlog for the exit to reset.
    let mut connections = Box::pin(acceptor.into_stream());
    let mut shutdown = pin!(shutdown);
    loop {
        let connection = tokio::select! {
            next = connections.next() => match next {
                Some(connection) => connection,
                None => break,
            },
            () = &mut shutdown => break,
        };
        let open = open.clone();
        let drained = draining.clone().cancelled_owned();
        let activity = Arc::new(Activity::default());
        let service = Tracked::new(service.clone(), Arc::clone(&activity), connection.remote.map(Peer));
        if connection.http2 {
            let (io, cork) = nereid_cork::cork(connection);
            let conn = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .max_concurrent_streams(options.max_concurrent_streams)
                .keep_alive_interval(Some(options.keepalive))
                .keep_alive_timeout(options.keepalive_timeout)
                .auto_date_header(options.http2_date_header)
                .serve_connection(TokioIo::new(io), service);
            let idle = Some((activity, options.http2_idle_timeout));
            let conn = Supervised::new(conn, drained, idle, options.first_request_timeout);
            tokio::spawn(async move {
                let _ = cork.drive(&mut pin!(conn)).await;
                drop(open);
            });
        } else if let Some(header_timeout) = options.http1_header_timeout {
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .max_buf_size(READ_BUFFER)
                .header_read_timeout(header_timeout)
                .serve_connection(TokioIo::new(connection), service);
            let conn = Supervised::new(conn, drained, None, options.first_request_timeout);
            tokio::spawn(async move {
                let _ = conn.await;
                drop(open);
            });
        }
    }
    drop(connections);
    draining.cancel();
    drop(open);
    let _ = closed.recv().await;
    Ok(())
}
