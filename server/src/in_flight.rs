//! Counting requests in flight, so that shutdown waits for them and for
//! nothing else.
//!
//! Both servers' own graceful shutdown also waits for idle keep-alive
//! connections to close, which a client may never do (hyper issue #4170).
//! So each front end carries [`InFlightLayer`]: a request counts from the
//! moment it is routed until its response body has been sent in full (for a
//! gRPC stream, until the stream ends), and shutdown waits on
//! [`InFlight::idle`] instead.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use prometheus::IntGauge;
use tokio::sync::Notify;
use tower::{Layer, Service};

/// The shared count.
#[derive(Debug, Default)]
pub struct InFlight {
    count: AtomicUsize,
    idle: Notify,
    /// Whether anyone waits for [`InFlight::idle`] (only shutdown does).
    /// A server answering one request at a time reaches zero after every
    /// request, and waking nobody still takes `Notify`'s lock.
    awaited: AtomicBool,
}

impl InFlight {
    pub fn new() -> Arc<Self> {
        Arc::new(InFlight::default())
    }

    pub fn count(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Counts one request, in the count and in `gauge`, until the guard drops.
    pub(crate) fn enter(self: &Arc<Self>, gauge: &IntGauge) -> Guard {
        self.count.fetch_add(1, Ordering::SeqCst);
        gauge.inc();
        Guard(Arc::clone(self), gauge.clone())
    }

    /// Resolves once no request is in flight.
    pub async fn idle(&self) {
        // Before the count is read: a release that reads `awaited` as false
        // happened before that read, and the read sees it.
        self.awaited.store(true, Ordering::SeqCst);
        loop {
            // Registered before the check, so a release in between is not missed.
            let released = self.idle.notified();
            if self.count() == 0 {
                return;
            }
            released.await;
        }
    }
}

/// One request's share of the count; released on drop.
pub(crate) struct Guard(Arc<InFlight>, IntGauge);

impl Drop for Guard {
    fn drop(&mut self) {
        self.1.dec();
        if self.0.count.fetch_sub(1, Ordering::SeqCst) == 1 && self.0.awaited.load(Ordering::SeqCst) {
            self.0.idle.notify_waiters();
        }
    }
}

/// A tower layer counting requests into an [`InFlight`], and into the
/// front end's `nereid_requests_in_flight` gauge.
#[derive(Debug, Clone)]
pub struct InFlightLayer {
    in_flight: Arc<InFlight>,
    gauge: IntGauge,
}

impl InFlightLayer {
    pub fn new(in_flight: Arc<InFlight>, gauge: IntGauge) -> Self {
        InFlightLayer { in_flight, gauge }
    }
}

impl<S> Layer<S> for InFlightLayer {
    type Service = InFlightService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        InFlightService {
            inner,
            in_flight: Arc::clone(&self.in_flight),
            gauge: self.gauge.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct InFlightService<S> {
    inner: S,
    in_flight: Arc<InFlight>,
    gauge: IntGauge,
}

impl<S, Req, B> Service<http::Request<Req>> for InFlightService<S>
where
    S: Service<http::Request<Req>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = http::Response<TrackedBody<B>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Req>) -> Self::Future {
        let guard = self.in_flight.enter(&self.gauge);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(response.map(|body| TrackedBody {
                inner: Box::pin(body),
                _guard: guard,
            }))
        })
    }
}

/// A response body that holds its request's count until it is dropped.
pub struct TrackedBody<B> {
    inner: Pin<Box<B>>,
    _guard: Guard,
}

impl<B: Body> Body for TrackedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        self.get_mut().inner.as_mut().poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn idle_waits_for_every_guard() {
        let in_flight = InFlight::new();
        in_flight.idle().await;
        let gauge = IntGauge::new("g", "in flight").unwrap();
        let a = in_flight.enter(&gauge);
        let b = in_flight.enter(&gauge);
        assert_eq!(gauge.get(), 2);
        assert_eq!(in_flight.count(), 2);
        let waiter = tokio::spawn({
            let in_flight = Arc::clone(&in_flight);
            async move { in_flight.idle().await }
        });
        drop(a);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished());
        drop(b);
        waiter.await.unwrap();
        assert_eq!(in_flight.count(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_before_anyone_waits_is_not_needed_and_one_after_is_seen() {
        let in_flight = InFlight::new();
        let gauge = IntGauge::new("g", "in flight").unwrap();
        // Counted up and down with nobody waiting: nothing to wake.
        drop(in_flight.enter(&gauge));
        let held = in_flight.enter(&gauge);
        let waiter = tokio::spawn({
            let in_flight = Arc::clone(&in_flight);
            async move { in_flight.idle().await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!waiter.is_finished());
        drop(held);
        waiter.await.unwrap();
        assert_eq!(gauge.get(), 0);
    }
}
