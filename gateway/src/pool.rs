//! One cleartext HTTP/2 connection per pod address, shared by every request
//! to it (gRPC on the pod's gRPC port; REST on its HTTP port, which speaks
//! h2c too), made on first use and again after it closes.
//!
//! The gateway drives these through `h2` itself rather than a generic
//! pooled client, for two reasons. It must know, for every failure, whether
//! the request reached the pod: a connect that failed, or a stream the
//! connection would not open (it was closing), may go to another pod; a
//! request that was sent never goes anywhere else. And a request queued on
//! its stream whole, headers and body from one task, leaves in one write
//! (see [`crate::h2_body`]).
//!
//! A connection that broke before the pod said anything on it carried no
//! request the pod ran ([`heard`] says why), so its failures are refusals.

mod heard;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use h2::client::{self, ResponseFuture, SendRequest};
use h2::{Ping, SendStream};
use http::{Request, Response};
use parking_lot::Mutex;
use thiserror::Error;
use tokio::net::TcpStream;

use self::heard::Heard;
use crate::h2_body::H2Body;
use crate::listen::{CONNECTION_WINDOW, STREAM_WINDOW};

/// How often an open connection is pinged, and how long a pong may take
/// before the connection is taken for dead (a pod gone without closing it).
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Error)]
pub enum SendError {
    /// The request was not sent: no connection, or the connection was
    /// closing. It may go to another pod.
    #[error("{0}")]
    NotSent(String),
    /// The request was sent, and the pod declared it unprocessed: a stream
    /// above its GOAWAY's last stream, one it refused (REFUSED_STREAM), or
    /// one on a connection that broke before the pod said anything. A whole
    /// body may still go elsewhere.
    #[error("{0}")]
    Refused(String),
    /// The request was sent (or may have been), then the exchange failed.
    #[error("{0}")]
    Failed(String),
}

/// A connection's handle, whether its connection has ended, and whether
/// the pod has said anything on it.
#[derive(Clone)]
struct Connection {
    sender: SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
    heard: Arc<AtomicBool>,
}

/// A sent request's answer to come.
pub struct Pending {
    response: ResponseFuture,
    /// Its connection's [`Connection::heard`].
    heard: Arc<AtomicBool>,
}

pub struct Pool {
    connect_timeout: Duration,
    connections: Mutex<HashMap<SocketAddr, Connection>>,
    /// One connect at a time per address: the others wait for it.
    connecting: Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<()>>>>,
}

impl Pool {
    pub fn new(connect_timeout: Duration) -> Self {
        Pool {
            connect_timeout,
            connections: Mutex::new(HashMap::new()),
            connecting: Mutex::new(HashMap::new()),
        }
    }

    /// Opens a stream for `request` to `address`, its headers queued, ready
    /// for its body (none when `end_of_stream`).
    pub async fn open(
        &self,
        address: SocketAddr,
        request: Request<()>,
        end_of_stream: bool,
    ) -> Result<(Pending, SendStream<Bytes>), SendError> {
        let Connection { sender, heard, .. } = self.connection(address).await.map_err(SendError::NotSent)?;
        let opened = match sender.ready().await {
            Ok(mut sender) => sender.send_request(request, end_of_stream),
            Err(error) => Err(error),
        };
        opened
            .map(|(response, send)| (Pending { response, heard }, send))
            .map_err(|error| {
                // A connection that opens no stream is closing: the next
                // request makes a new one.
                self.forget(address);
                SendError::NotSent(format!("{address}: {}", error_chain(&error)))
            })
    }

