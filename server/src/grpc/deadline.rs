//! A call's `grpc-timeout`: past it, the call is dropped (its model run
//! cancelled if it has not started) and answered `CANCELLED`, "Timeout
//! expired", as tonic's server answers it, since the gRPC port is served by
//! our own loop over hyper (crate::transport::serve) instead of tonic's.
//!
//! The deadline covers the answer's head, as tonic's does: a stream's
//! messages after it are the stream's own business.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::HeaderMap;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tonic::Status;
use tonic::body::Body;
use tower::{Layer, Service};

#[derive(Debug, Clone, Copy, Default)]
pub struct DeadlineLayer;

impl<S> Layer<S> for DeadlineLayer {
    type Service = DeadlineService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        DeadlineService { inner }
    }
}

#[derive(Debug, Clone)]
pub struct DeadlineService<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for DeadlineService<S>
where
    S: Service<http::Request<B>, Response = http::Response<Body>, Error = Infallible>,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Deadline<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let sleep = timeout(request.headers()).map(|timeout| Box::pin(tokio::time::sleep(timeout)));
        Deadline {
            inner: self.inner.call(request),
            sleep,
        }
    }
}

pin_project! {
    /// The call's answer, or the status its deadline gives.
    pub struct Deadline<F> {
        #[pin]
        inner: F,
        // Boxed: most calls carry no deadline, and a `Sleep` is large.
        sleep: Option<Pin<Box<Sleep>>>,
    }
}

impl<F> Future for Deadline<F>
where
    F: Future<Output = Result<http::Response<Body>, Infallible>>,
{
    type Output = Result<http::Response<Body>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(answer) = this.inner.poll(cx) {
            return Poll::Ready(answer);
        }
        if let Some(sleep) = this.sleep.as_mut() {
            ready!(sleep.as_mut().poll(cx));
            return Poll::Ready(Ok(Status::cancelled("Timeout expired").into_http()));
        }
        Poll::Pending
    }
}

/// The `grpc-timeout` header: up to eight digits and a unit (hours,
/// minutes, seconds, milli-, micro-, nanoseconds). A malformed one is
/// ignored, as tonic and grpc-go ignore it.
fn timeout(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get("grpc-timeout")?.to_str().ok()?;
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let amount: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(amount * 3600),
        "M" => Duration::from_secs(amount * 60),
        "S" => Duration::from_secs(amount),
        "m" => Duration::from_millis(amount),
        "u" => Duration::from_micros(amount),
        "n" => Duration::from_nanos(amount),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn parsed(value: &str) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        headers.insert("grpc-timeout", HeaderValue::from_str(value).unwrap());
        timeout(&headers)
    }

    #[test]
    fn every_unit_and_the_malformed_ones() {
        assert_eq!(parsed("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parsed("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parsed("4S"), Some(Duration::from_secs(4)));
        assert_eq!(parsed("99999999m"), Some(Duration::from_millis(99_999_999)));
        assert_eq!(parsed("5u"), Some(Duration::from_micros(5)));
        assert_eq!(parsed("6n"), Some(Duration::from_nanos(6)));
        assert_eq!(timeout(&HeaderMap::new()), None);
        for malformed in ["", "m", "100", "123456789m", "1x", "-1S", "+1S", "1.5S"] {
            assert_eq!(parsed(malformed), None, "{malformed:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_call_past_its_deadline_is_answered_cancelled() {
        let slow = tower::service_fn(|_: http::Request<()>| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Infallible>(http::Response::new(Body::empty()))
        });
        let mut service = DeadlineLayer.layer(slow);
        let request = http::Request::builder().header("grpc-timeout", "10m").body(()).unwrap();
        let answer = service.call(request).await.unwrap();
        let status = Status::from_header_map(answer.headers()).expect("a status in the head");
        assert_eq!(status.code(), tonic::Code::Cancelled);
        assert_eq!(status.message(), "Timeout expired");

        // Without a deadline the same call runs to its end.
        let answer = service.call(http::Request::new(())).await.unwrap();
        assert!(Status::from_header_map(answer.headers()).is_none());
    }
}
