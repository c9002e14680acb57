//! The timeouts of one client connection once it has begun (the handshake
//! timeout comes before, in [`crate::listen`]):
//!
//! - idle (`--idle-timeout-secs`): no request (HTTP/1) or stream (HTTP/2)
//!   open and, on HTTP/1.1, no byte of the next request heard. The
//!   connection is then closed: HTTP/1 at once, HTTP/2 after a GOAWAY.
//! - header read (`--header-read-timeout-secs`, HTTP/1.1 only): bytes of a
//!   request head heard while no request was open, and the head still not
//!   whole. The connection is closed.
//!
//! hyper's own `header_read_timeout` cannot be used for the second: it
//! starts when the previous answer ends, so on a kept-alive connection it
//! is the idle timeout too, and the two could not differ (nginx's
//! `keepalive_timeout` and `client_header_timeout` do).
//!
//! The policy is a pure function of the connection's state
//! ([`State::deadline`]); [`Clock`] holds that state, fed by the requests
//! ([`Clock::open`]) and the socket ([`Noticed`]), and the connection's task
//! waits on [`Clock::expired`] beside the connection itself.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::limits::Limits;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    pub idle: Duration,
    /// `None` for HTTP/2, whose frames between requests (pings, window
    /// updates) are not the start of a request.
    pub header_read: Option<Duration>,
}

impl Timeouts {
    pub fn http1(limits: &Limits) -> Self {
        Timeouts {
            idle: limits.idle_timeout,
            header_read: Some(limits.header_read_timeout),
        }
    }

    pub fn http2(limits: &Limits) -> Self {
        Timeouts {
            idle: limits.idle_timeout,
            header_read: None,
        }
    }
}

/// Which timeout ran out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    Idle,
    HeaderRead,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct State {
    /// Requests or streams open.
    open: usize,
    /// When the current wait began: the last request's end (or the
    /// connection's start), or, once `heard`, the next head's first byte.
    since: Instant,
    /// Whether bytes came while nothing was open.
    heard: bool,
}

impl State {
    /// When the connection times out if nothing changes, and why; `None`
    /// while a request or stream is open (its body has a timeout of its
    /// own, and an answer or a stream may take as long as it takes).
    fn deadline(&self, timeouts: &Timeouts) -> Option<(Instant, Expiry)> {
        if self.open > 0 {
            return None;
        }
        match timeouts.header_read {
            Some(header_read) if self.heard => Some((self.since + header_read, Expiry::HeaderRead)),
            _ => Some((self.since + timeouts.idle, Expiry::Idle)),
        }
    }

    fn open(&mut self) {
        self.open += 1;
    }

    /// A request ended; returns whether the connection became idle.
    fn close(&mut self, now: Instant) -> bool {
        self.open = self.open.saturating_sub(1);
        if self.open > 0 {
            return false;
        }
        self.since = now;
        self.heard = false;
        true
    }

    /// Bytes came; returns whether they began a head (HTTP/1.1, nothing
    /// open and nothing heard yet).
    fn hear(&mut self, now: Instant, timeouts: &Timeouts) -> bool {
        if timeouts.header_read.is_none() || self.open > 0 || self.heard {
            return false;
        }
        self.heard = true;
        self.since = now;
        true
    }
}

struct Inner {
    timeouts: Timeouts,
    state: Mutex<State>,
    /// Told when the deadline may have moved earlier or appeared.
    changed: Notify,
}

/// One connection's clock, shared by its task, its requests and its socket.
#[derive(Clone)]
pub struct Clock(Arc<Inner>);

/// A request or stream counted open until dropped.
pub struct Open(Arc<Inner>);

impl Clock {
    /// A clock starting now; `heard` when the connection's first bytes
    /// (the start of a request head) have already been read.
    pub fn new(timeouts: Timeouts, heard: bool) -> Self {
        Clock(Arc::new(Inner {
            timeouts,
            state: Mutex::new(State {
                open: 0,
                since: Instant::now(),
                heard,
            }),
            changed: Notify::new(),
        }))
    }

    /// Counts a request or stream open until the guard is dropped.
    pub fn open(&self) -> Open {
        // No deadline while it is open: the waiter finds that out when its
        // old deadline comes, so it is not woken for it.
        self.0.state.lock().open();
        Open(Arc::clone(&self.0))
    }

    /// Whether a request or stream is open.
    pub fn busy(&self) -> bool {
        self.0.state.lock().open > 0
    }

