//! One connection to a port served through hyper (REST and metrics):
//! HTTP/1.1, or cleartext HTTP/2 by prior knowledge, told apart by its
//! first bytes ([`crate::sniff`]) within `--handshake-timeout-secs`, then
//! kept within its idle and header-read timeouts
//! ([`crate::connection_clock`]).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::{http1, http2};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{CONNECTION_WINDOW, MAX_CONCURRENT_STREAMS, Port, STREAM_WINDOW, until};
use crate::connection_clock::{Clock, Expiry, Noticed, Open, Timeouts};
use crate::limits::{HTTP1_BUFFER_BYTES, flag};
use crate::metrics::Closed;
use crate::reply_body::Reply;
use crate::sniff::{self, Protocol};
use crate::state::Gateway;

/// What every connection to one port is served with.
#[derive(Clone)]
pub(super) struct Served<H> {
    pub gateway: Arc<Gateway>,
    pub handler: H,
    pub port: Port,
    pub stop: CancellationToken,
}

/// Serves one connection until it ends, or closes it at a limit.
pub(super) async fn serve<H, F>(stream: TcpStream, peer: SocketAddr, served: Served<H>)
where
    H: Fn(Arc<Gateway>, Request<Incoming>) -> F + Copy + Send + Sync + 'static,
    F: Future<Output = Result<Response<Reply>, Infallible>> + Send + 'static,
{
    let limits = served.gateway.limits;
    let sniffed = tokio::select! {
        sniffed = tokio::time::timeout(limits.handshake_timeout, sniff::protocol(stream)) => sniffed,
        () = served.stop.cancelled() => return,
    };
    let (protocol, io) = match sniffed {
        Ok(Ok(sniffed)) => sniffed,
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "a connection ended before its first request");
            return;
        }
        Err(_) => {
            served
                .gateway
                .metrics
                .connection_closed(served.port.label(), Closed::HandshakeTimeout);
            tracing::debug!(%peer, "closed a connection that sent nothing within {}", flag::HANDSHAKE_TIMEOUT);
            return;
        }
    };
    // HTTP/1.1's first bytes are the start of its first head: its
    // header-read timeout runs from now.
    let clock = match protocol {
        Protocol::Http1 => Clock::new(Timeouts::http1(&limits), true),
        Protocol::Http2 => Clock::new(Timeouts::http2(&limits), false),
    };
    let io = TokioIo::new(Noticed::new(io, clock.clone()));
    let service = {
        let (gateway, handler, clock) = (Arc::clone(&served.gateway), served.handler, clock.clone());
        service_fn(move |request| {
            let open = clock.open();
            let answer = handler(Arc::clone(&gateway), request);
            async move {
                let response = answer.await.unwrap_or_else(|never| match never {});
                Ok::<_, Infallible>(response.map(|reply| Held { reply, _open: open }))
            }
        })
    };
    match protocol {
        Protocol::Http1 => {
            // The header-read timeout is the clock's (see there why).
            let connection = http1::Builder::new()
                .header_read_timeout(None::<Duration>)
                .max_buf_size(HTTP1_BUFFER_BYTES)
                .serve_connection(io, service);
            drive(connection, &clock, &served, peer).await;
        }
        Protocol::Http2 => {
            let mut builder = http2::Builder::new(TokioExecutor::new());
            builder
                .initial_stream_window_size(STREAM_WINDOW)
                .initial_connection_window_size(CONNECTION_WINDOW)
                .max_concurrent_streams(MAX_CONCURRENT_STREAMS);
            let connection = builder.serve_connection(io, service);
            drive(connection, &clock, &served, peer).await;
        }
    }
}

/// What a connection's task woke for.
enum Event<E> {
    Ended(Result<(), E>),
    Stop,
    Expired(Expiry),
    GiveUp,
}

/// Polls `connection` to its end, closing it gracefully when the gateway
/// stops or it has been idle too long, and at once when a head takes too
/// long.
async fn drive<C, H>(connection: C, clock: &Clock, served: &Served<H>, peer: SocketAddr)
where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    let mut connection = pin!(connection);
    let mut closing = false;
    // When a connection closed for idleness is dropped even if its client
    // never acknowledges the GOAWAY (h2 waits for a ping's answer), unless
    // a request came in meanwhile: then once none is open.
    let mut give_up = None;
    loop {
        let event = tokio::select! {
            ended = connection.as_mut() => Event::Ended(ended),
            () = served.stop.cancelled(), if !closing => Event::Stop,
            expired = clock.expired(), if !closing => Event::Expired(expired),
            () = until(give_up) => Event::GiveUp,
        };
        match event {
            Event::GiveUp if clock.busy() => {
                give_up = Some(Instant::now() + served.gateway.limits.handshake_timeout);
            }
            Event::Ended(Ok(())) | Event::GiveUp => return,
            Event::Ended(Err(error)) => {
                tracing::debug!(%peer, %error, "connection ended with an error");
                return;
            }
            Event::Stop => {
                connection.as_mut().graceful_shutdown();
                closing = true;
            }
            Event::Expired(Expiry::Idle) => {
                let metrics = &served.gateway.metrics;
                metrics.connection_closed(served.port.label(), Closed::IdleTimeout);
                tracing::debug!(%peer, "closing a connection idle for {}", flag::IDLE_TIMEOUT);
                connection.as_mut().graceful_shutdown();
                closing = true;
                give_up = Some(Instant::now() + served.gateway.limits.handshake_timeout);
            }
            Event::Expired(Expiry::HeaderRead) => {
                let metrics = &served.gateway.metrics;
                metrics.connection_closed(served.port.label(), Closed::HeaderReadTimeout);
                tracing::debug!(%peer, "closed a connection whose head took over {}", flag::HEADER_READ_TIMEOUT);
                return;
            }
        }
    }
}

/// An answer that keeps its request counted open on its connection's clock
/// until it has been sent (or dropped: the client went away).
struct Held {
    reply: Reply,
    _open: Open,
}

impl Body for Held {
    type Data = Bytes;
    type Error = h2::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, h2::Error>>> {
        Pin::new(&mut self.get_mut().reply).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.reply.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.reply.size_hint()
    }
}
