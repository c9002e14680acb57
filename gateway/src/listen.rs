//! Accepting connections on a port and serving each request through a
//! handler: HTTP/1.1 and cleartext HTTP/2 (prior knowledge, as gRPC
//! clients speak it) on the same port.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::reply_body::Reply;
use crate::state::Gateway;

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
        // Tensors are large: windows that do not stall a 4 MiB request.
        .initial_stream_window_size(4 << 20)
        .initial_connection_window_size(16 << 20)
        .max_concurrent_streams(1024);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = stop.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of file descriptors and the like: wait, then go on.
                tracing::warn!(%error, "accepting a connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
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