    /// Bytes were read from the client.
    pub fn heard(&self) {
        if self.0.state.lock().hear(Instant::now(), &self.0.timeouts) {
            self.0.changed.notify_one();
        }
    }

    /// Waits until a timeout runs out with nothing having changed.
    pub async fn expired(&self) -> Expiry {
        loop {
            let changed = self.0.changed.notified();
            let deadline = self.0.state.lock().deadline(&self.0.timeouts);
            let Some((at, expiry)) = deadline else {
                changed.await;
                continue;
            };
            tokio::select! {
                () = changed => {}
                () = tokio::time::sleep_until(at) => {
                    // Something may have changed just as the time came.
                    if self.0.state.lock().deadline(&self.0.timeouts) == Some((at, expiry)) {
                        return expiry;
                    }
                }
            }
        }
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if self.0.state.lock().close(Instant::now()) {
            self.0.changed.notify_one();
        }
    }
}

/// A client's socket that tells its connection's clock when bytes come.
pub struct Noticed<T> {
    io: T,
    clock: Clock,
}

impl<T> Noticed<T> {
    pub fn new(io: T, clock: Clock) -> Self {
        Noticed { io, clock }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Noticed<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        ready!(Pin::new(&mut self.io).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            self.clock.heard();
        }
        Poll::Ready(Ok(()))
    }
}

crate::write_through::write_through!(Noticed);

#[cfg(test)]
mod tests {
    use super::*;

    const HTTP1: Timeouts = Timeouts {
        idle: Duration::from_secs(120),
        header_read: Some(Duration::from_secs(30)),
    };
    const HTTP2: Timeouts = Timeouts {
        idle: Duration::from_secs(120),
        header_read: None,
    };

    fn at(start: Instant, secs: u64) -> Instant {
        start + Duration::from_secs(secs)
    }

    #[test]
    fn an_open_request_stops_every_timeout() {
        let start = Instant::now();
        let mut state = State {
            open: 0,
            since: start,
            heard: false,
        };
        assert_eq!(state.deadline(&HTTP1), Some((at(start, 120), Expiry::Idle)));
        state.open();
        assert_eq!(state.deadline(&HTTP1), None);
        assert!(!state.hear(at(start, 5), &HTTP1), "a body's bytes are not a new head");
        state.open();
        assert!(!state.close(at(start, 10)), "one is still open");
        assert!(state.close(at(start, 20)));
        assert_eq!(state.deadline(&HTTP1), Some((at(start, 140), Expiry::Idle)));
    }

    #[test]
    fn a_heads_first_byte_starts_the_header_read_timeout() {
        let start = Instant::now();
        let mut state = State {
            open: 0,
            since: start,
            heard: false,
        };
        assert!(state.hear(at(start, 100), &HTTP1));
        assert_eq!(state.deadline(&HTTP1), Some((at(start, 130), Expiry::HeaderRead)));
        assert!(!state.hear(at(start, 110), &HTTP1), "later bytes do not move it");
        assert_eq!(state.deadline(&HTTP1), Some((at(start, 130), Expiry::HeaderRead)));
        // The head is whole: its request opens; once answered, idle again.
        state.open();
        state.close(at(start, 200));
        assert_eq!(state.deadline(&HTTP1), Some((at(start, 320), Expiry::Idle)));
    }

    #[test]
    fn http2_frames_between_streams_do_not_start_a_head() {
        let start = Instant::now();
        let mut state = State {
            open: 0,
            since: start,
            heard: false,
        };
        // A ping or a window update while no stream is open: the idle
        // timeout runs on from the last stream's end.
        assert!(!state.hear(at(start, 50), &HTTP2));
        assert_eq!(state.deadline(&HTTP2), Some((at(start, 120), Expiry::Idle)));
    }

    #[tokio::test]
    async fn the_clock_expires_only_when_nothing_is_open() {
        let clock = Clock::new(
            Timeouts {
                idle: Duration::from_millis(20),
                header_read: None,
            },
            false,
        );
        let open = clock.open();
        let early = tokio::time::timeout(Duration::from_millis(100), clock.expired()).await;
        assert!(early.is_err(), "a request is open");
        drop(open);
        let expired = tokio::time::timeout(Duration::from_secs(10), clock.expired()).await;
        assert_eq!(expired, Ok(Expiry::Idle));
    }
}
