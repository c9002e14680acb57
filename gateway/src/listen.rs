//! Accepting connections on a port and serving each request: through a
//! hyper handler, HTTP/1.1 and cleartext HTTP/2 (prior knowledge) on the
//! same port ([`serve`]: REST and metrics), or over HTTP/2 driven through
//! `h2` itself ([`serve_grpc`]: the gRPC port, see [`crate::h2_body`] for
//! why).

use std::convert::Infallible;
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::grpc_front;
use crate::reply_body::Reply;
use crate::state::Gateway;

/// Tensors are large: HTTP/2 windows that do not stall a 4 MiB request
/// (the pods' connections use them too).
pub const STREAM_WINDOW: u32 = 4 << 20;
pub const CONNECTION_WINDOW: u32 = 16 << 20;
const MAX_CONCURRENT_STREAMS: u32 = 1024;

/// Serves `listener` until `stop` is cancelled, then accepts no more
/// connections, tells the open ones to close (HTTP/2 GOAWAY, HTTP/1.1
/// `Connection: close`) and returns once their requests are answered. A
/// failed connection is logged and leaves the others alone.
pub async fn serve<H, F>(listener: TcpListener, gateway: Arc<Gateway>, handler: H, stop: CancellationToken)
where
    H: Fn(Arc<Gateway>, Request<Incoming>) -> F + Copy + Send + Sync + 'static,
    F: Future<Output = Result<Response<Reply>, Infallible>> + Send + 'static,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http2()
        .initial_stream_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    while let Some((stream, peer)) = accept(&listener, &stop).await {
        let gateway = Arc::clone(&gateway);
        let builder = Arc::clone(&builder);
        let watcher = graceful.watcher();
        tokio::spawn(async move {
            let service = service_fn(move |request| handler(Arc::clone(&gateway), request));
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(connection).await {
                tracing::debug!(%peer, %error, "connection ended with an error");
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
}

/// Serves the gRPC port until `stop` is cancelled, then, like [`serve`],
/// accepts no more connections, sends the open ones GOAWAY and returns once
/// their calls are answered.
pub async fn serve_grpc(listener: TcpListener, gateway: Arc<Gateway>, stop: CancellationToken) {
    let mut connections = JoinSet::new();
    while let Some((stream, peer)) = accept(&listener, &stop).await {
        // Reap the connections that ended, so the set holds open ones only.
        while connections.try_join_next().is_some() {}
        connections.spawn(grpc_connection(stream, Arc::clone(&gateway), stop.clone(), peer));
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

/// One client connection: each stream it opens is a call, served on its
/// own task, while this one drives the connection.
async fn grpc_connection(
    stream: TcpStream,
    gateway: Arc<Gateway>,
    stop: CancellationToken,
    peer: std::net::SocketAddr,
) {
    let (io, cork) = nereid_cork::cork(stream);
    let handshake = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .handshake::<_, bytes::Bytes>(io);
    let mut handshake = pin!(handshake);
    let mut connection = tokio::select! {
        handshake = cork.drive(&mut handshake) => match handshake {
            Ok(connection) => connection,
            Err(error) => {
                tracing::debug!(%peer, %error, "HTTP/2 handshake failed");
                return;
            }
        },
        () = stop.cancelled() => return,
    };
    let mut closing = false;
    loop {
        let accepted = {
            let mut next = pin!(connection.accept());
            tokio::select! {
                accepted = cork.drive(&mut next) => Some(accepted),
                () = stop.cancelled(), if !closing => None,
            }
        };
        match accepted {
            None => {
                connection.graceful_shutdown();
                closing = true;
            }
            Some(Some(Ok((request, respond)))) => {
                tokio::spawn(grpc_front::call(Arc::clone(&gateway), request, respond));
            }
            Some(Some(Err(error))) => {
                tracing::debug!(%peer, %error, "connection ended with an error");
                return;
            }
            Some(None) => return,
        }
    }
}

/// The next connection, or `None` once `stop` is cancelled.
async fn accept(listener: &TcpListener, stop: &CancellationToken) -> Option<(TcpStream, std::net::SocketAddr)> {
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
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}
