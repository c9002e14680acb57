//! Accepting connections on a port and serving each request, within the
//! gateway's connection limits ([`crate::limits`]): through a hyper handler,
//! HTTP/1.1 and cleartext HTTP/2 (prior knowledge) on the same port
//! ([`serve`]: REST and metrics, one connection in [`hyper_connection`]),
//! or over HTTP/2 driven through `h2` itself ([`serve_grpc`]: the gRPC port,
//! one connection in [`grpc_connection`]; see [`crate::h2_body`] for why).
//!
//! Every port takes at most `--max-connections` open connections; one more
//! is closed as soon as it is accepted (so a client learns at once, rather
//! than after a timeout, and the gateway holds nothing for it). Each
//! connection then has `--handshake-timeout-secs` to say which protocol it
//! speaks, and is kept within its idle and header-read timeouts
//! ([`crate::connection_clock`]).

mod grpc_connection;
mod hyper_connection;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cap::Cap;
use crate::limits::flag;
use crate::metrics::Closed;
use crate::reply_body::Reply;
use crate::state::Gateway;

/// Tensors are large: HTTP/2 windows that do not stall a 4 MiB request
/// (the pods' connections use them too). They also bound what a client
/// streaming a body can make the gateway hold per connection.
pub const STREAM_WINDOW: u32 = 4 << 20;
pub const CONNECTION_WINDOW: u32 = 16 << 20;
/// HTTP/2 streams one client connection may have open: the pods' own limit.
const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Which port a connection came to, for metrics and logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Port {
    Http,
    Grpc,
    Metrics,
}

impl Port {
    pub fn label(self) -> &'static str {
        match self {
            Port::Http => "http",
            Port::Grpc => "grpc",
            Port::Metrics => "metrics",
        }
    }
}

/// Serves `listener` until `stop` is cancelled, then accepts no more
/// connections, tells the open ones to close (HTTP/2 GOAWAY, HTTP/1.1
/// `Connection: close`) and returns once their requests are answered. A
/// failed connection is logged and leaves the others alone.
pub async fn serve<H, F>(listener: TcpListener, gateway: Arc<Gateway>, handler: H, port: Port, stop: CancellationToken)
where
    H: Fn(Arc<Gateway>, Request<Incoming>) -> F + Copy + Send + Sync + 'static,
    F: Future<Output = Result<Response<Reply>, Infallible>> + Send + 'static,
{
    let served = hyper_connection::Served {
        gateway: Arc::clone(&gateway),
        handler,
        port,
        stop: stop.clone(),
    };
    accept_all(listener, &gateway, port, &stop, |stream, peer| {
        hyper_connection::serve(stream, peer, served.clone())
    })
    .await;
}

/// Serves the gRPC port until `stop` is cancelled, then, like [`serve`],
/// accepts no more connections, sends the open ones GOAWAY and returns once
/// their calls are answered.
pub async fn serve_grpc(listener: TcpListener, gateway: Arc<Gateway>, stop: CancellationToken) {
    accept_all(listener, &gateway, Port::Grpc, &stop, |stream, peer| {
        grpc_connection::serve(stream, peer, Arc::clone(&gateway), stop.clone())
    })
    .await;
}

/// Accepts connections until `stop` is cancelled, each served by the
/// future `connection` makes of it, on its own task, while the port has
/// fewer than `--max-connections` open; then waits for them to end.
async fn accept_all<C, S>(
    listener: TcpListener,
    gateway: &Gateway,
    port: Port,
    stop: &CancellationToken,
    mut connection: C,
) where
    C: FnMut(TcpStream, SocketAddr) -> S,
    S: Future<Output = ()> + Send + 'static,
{
    let cap = Cap::new(gateway.limits.max_connections);
    let mut connections = JoinSet::new();
    // When the last refusal was logged: at most one line a second.
    let mut warned: Option<Instant> = None;
    while let Some((stream, peer)) = accept(&listener, stop).await {
        // Reap the connections that ended, so the set holds open ones only.
        while connections.try_join_next().is_some() {}
        let Some(slot) = cap.try_take() else {
            gateway.metrics.connection_closed(port.label(), Closed::MaxConnections);
            if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                warned = Some(Instant::now());
                tracing::warn!(
                    %peer, port = port.label(), limit = cap.limit(),
                    "closing connections over {} (nereid_gateway_connections_closed_total counts them)",
                    flag::MAX_CONNECTIONS
                );
            }
            drop(stream);
            continue;
        };
        let served = connection(stream, peer);
        connections.spawn(async move {
            served.await;
            drop(slot);
        });
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// The next connection, or `None` once `stop` is cancelled.
async fn accept(listener: &TcpListener, stop: &CancellationToken) -> Option<(TcpStream, SocketAddr)> {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => return None,
        };
        match accepted {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                return Some((stream, peer));
            }
            Err(error) => {
                // Out of file descriptors and the like: wait, then go on.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Waits until `deadline`, or forever when there is none.
async fn until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}