    /// The connection to `address`, made if there is none open.
    async fn connection(&self, address: SocketAddr) -> Result<Connection, String> {
        if let Some(connection) = self.open_connection(address) {
            return Ok(connection);
        }
        let lock = {
            let mut connecting = self.connecting.lock();
            // Pods come and go with new addresses: the slow path drops the
            // records of those nobody is connecting to and whose connection
            // has closed, so neither map grows with the pods ever seen.
            connecting.retain(|_, lock| Arc::strong_count(lock) > 1);
            self.connections
                .lock()
                .retain(|_, connection| !connection.closed.load(Ordering::Acquire));
            Arc::clone(connecting.entry(address).or_default())
        };
        let _connecting = lock.lock().await;
        // Another request may have connected while this one waited.
        if let Some(connection) = self.open_connection(address) {
            return Ok(connection);
        }
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(address))
            .await
            .map_err(|_| format!("connecting to {address} timed out after {:?}", self.connect_timeout))?
            .map_err(|e| format!("connecting to {address}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let stream = Heard::new(stream);
        let heard = stream.flag();
        let (io, cork) = nereid_cork::cork(stream);
        let handshake = client::Builder::new()
            .initial_window_size(STREAM_WINDOW)
            .initial_connection_window_size(CONNECTION_WINDOW)
            .handshake::<_, Bytes>(io);
        let (sender, mut connection) = cork
            .drive(&mut pin!(handshake))
            .await
            .map_err(|e| format!("HTTP/2 handshake with {address}: {}", error_chain(&e)))?;
        let closed = Arc::new(AtomicBool::new(false));
        let mut pings = connection.ping_pong();
        let ended = Arc::clone(&closed);
        tokio::spawn(async move {
            let keep_alive = async {
                let Some(pings) = pings.as_mut() else {
                    return std::future::pending().await;
                };
                loop {
                    tokio::time::sleep(KEEP_ALIVE_INTERVAL).await;
                    match tokio::time::timeout(KEEP_ALIVE_TIMEOUT, pings.ping(Ping::opaque())).await {
                        Ok(Ok(_)) => {}
                        Ok(Err(error)) => break error.to_string(),
                        Err(_) => break format!("no pong within {KEEP_ALIVE_TIMEOUT:?}"),
                    }
                }
            };
            tokio::select! {
                result = cork.drive(&mut connection) => if let Err(error) = result {
                    tracing::debug!(%address, %error, "connection to a pod ended");
                },
                reason = keep_alive => tracing::debug!(%address, %reason, "connection to a pod dropped"),
            }
            ended.store(true, Ordering::Release);
        });
        let connection = Connection { sender, closed, heard };
        self.connections.lock().insert(address, connection.clone());
        Ok(connection)
    }

    fn open_connection(&self, address: SocketAddr) -> Option<Connection> {
        let mut connections = self.connections.lock();
        match connections.get(&address) {
            Some(connection) if !connection.closed.load(Ordering::Acquire) => Some(connection.clone()),
            Some(_) => {
                connections.remove(&address);
                None
            }
            None => None,
        }
    }

    /// Drops the cached connection to `address`: it would not open a
    /// stream, so it is closing. (Should another request have replaced it
    /// meanwhile, that one is dropped from the cache too, and the next
    /// request connects once more: harmless.)
    fn forget(&self, address: SocketAddr) {
        self.connections.lock().remove(&address);
    }
}

/// The pod's answer to a stream opened with [`Pool::open`], or how the
/// exchange failed.
pub async fn answer(pending: Pending) -> Result<Response<H2Body>, SendError> {
    match pending.response.await {
        Ok(response) => Ok(response.map(H2Body::new)),
        Err(error) if unprocessed(&error) => Err(SendError::Refused(error_chain(&error))),
        Err(error) if !pending.heard.load(Ordering::Acquire) => Err(SendError::Refused(format!(
            "{}, before the pod said anything on the connection",
            error_chain(&error)
        ))),
        Err(error) => Err(SendError::Failed(error_chain(&error))),
    }
}

/// Whether HTTP/2 says the server never processed the stream: GOAWAY
/// fails exactly the streams above its last processed one, and
/// REFUSED_STREAM means the same for one stream (RFC 9113 §8.7).
fn unprocessed(error: &h2::Error) -> bool {
    (error.is_go_away() && error.is_remote()) || error.reason() == Some(h2::Reason::REFUSED_STREAM)
}

/// An error and its sources, as one line.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
