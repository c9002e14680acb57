//! One cleartext HTTP/2 connection per pod address, shared by every request
//! to it (gRPC on the pod's gRPC port; REST on its HTTP port, which speaks
//! h2c too), made on first use and again after it closes.
//!
//! The gateway manages these itself rather than through a generic pooled
//! client because it must know, for every failure, whether the request
//! reached the pod: a connect that failed, or a request the connection
//! handed back unsent (it was closing: GOAWAY), may go to another pod; a
//! request that was sent never goes anywhere else.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use parking_lot::Mutex;
use thiserror::Error;
use tokio::net::TcpStream;

use crate::request_body::Outgoing;

#[derive(Debug, Error)]
pub enum SendError {
    /// The request was not sent: no connection, or the connection was
    /// closing. It may go to another pod; the body is handed back.
    #[error("{reason}")]
    NotSent {
        reason: String,
        request: Option<Box<Request<Outgoing>>>,
    },
    /// The request was sent, and the pod declared it unprocessed: a stream
    /// above its GOAWAY's last stream, or one it refused (REFUSED_STREAM).
    /// Its body was consumed; a whole body may still go elsewhere.
    #[error("{0}")]
    Refused(String),
    /// The request was sent (or may have been), then the exchange failed.
    #[error("{0}")]
    Failed(String),
}

pub struct Pool {
    connect_timeout: Duration,
    senders: Mutex<HashMap<SocketAddr, SendRequest<Outgoing>>>,
    /// One connect at a time per address: the others wait for it.
    connecting: Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<()>>>>,
}

impl Pool {
    pub fn new(connect_timeout: Duration) -> Self {
        Pool {
            connect_timeout,
            senders: Mutex::new(HashMap::new()),
            connecting: Mutex::new(HashMap::new()),
        }
    }

    /// Sends `request` to `address` over its connection.
    pub async fn send(&self, address: SocketAddr, request: Request<Outgoing>) -> Result<Response<Incoming>, SendError> {
        let mut sender = match self.sender(address).await {
            Ok(sender) => sender,
            Err(reason) => {
                return Err(SendError::NotSent {
                    reason,
                    request: Some(Box::new(request)),
                });
            }
        };
        match sender.try_send_request(request).await {
            Ok(response) => Ok(response),
            Err(mut error) => {
                let unsent = error.take_message();
                let reason = error_chain(error.error());
                match unsent {
                    Some(request) => {
                        self.forget(address);
                        Err(SendError::NotSent {
                            reason,
                            request: Some(Box::new(request)),
                        })
                    }
                    None if unprocessed(error.error()) => Err(SendError::Refused(reason)),
                    None => Err(SendError::Failed(reason)),
                }
            }
        }
    }

    /// The connection to `address`, made if there is none open.
    async fn sender(&self, address: SocketAddr) -> Result<SendRequest<Outgoing>, String> {
        if let Some(sender) = self.open(address) {
            return Ok(sender);
        }
        let lock = {
            let mut connecting = self.connecting.lock();
            // Pods come and go with new addresses: the slow path drops the
            // records of those nobody is connecting to and whose connection
            // has closed, so neither map grows with the pods ever seen.
            connecting.retain(|_, lock| Arc::strong_count(lock) > 1);
            self.senders.lock().retain(|_, sender| !sender.is_closed());
            Arc::clone(connecting.entry(address).or_default())
        };
        let _connecting = lock.lock().await;
        // Another request may have connected while this one waited.
        if let Some(sender) = self.open(address) {
            return Ok(sender);
        }
        let stream = tokio::time::timeout(self.connect_timeout, TcpStream::connect(address))
            .await
            .map_err(|_| format!("connecting to {address} timed out after {:?}", self.connect_timeout))?
            .map_err(|e| format!("connecting to {address}: {e}"))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            // Tensors are large: windows that do not stall a 4 MiB request.
            .initial_stream_window_size(4 << 20)
            .initial_connection_window_size(16 << 20)
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .handshake(TokioIo::new(stream))
            .await
            .map_err(|e| format!("HTTP/2 handshake with {address}: {}", error_chain(&e)))?;
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%address, %error, "connection to a pod ended");
            }
        });
        self.senders.lock().insert(address, sender.clone());
        Ok(sender)
    }

    fn open(&self, address: SocketAddr) -> Option<SendRequest<Outgoing>> {
        let mut senders = self.senders.lock();
        match senders.get(&address) {
            Some(sender) if !sender.is_closed() => Some(sender.clone()),
            Some(_) => {
                senders.remove(&address);
                None
            }
            None => None,
        }
    }

    /// Drops the cached connection to `address`: it handed a request back
    /// unsent, so it is closing. (Should another request have replaced it
    /// meanwhile, that one is dropped from the cache too, and the next
    /// request connects once more: harmless.)
    fn forget(&self, address: SocketAddr) {
        self.senders.lock().remove(&address);
    }
}

/// Whether HTTP/2 says the server never processed the stream: GOAWAY
/// fails exactly the streams above its last processed one, and
/// REFUSED_STREAM means the same for one stream (RFC 9113 §8.7).
fn unprocessed(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(cause) = next {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            return (h2.is_go_away() && h2.is_remote()) || h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        next = cause.source();
    }
    false
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
