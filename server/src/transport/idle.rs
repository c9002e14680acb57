//! Closing HTTP/2 connections that hold a slot and do nothing, and every
//! connection at shutdown, with a GOAWAY rather than a reset.
//!
//! HTTP/1.1 has its header read timeout for a connection idle between
//! requests; HTTP/2 had nothing: 4,096 connections that sent only the
//! preface filled the HTTP port's connection cap, and every other client's
//! request failed for as long as they stayed (256 did the same to the
//! metrics port and blinded the autoscaler). A [`Supervised`] connection
//! counts the requests its service started and the ones still answering
//! ([`Activity`], kept by [`Tracked`]); a connection with none answering
//! and none started since the last look is drained (GOAWAY, then closed
//! once its streams are done). The first look comes after the handshake
//! deadline, so a connection must start its first request within it, as it
//! must send its first bytes; later looks come every idle timeout, so an
//! idle connection is closed after one to two of them. A drain never cuts
//! a request: GOAWAY tells the client which streams were seen, and it sends
//! later ones on a new connection.
//!
//! The same wrapper drains every connection at shutdown (hyper_util's
//! graceful watcher would hide the connection from the idle check).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::rt::{Read, Write};
use hyper_util::rt::TokioExecutor;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::WaitForCancellationFutureOwned;

use super::Peer;

/// What a connection's requests are doing.
#[derive(Debug, Default)]
pub struct Activity {
    started: AtomicU64,
    answering: AtomicUsize,
}

/// A hyper service whose requests are counted in an [`Activity`] until
/// their response body has been sent (or dropped), and carry their
/// connection's [`Peer`].
#[derive(Debug, Clone)]
pub struct Tracked<S> {
    inner: S,
    activity: Arc<Activity>,
    peer: Option<Peer>,
}

impl<S> Tracked<S> {
    pub fn new(inner: S, activity: Arc<Activity>, peer: Option<Peer>) -> Self {
        Tracked { inner, activity, peer }
    }
}

/// One request's count, given back when dropped.
#[derive(Debug)]
struct Answering(Arc<Activity>);

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.answering.fetch_sub(1, Ordering::AcqRel);
    }
}

impl<S, B> hyper::service::Service<Request<Incoming>> for Tracked<S>
where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>>,
{
    type Response = Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = TrackedFuture<S::Future>;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        if let Some(peer) = self.peer {
            request.extensions_mut().insert(peer);
        }
        self.activity.started.fetch_add(1, Ordering::AcqRel);
        self.activity.answering.fetch_add(1, Ordering::AcqRel);
        TrackedFuture {
            inner: self.inner.call(request),
            answering: Some(Answering(Arc::clone(&self.activity))),
        }
    }
}

pin_project! {
    pub struct TrackedFuture<F> {
        #[pin]
        inner: F,
        answering: Option<Answering>,
    }
}

impl<F, B, E> Future for TrackedFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<TrackedBody<B>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = ready!(this.inner.poll(cx))?;
        let answering = this.answering.take();
        Poll::Ready(Ok(response.map(|inner| TrackedBody {
            inner,
            _answering: answering,
        })))
    }
}

pin_project! {
    pub struct TrackedBody<B> {
        #[pin]
        inner: B,
        _answering: Option<Answering>,
    }
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        self.project().inner.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A connection that can be asked to finish its requests and close.
pub trait Drain: Future {
    fn drain(self: Pin<&mut Self>);
}

impl<I, S, B> Drain for hyper::server::conn::http2::Connection<I, S, TokioExecutor>
where
    I: Read + Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn drain(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<I, S, B> Drain for hyper::server::conn::http1::Connection<I, S>
where
    I: Read + Write + Unpin + Send + 'static,
    S: hyper::service::HttpService<Incoming, ResBody = B>,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: Body + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    fn drain(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

pin_project! {
    /// A connection drained at shutdown and, when `idle` is set, once it
    /// has been idle (see the module's comment).
    pub struct Supervised<C> {
        #[pin]
        conn: C,
        #[pin]
        shutdown: WaitForCancellationFutureOwned,
        #[pin]
        look: Sleep,
        idle: Option<(Arc<Activity>, Duration)>,
        seen: u64,
        draining: bool,
        // Drained for idleness: closed at the next look even if the client
        // never acknowledges the GOAWAY (h2 waits for its PING's answer).
        closing: bool,
    }
}

impl<C: Drain> Supervised<C> {
    /// `idle`: the connection's activity and idle timeout; the first look
    /// is `first_look` after now.
    pub fn new(
        conn: C,
        shutdown: WaitForCancellationFutureOwned,
        idle: Option<(Arc<Activity>, Duration)>,
        first_look: Duration,
    ) -> Self {
        Supervised {
            conn,
            shutdown,
            look: tokio::time::sleep(first_look),
            idle,
            seen: 0,
            draining: false,
            closing: false,
        }
    }
}

/// How long a connection drained for idleness has to close by itself
/// before it is closed: nothing of it is running, so this only spares a
/// cooperating client a reset.
const DRAIN_GRACE: Duration = Duration::from_secs(1);

impl<C: Drain> Future for Supervised<C> {
    /// How the connection ended is the connection's affair: errors of a
    /// client's making are not the server's to report.
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut this = self.project();
        if !*this.draining && this.shutdown.as_mut().poll(cx).is_ready() {
            *this.draining = true;
            this.conn.as_mut().drain();
        }
        if let Some((activity, every)) = this.idle
            && (!*this.draining || *this.closing)
            && this.look.as_mut().poll(cx).is_ready()
        {
            let started = activity.started.load(Ordering::Acquire);
            let idle = started == *this.seen && activity.answering.load(Ordering::Acquire) == 0;
            if *this.closing && idle {
                return Poll::Ready(());
            }
            if idle {
                tracing::debug!("closing an idle HTTP/2 connection");
                *this.draining = true;
                *this.closing = true;
                this.conn.as_mut().drain();
            }
            *this.seen = started;
            let next = if *this.closing { DRAIN_GRACE } else { *every };
            this.look.as_mut().reset(Instant::now() + next);
            // Registers the new deadline.
            let _ = this.look.as_mut().poll(cx);
        }
        this.conn.poll(cx).map(|_| ())
    }
}
