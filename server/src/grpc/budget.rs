//! Request bytes into the memory budget as they arrive, for gRPC.
//!
//! tonic decodes a whole message before a handler sees it, so the budget is
//! applied to the HTTP/2 body underneath: every DATA frame is reserved as it
//! arrives, and a frame that does not fit ends the call with
//! RESOURCE_EXHAUSTED before it is buffered. The bytes reserved so far are
//! left in the request's extensions ([`BodyAccount`]); the handler takes them
//! into the decoded request, so they stay reserved until the request is done
//! (for a stream, each message takes what arrived before it).
//!
//! A message's decoded size is counted too, before it is decoded: every
//! call runs within a [`DecodeAllowance`] (nereid-proto's codec asks it
//! before tonic decodes a message, and the ModelInfer fast path before it
//! does) that reserves the decoded size in the same account and refuses a
//! message that would decode to more than [`DECODED_PER_WIRE_LIMIT`] times
//! the message limit, whatever the budget.
//!
//! Unary calls must also arrive whole within the body timeout; streams are
//! long-lived by design and are not timed. The timer is armed only when the
//! body first has to be waited for: a unary message that came with its
//! headers, as almost all do, never touches the runtime's timer wheel (an
//! insertion and a removal under its lock, per request).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use nereid_proto::codec::{DecodeAllowance, WithAllowance, with_allowance};
use parking_lot::Mutex;
use tokio::time::Sleep;
use tower::{Layer, Service};

use crate::memory_budget::{MemoryBudget, Reservation};

/// One call's account: its body's bytes reserved so far, and the decoded
/// sizes of its messages, in one reservation and one allocation (a call
/// pays for this on every request; it was three before, with a second
/// extension to carry the allowance).
#[derive(Clone)]
pub struct BodyAccount(Arc<CallAccount>);

struct CallAccount {
    reservation: Mutex<Reservation>,
    /// The most one message may take decoded.
    max_decoded: usize,
}

impl BodyAccount {
    fn new(reservation: Reservation, max_decoded: usize) -> Self {
        BodyAccount(Arc::new(CallAccount {
            reservation: Mutex::new(reservation),
            max_decoded,
        }))
    }

    /// Everything reserved so far, leaving the account empty.
    pub fn take(&self) -> Reservation {
        self.0.reservation.lock().take()
    }

    /// What admits each message's decoded size into this account, for work
    /// on the call's messages that runs outside its task (a stream's reader).
    pub fn allowance(&self) -> Arc<dyn DecodeAllowance> {
        Arc::clone(&self.0) as Arc<dyn DecodeAllowance>
    }

    fn grow(&self, bytes: usize) -> Result<(), tonic::Status> {
        self.0.grow(bytes)
    }
}

impl CallAccount {
    /// Reserves `bytes` more, or says why the budget refuses them.
    fn grow(&self, bytes: usize) -> Result<(), tonic::Status> {
        self.reservation
            .lock()
            .grow(bytes)
            .map_err(|exhausted| tonic::Status::resource_exhausted(exhausted.to_string()))
    }
}

impl std::fmt::Debug for BodyAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BodyAccount")
    }
}

/// How many times `--grpc-max-message-size` one message may take once
/// decoded. prost's vectors of varint scalars (`int_contents` of small
/// values) take 8 times their wire bytes at most, so every honest message
/// fits; 2-byte empty entries of a repeated message field do not.
pub const DECODED_PER_WIRE_LIMIT: usize = 8;

impl DecodeAllowance for CallAccount {
    fn admit(&self, message: &str, wire: usize, decoded: usize) -> Result<(), tonic::Status> {
        if decoded > self.max_decoded {
            return Err(tonic::Status::resource_exhausted(format!(
                "a {message} of {wire} bytes would take {decoded} bytes decoded, more than the {} bytes one message may take ({DECODED_PER_WIRE_LIMIT} x --grpc-max-message-size)",
                self.max_decoded
            )));
        }
        self.grow(decoded)
    }
}

/// Runs `future` under a call's decode allowance ([`BodyAccount::allowance`]),
/// as it is outside this layer.
pub async fn with_call_allowance<F: Future>(allowance: Option<Arc<dyn DecodeAllowance>>, future: F) -> F::Output {
    match allowance {
        Some(allowance) => with_allowance(allowance, future).await,
        None => future.await,
    }
}

/// The reservation a handler takes from its request, or none outside this layer.
pub fn take_reservation(extensions: &http::Extensions) -> Reservation {
    extensions
        .get::<BodyAccount>()
        .map(BodyAccount::take)
        .unwrap_or_default()
}

#[derive(Debug, Clone)]
pub struct BudgetLayer {
    budget: Arc<MemoryBudget>,
    unary_timeout: Duration,
    max_decoded: usize,
}

impl BudgetLayer {
    /// `max_message_size`: `--grpc-max-message-size`, which bounds one
    /// message's decoded size too (see [`DECODED_PER_WIRE_LIMIT`]).
    pub fn new(budget: Arc<MemoryBudget>, unary_timeout: Duration, max_message_size: usize) -> Self {
        BudgetLayer {
            budget,
            unary_timeout,
            max_decoded: max_message_size.saturating_mul(DECODED_PER_WIRE_LIMIT),
        }
    }
}

