//! One connection to the gRPC port: each stream it opens is a call, served
//! on its own task, while this one drives the connection.
//!
//! Its HTTP/2 preface must come within `--handshake-timeout-secs`; it is
//! closed (GOAWAY first) once it has had no stream open for
//! `--idle-timeout-secs`; and it may hold at most
//! `--max-streaming-calls-per-connection` ModelStreamInfer calls
//! ([`crate::grpc_front::call`] refuses one more).

use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;

use bytes::Bytes;
use h2::RecvStream;
use h2::server::SendResponse;
use http::Request;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{CONNECTION_WINDOW, MAX_CONCURRENT_STREAMS, Port, STREAM_WINDOW, until};
use crate::cap::Cap;
use crate::connection_clock::{Clock, Timeouts};
use crate::grpc_front;
use crate::limits::{MAX_HEADER_LIST_BYTES, flag};
use crate::metrics::Closed;
use crate::state::Gateway;

/// What the connection's task woke for, when not for a new stream.
enum Wake {
    Stop,
    Idle,
    GiveUp,
}

/// A new stream, the connection's end, or an error.
type Accepted = Option<Result<(Request<RecvStream>, SendResponse<Bytes>), h2::Error>>;

pub(super) async fn serve(stream: TcpStream, peer: SocketAddr, gateway: Arc<Gateway>, stop: CancellationToken) {
    let limits = gateway.limits;
    let (io, cork) = nereid_cork::cork(stream);
    let handshake = h2::server::Builder::new()
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_concurrent_streams(MAX_CONCURRENT_STREAMS)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .handshake::<_, Bytes>(io);
    let mut handshake = pin!(handshake);
    let mut connection = tokio::select! {
        handshake = cork.drive(&mut handshake) => match handshake {
            Ok(connection) => connection,
            Err(error) => {
                tracing::debug!(%peer, %error, "HTTP/2 handshake failed");
                return;
            }
        },
        () = tokio::time::sleep(limits.handshake_timeout) => {
            gateway.metrics.connection_closed(Port::Grpc.label(), Closed::HandshakeTimeout);
            tracing::debug!(%peer, "closed a connection with no HTTP/2 preface within {}", flag::HANDSHAKE_TIMEOUT);
            return;
        }
        () = stop.cancelled() => return,
    };
    let clock = Clock::new(Timeouts::http2(&limits), false);
    let streams = Cap::new(limits.max_streaming_calls_per_connection);
    let mut closing = false;
    // When a connection closed for idleness is dropped even if its client
    // never acknowledges the GOAWAY (h2 waits for a ping's answer), unless
    // a call came in meanwhile: then once none is open.
    let mut give_up = None;
    loop {
        let event: Result<Accepted, Wake> = {
            let mut next = pin!(connection.accept());
            tokio::select! {
                accepted = cork.drive(&mut next) => Ok(accepted),
                () = stop.cancelled(), if !closing => Err(Wake::Stop),
                _ = clock.expired(), if !closing => Err(Wake::Idle),
                () = until(give_up) => Err(Wake::GiveUp),
            }
        };
        match event {
            Err(Wake::Stop) => {
                connection.graceful_shutdown();
                closing = true;
            }
            Err(Wake::Idle) => {
                gateway
                    .metrics
                    .connection_closed(Port::Grpc.label(), Closed::IdleTimeout);
                tracing::debug!(%peer, "closing a connection idle for {}", flag::IDLE_TIMEOUT);
                connection.graceful_shutdown();
                closing = true;
                give_up = Some(Instant::now() + limits.handshake_timeout);
            }
            Err(Wake::GiveUp) if clock.busy() => give_up = Some(Instant::now() + limits.handshake_timeout),
            Err(Wake::GiveUp) => return,
            Ok(Some(Ok((request, respond)))) => {
                let open = clock.open();
                let gateway = Arc::clone(&gateway);
                let streams = streams.clone();
                tokio::spawn(async move {
                    grpc_front::call(gateway, request, respond, &streams).await;
                    drop(open);
                });
            }
            Ok(Some(Err(error))) => {
                tracing::debug!(%peer, %error, "connection ended with an error");
                return;
            }
            Ok(None) => return,
        }
    }
}
