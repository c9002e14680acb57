//! Cleartext HTTP/2 connections to pod addresses, shared by every request
//! to them (gRPC on the pod's gRPC port; REST on its HTTP port, which speaks
//! h2c too), made on first use and again after they close.
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
//!
//! One connection per pod carries everything until it is full: the pod
//! allows so many streams on a connection (its SETTINGS_MAX_CONCURRENT_STREAMS,
//! 1024 for nereid-server), and h2 queues a stream past that until one
//! ends. A client holding many idle ModelStreamInfer streams would then
//! leave every other client's call queued until its deadline. So each
//! connection counts the streams the gateway has open on it
//! ([`StreamSlot`]), a full one is passed over, and a new one is opened
//! while there are fewer than `--max-pod-connections`; when those are all
//! full the request is not sent ([`SendError::Busy`]) and goes to another
//! pod or fails at once with UNAVAILABLE naming the flag, rather than
//! waiting. (The other half of the fix caps the streams one client
//! connection may hold: [`crate::grpc_front`].)

mod heard;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
use crate::limits::flag;
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
    /// The request was not sent: every connection the gateway may open to
    /// the pod is carrying all the streams the pod allows. It may go to
    /// another pod; the pod is busy, not broken.
    #[error("{0}")]
    Busy(String),
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

/// A connection's handle, whether its connection has ended, whether the
/// pod has said anything on it, and the streams the gateway has open on it.
#[derive(Clone)]
struct Connection {
    sender: SendRequest<Bytes>,
    closed: Arc<AtomicBool>,
    heard: Arc<AtomicBool>,
    streams: Arc<AtomicUsize>,
}

impl Connection {
    fn is_open(&self) -> bool {
        !self.closed.load(Ordering::Acquire)
    }

    /// A stream counted open on this connection, unless it already has as
    /// many as the pod allows (which h2 knows once the pod's SETTINGS have
    /// come; unbounded before).
    fn try_slot(&self) -> Option<StreamSlot> {
        let allowed = self.sender.current_max_send_streams();
        self.streams
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < allowed).then_some(open + 1)
            })
            .ok()?;
        Some(StreamSlot {
            _open: Arc::new(Counted(Arc::clone(&self.streams))),
        })
    }
}

/// A stream counted open on its connection until every clone is dropped:
/// the answer's body holds one, and a streamed request's pump another.
/// (Dropped a little after h2 frees the stream at worst, which only makes
/// the pool open a new connection a little early.)
#[derive(Clone, Debug)]
pub struct StreamSlot {
    _open: Arc<Counted>,
}

#[derive(Debug)]
struct Counted(Arc<AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A sent request's answer to come.
pub struct Pending {
    response: ResponseFuture,
    /// Its connection's [`Connection::heard`].
    heard: Arc<AtomicBool>,
    slot: StreamSlot,
}

impl Pending {
    /// The request's stream, counted open on its connection.
    pub fn slot(&self) -> StreamSlot {
        self.slot.clone()
    }
}

/// Where a new stream to an address can go.
enum Room {
    /// On this open connection.
    On(Connection, StreamSlot),
    /// On a new connection.
    New,
    /// Nowhere: every connection is full, and there are as many as allowed.
    Full { connections: usize },
}

pub struct Pool {
    connect_timeout: Duration,
    /// The most connections to one address (`--max-pod-connections`).
    max_per_address: usize,
    connections: Mutex<HashMap<SocketAddr, Vec<Connection>>>,
    /// One connect at a time per address: the others wait for it.
    connecting: Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<()>>>>,
}

impl Pool {
    pub fn new(connect_timeout: Duration, max_per_address: usize) -> Self {
        Pool {
            connect_timeout,
            max_per_address: max_per_address.max(1),
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
        let (connection, slot) = self.slot(address).await?;
        let opened = match connection.sender.clone().ready().await {
            Ok(mut sender) => sender.send_request(request, end_of_stream),
            Err(error) => Err(error),
        };
        opened
            .map(|(response, send)| {
                let heard = Arc::clone(&connection.heard);
                (Pending { response, heard, slot }, send)
            })
            .map_err(|error| {
                // A connection that opens no stream is closing: the next
                // request passes it over and makes a new one.
                connection.closed.store(true, Ordering::Release);
                SendError::NotSent(format!("{address}: {}", error_chain(&error)))
            })
    }

    /// A stream slot on a connection to `address`: the first open one with
    /// room, else a new one.
    async fn slot(&self, address: SocketAddr) -> Result<(Connection, StreamSlot), SendError> {
        match self.room(address) {
            Room::On(connection, slot) => return Ok((connection, slot)),
            Room::Full { connections } => return Err(self.busy(address, connections)),
            Room::New => {}
        }
        let lock = {
            let mut connecting = self.connecting.lock();
            // Pods come and go with new addresses: the slow path drops the
            // records of those nobody is connecting to and whose
            // connections have closed, so neither map grows with the pods
            // ever seen.
            connecting.retain(|_, lock| Arc::strong_count(lock) > 1);
            self.connections.lock().retain(|_, open| {
                open.retain(Connection::is_open);
                !open.is_empty()
            });
            Arc::clone(connecting.entry(address).or_default())
        };
        let _connecting = lock.lock().await;
        // Another request may have connected while this one waited.
        match self.room(address) {
            Room::On(connection, slot) => return Ok((connection, slot)),
            Room::Full { connections } => return Err(self.busy(address, connections)),
            Room::New => {}
        }
        let connection = self.connect(address).await.map_err(SendError::NotSent)?;
        let slot = connection
            .try_slot()
            .ok_or_else(|| SendError::NotSent(format!("{address}: the pod allows no stream on a new connection")))?;
        self.connections
            .lock()
            .entry(address)
            .or_default()
            .push(connection.clone());
        Ok((connection, slot))
    }

    fn room(&self, address: SocketAddr) -> Room {
        let mut connections = self.connections.lock();
        let Some(open) = connections.get_mut(&address) else {
            return Room::New;
        };
        open.retain(Connection::is_open);
        for connection in open.iter() {
            if let Some(slot) = connection.try_slot() {
                return Room::On(connection.clone(), slot);
            }
        }
        if open.len() < self.max_per_address {
            Room::New
        } else {
            Room::Full {
                connections: open.len(),
            }
        }
    }

    fn busy(&self, address: SocketAddr, connections: usize) -> SendError {
        SendError::Busy(format!(
            "{address}: each of the gateway's {connections} HTTP/2 connections to it carries as many streams as \
             the pod allows, and the gateway opens at most {} ({})",
            self.max_per_address,
            flag::MAX_POD_CONNECTIONS
        ))
    }

    /// A new connection to `address`, driven on its own task.
    async fn connect(&self, address: SocketAddr) -> Result<Connection, String> {
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
        Ok(Connection {
            sender,
            closed,
            heard,
            streams: Arc::new(AtomicUsize::new(0)),
        })
    }
}

/// The pod's answer to a stream opened with [`Pool::open`], or how the
/// exchange failed.
pub async fn answer(pending: Pending) -> Result<Response<H2Body>, SendError> {
    let Pending { response, heard, .. } = pending;
    match response.await {
        Ok(response) => Ok(response.map(H2Body::new)),
        Err(error) if unprocessed(&error) => Err(SendError::Refused(error_chain(&error))),
        Err(error) if !heard.load(Ordering::Acquire) => Err(SendError::Refused(format!(
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