impl<S> Layer<S> for BudgetLayer {
    type Service = BudgetService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BudgetService {
            inner,
            layer: self.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct BudgetService<S> {
    inner: S,
    layer: BudgetLayer,
}

/// The calls whose request is a stream of messages.
fn is_stream(path: &str) -> bool {
    path.ends_with("/ModelStreamInfer") || path.ends_with("/Watch")
}

impl<S> Service<http::Request<tonic::body::Body>> for BudgetService<S>
where
    S: Service<http::Request<tonic::body::Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = WithAllowance<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let account = BodyAccount::new(self.layer.budget.reservation(), self.layer.max_decoded);
        let deadline = match is_stream(request.uri().path()) {
            true => Deadline::Untimed,
            false => Deadline::Unarmed(self.layer.unary_timeout),
        };
        let allowance = account.allowance();
        let (mut parts, body) = request.into_parts();
        parts.extensions.insert(account.clone());
        let body = tonic::body::Body::new(BudgetedBody {
            inner: body,
            account,
            deadline,
        });
        with_allowance(allowance, self.inner.call(http::Request::from_parts(parts, body)))
    }
}

/// A request body whose frames are reserved as they arrive.
struct BudgetedBody {
    inner: tonic::body::Body,
    account: BodyAccount,
    deadline: Deadline,
}

/// A unary body's timeout, counted from when it first has to be waited for
/// (microseconds after the call's headers, when the handler first reads).
enum Deadline {
    /// A stream's body, or a timeout that has fired.
    Untimed,
    Unarmed(Duration),
    Armed(Pin<Box<Sleep>>, Duration),
}

impl Deadline {
    /// Called when the body has nothing ready: arms the timer if it is not
    /// yet, and says when it has fired.
    fn poll_expired(&mut self, cx: &mut Context<'_>) -> Poll<Duration> {
        if let Deadline::Unarmed(after) = *self {
            *self = Deadline::Armed(Box::pin(tokio::time::sleep(after)), after);
        }
        let Deadline::Armed(sleep, after) = self else {
            return Poll::Pending;
        };
        let after = *after;
        ready!(sleep.as_mut().poll(cx));
        *self = Deadline::Untimed;
        Poll::Ready(after)
    }
}

impl Body for BudgetedBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => {
                let after = ready!(this.deadline.poll_expired(cx));
                return Poll::Ready(Some(Err(tonic::Status::deadline_exceeded(format!(
                    "the request message did not arrive within {} s (--grpc-body-timeout-secs)",
                    after.as_secs()
                )))));
            }
        };
        if let Some(data) = frame.data_ref()
            && let Err(exhausted) = this.account.grow(data.len())
        {
            return Poll::Ready(Some(Err(exhausted)));
        }
        Poll::Ready(Some(Ok(frame)))
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
    use std::future::poll_fn;

    use futures::StreamExt;

    use super::*;

    fn budgeted(inner: tonic::body::Body, deadline: Deadline) -> BudgetedBody {
        BudgetedBody {
            inner,
            account: BodyAccount::new(MemoryBudget::new(1 << 20).reservation(), 1 << 20),
            deadline,
        }
    }

    async fn next(body: &mut BudgetedBody) -> Option<Result<Frame<Bytes>, tonic::Status>> {
        poll_fn(|cx| Pin::new(&mut *body).poll_frame(cx)).await
    }

    /// A body that sends its first frame, then nothing.
    fn stalled() -> tonic::body::Body {
        let frames = futures::stream::iter([Ok::<_, tonic::Status>(Frame::data(Bytes::from_static(b"x")))])
            .chain(futures::stream::pending());
        tonic::body::Body::new(http_body_util::StreamBody::new(frames))
    }

    #[tokio::test(start_paused = true)]
    async fn a_unary_body_that_stalls_ends_with_deadline_exceeded_after_the_timeout() {
        let started = tokio::time::Instant::now();
        let mut body = budgeted(stalled(), Deadline::Unarmed(Duration::from_secs(60)));
        let first = next(&mut body).await.expect("a frame").expect("the first frame");
        assert_eq!(first.into_data().unwrap(), Bytes::from_static(b"x"));
        // What arrived at once armed no timer.
        assert!(matches!(body.deadline, Deadline::Unarmed(_)));
        let error = next(&mut body).await.expect("an error").unwrap_err();
        assert_eq!(error.code(), tonic::Code::DeadlineExceeded);
        assert!(
            error.message().contains("--grpc-body-timeout-secs"),
            "{}",
            error.message()
        );
        assert_eq!(started.elapsed(), Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_body_is_not_timed() {
        let mut body = budgeted(stalled(), Deadline::Untimed);
        next(&mut body).await.expect("a frame").expect("the first frame");
        let waited = tokio::time::timeout(Duration::from_secs(3600), next(&mut body)).await;
        assert!(waited.is_err(), "a stream's body ended: {waited:?}");
    }
}
