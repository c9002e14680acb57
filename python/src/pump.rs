//! A decoupled model's stub, read by a thread of its own.
//!
//! Triton lets a decoupled model keep a request's response sender after
//! `execute` returns and takes the model's next batch meanwhile: its vLLM
//! backend's model.py returns at once and streams every request from a
//! loop of its own, so one instance serves many streams. Here the instance
//! thread takes each request's responder out of its batch
//! ([`ResponseSink::detach`]), files it under a key unique for the stub's
//! life, sends `execute` and waits only for `executed`. The pump reads
//! everything the stub sends, whenever it sends it: responses go to their
//! requests (the final flag, or the stub's end, ends them), calls, log
//! lines and metric updates are handled there too, and `executed` and the
//! answers to `finalize` go to the instance thread. Every [`CANCEL_POLL`]
//! it tells the stub of open requests whose clients have gone.
//!
//! Many requests share one stub, so a client that reads slowly must not
//! hold back the others: each open request's responses pass through a
//! task of its own on the runtime, which waits for that client alone. A
//! client more than [`MAX_BEHIND`] responses behind fails its request
//! (RESOURCE_EXHAUSTED, and the model sees it cancelled): that bounds what
//! a stalled client makes the server hold.
//!
//! [`ResponseSink::detach`]: nereid_core::backend::ResponseSink::detach

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nereid_core::error::{Error, ErrorKind, Result};
use nereid_core::scheduler::responder::{Outcome, Responder};
use parking_lot::Mutex;
use tokio::sync::mpsc::{UnboundedSender, unbounded_channel};

use crate::bls::{self, Caller};
use crate::channel::FrameReader;
use crate::instance::{CANCEL_POLL, Shared, produced, take};
use crate::metrics::StubMetrics;
use crate::protocol::{FINAL, FromStub, ToStub, WireError};
use crate::shm::{HostPool, StubPool};
use crate::stub::{self, Ending, Gone, Writer};

/// What the pump needs of its stub.
pub struct Parts {
    pub shared: Arc<Shared>,
    pub writer: Writer,
    pub host: Arc<Mutex<HostPool>>,
    pub stub_pool: Arc<Mutex<StubPool>>,
    pub metrics: StubMetrics,
    pub ending: Ending,
}

/// How many responses of one request may wait for its client beyond its
/// stream's own depth before the request fails.
pub const MAX_BEHIND: usize = 256;

/// A request the stub may still answer.
struct Open {
    /// To the task that passes its responses on; dropping it ends the
    /// request once they are passed.
    forward: UnboundedSender<Outcome>,
    /// Responses sent to the task and not yet taken by the client.
    behind: Arc<AtomicUsize>,
    /// Whether the stub has been told its client has gone.
    told: bool,
}

impl Open {
    /// Starts the task that passes `responder`'s responses on, on `runtime`.
    fn new(runtime: &tokio::runtime::Handle, responder: Responder) -> Open {
        let (forward, mut pending) = unbounded_channel::<Outcome>();
        let behind = Arc::new(AtomicUsize::new(0));
        let taken = Arc::clone(&behind);
        runtime.spawn(async move {
            loop {
                tokio::select! {
                    outcome = pending.recv() => {
                        let Some(outcome) = outcome else { break };
                        // An error is the request's last response.
                        let last = outcome.is_err();
                        let delivered = responder.send(outcome).await;
                        taken.fetch_sub(1, Ordering::Relaxed);
                        if !delivered || last {
                            break;
                        }
                    }
                    () = responder.closed() => break,
                }
            }
            // Dropping `pending` tells the pump the request has ended;
            // dropping `responder` ends its stream.
        });
        Open {
            forward,
            behind,
            told: false,
        }
    }

    /// Passes one response on; `false` when the request has ended (its
    /// client has gone, or it has had an error).
    fn send(&self, outcome: Outcome) -> bool {
        // Counted first: the task may take it at once.
        self.behind.fetch_add(1, Ordering::Relaxed);
        let sent = self.forward.send(outcome).is_ok();
        if !sent {
            self.behind.fetch_sub(1, Ordering::Relaxed);
        }
        sent
    }

    /// Whether the request has ended.
    fn is_closed(&self) -> bool {
        self.forward.is_closed()
    }

    /// Whether the client is too far behind to go on.
    fn too_far_behind(&self) -> bool {
        self.behind.load(Ordering::Relaxed) > MAX_BEHIND
    }
}

/// The open requests, by key.
type Table = Arc<Mutex<HashMap<u64, Open>>>;

/// What the pump passes to the instance thread.
enum Event {
    /// The running execute has returned.
    Executed,
    /// An answer to `finalize`.
    Finalized,
    /// The stub has gone; every open request has failed with why.
    Gone(Gone),
}

/// The running execute: its first key and how many requests it has.
type Running = Arc<Mutex<Option<(u64, u64)>>>;

/// Why the instance is stopping the stub, when it is: what the open
/// requests are told rather than how the stub was killed.
type Why = Arc<Mutex<Option<String>>>;

pub struct Pump {
    open: Table,
    running: Running,
    /// The key of the next request.
    next_key: AtomicU64,
    events: Receiver<Event>,
    /// When the stub last sent anything (the execute timeout counts
    /// silence).
    heard: Arc<Mutex<Instant>>,
    why: Why,
    thread: Option<JoinHandle<()>>,
}

impl Pump {
    /// Starts the thread that reads `reader` from now on.
    pub fn start(reader: FrameReader, parts: Parts) -> Result<Pump> {
        let open = Table::default();
        let running = Running::default();
        let heard = Arc::new(Mutex::new(Instant::now()));
        let why = Why::default();
        let (events, received) = mpsc::channel();
        let reading = Reading {
            reader,
            caller: Caller {
                runtime: parts.shared.runtime.clone(),
                members: parts.shared.members.clone(),
                writer: Arc::clone(&parts.writer),
                host: Arc::clone(&parts.host),
                model: parts.shared.model.clone(),
            },
            parts,
            open: Arc::clone(&open),
            running: Arc::clone(&running),
            heard: Arc::clone(&heard),
            why: Arc::clone(&why),
            events,
        };
        let thread = std::thread::Builder::new()
            .name("python-pump".into())
            .spawn(move || reading.run())
            .map_err(|e| Error::unavailable(format!("failed to start the stub's reader thread: {e}")))?;
        Ok(Pump {
            open,
            running,
            next_key: AtomicU64::new(0),
            events: received,
            heard,
            why,
            thread: Some(thread),
        })
    }

    /// The instance is about to stop the stub, for `why`.
    pub fn stopping(&self, why: String) {
        *self.why.lock() = Some(why);
    }

    /// Whether the thread has stopped (the stub has gone, or broke the
    /// protocol).
    pub fn stopped(&self) -> bool {
        self.thread.as_ref().is_none_or(JoinHandle::is_finished)
    }

    /// Files `responders` (one per request of the next execute, in
    /// order) under fresh keys; the first key.
    pub fn open(&self, responders: Vec<Option<Responder>>, runtime: &tokio::runtime::Handle) -> u64 {
        let count = responders.len() as u64;
        let first = self.next_key.fetch_add(count, Ordering::Relaxed);
        let mut open = self.open.lock();
        for (key, responder) in (first..).zip(responders) {
            if let Some(responder) = responder {
                open.insert(key, Open::new(runtime, responder));
            }
        }
        *self.running.lock() = Some((first, count));
        *self.heard.lock() = Instant::now();
        first
    }

    /// Waits for the running execute to return: `Err` when the stub goes,
    /// or stays silent for `timeout` (then the caller drops the stub, and
    /// its open requests fail).
    pub fn executed(&self, timeout: Duration) -> std::result::Result<(), Gone> {
        loop {
            match self.events.recv_timeout(CANCEL_POLL) {
                Ok(Event::Executed) => return Ok(()),
                Ok(Event::Gone(gone)) => return Err(gone),
                Ok(Event::Finalized) => return Err(Gone::Garbled("finalized during execute".into())),
                Err(RecvTimeoutError::Timeout) => {
                    let silent = self.heard.lock().elapsed();
                    if silent >= timeout {
                        return Err(Gone::Silent(silent));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(Gone::Exited("closed its socket (its reader has stopped)".into()));
                }
            }
        }
    }

    /// Fails the requests of an execute that never ran to `executed`
    /// (the stub went meanwhile) and are still open.
    pub fn abandon(&self, first: u64, count: u64, error: &Error) {
        fail(&self.open, first..first + count, error);
    }

    /// Waits until no request is open, or `until`.
    pub fn wait_for_open(&self, until: Instant) {
        while !self.open.lock().is_empty() && !self.stopped() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for the stub's answer to `finalize`, or `until`.
    pub fn finalized(&self, until: Instant) {
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            match self.events.recv_timeout(left) {
                Ok(Event::Finalized | Event::Gone(_)) | Err(_) => return,
                Ok(Event::Executed) => {}
            }
        }
    }
}

impl Drop for Pump {
    /// The stub is killed and its socket shut before this (see
    /// `Stub`'s drop), so the thread is ending. It fails what was open
    /// when it ended; a request filed after that fails here.
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        fail_all(
            &self.open,
            &Error::unavailable("the model instance stopped before the request ended"),
        );
    }
}

/// Ends every open request with `error`.
fn fail_all(open: &Table, error: &Error) {
    for (_, request) in open.lock().drain() {
        request.send(Err(error.clone()));
    }
}

/// Ends the open requests among `keys` with `error` (once their earlier
/// responses have reached their clients).
fn fail(open: &Table, keys: std::ops::Range<u64>, error: &Error) {
    let mut open = open.lock();
    for key in keys {
        if let Some(request) = open.remove(&key) {
            request.send(Err(error.clone()));
        }
    }
}

/// The pump's thread.
struct Reading {
    reader: FrameReader,
    parts: Parts,
    caller: Caller,
    open: Table,
    running: Running,
    heard: Arc<Mutex<Instant>>,
    why: Why,
    events: Sender<Event>,
}

impl Reading {
    fn run(mut self) {
        let mut looked = Instant::now();
        let gone = loop {
            match stub::read_frame(&mut self.reader, CANCEL_POLL, Instant::now(), &self.parts.ending) {
                Ok(message) => {
                    *self.heard.lock() = Instant::now();
                    if let Err(gone) = self.handle(message) {
                        break gone;
                    }
                }
                Err(Gone::Silent(_)) => {}
                Err(gone) => break gone,
            }
            if looked.elapsed() >= CANCEL_POLL {
                if let Err(gone) = self.tell_cancelled() {
                    break gone;
                }
                looked = Instant::now();
            }
        };
        let shared = &self.parts.shared;
        let why = self.why.lock().take().unwrap_or_else(|| gone.describe());
        let error = Error::unavailable(format!("model '{}': {why}; the instance is restarting", shared.model));
        fail_all(&self.open, &error);
        let _ = self.events.send(Event::Gone(gone));
    }

    fn handle(&mut self, message: FromStub) -> std::result::Result<(), Gone> {
        let shared = Arc::clone(&self.parts.shared);
        match message {
            FromStub::Segment { seg } => {
                let fd = self
                    .reader
                    .take_fd()
                    .ok_or_else(|| Gone::Garbled(format!("segment {seg} came without its descriptor")))?;
                self.parts.stub_pool.lock().add(seg, fd).map_err(Gone::Garbled)?;
            }
            FromStub::Response {
                request,
                response,
                flags,
            } => self.respond(request, response, flags)?,
            FromStub::Executed { error, .. } => {
                let running = self.running.lock().take();
                if let (Some(error), Some((first, count))) = (error, running) {
                    self.fail_running(first, count, &error);
                }
                let _ = self.events.send(Event::Executed);
            }
            FromStub::Finalized => {
                let _ = self.events.send(Event::Finalized);
            }
            FromStub::Bls(call) => {
                let inputs: Result<Vec<_>> = call.inputs.iter().map(|d| take(&self.parts.stub_pool, d)).collect();
                match inputs {
                    Ok(inputs) => bls::start(&self.caller, call, inputs),
                    Err(e) => bls::refuse(&self.caller, call.call, &e),
                }
            }
            FromStub::Log {
                level,
                message,
                file,
                line,
            } => crate::log::emit(&shared.model, &level, &message, file.as_deref(), line),
            message @ (FromStub::MetricFamily { .. } | FromStub::Metric { .. } | FromStub::MetricUpdate { .. }) => {
                self.parts.metrics.apply(&shared.metrics, &shared.model, &message);
            }
            other => return Err(Gone::Garbled(format!("{other:?} while serving"))),
        }
        Ok(())
    }

    /// One response of the request `key`: sent, and the request ended by
    /// the final flag or an error.
    fn respond(
        &mut self,
        key: u64,
        response: Option<crate::protocol::WireResponse>,
        flags: u32,
    ) -> std::result::Result<(), Gone> {
        let mut table = self.open.lock();
        let Some(open) = table.get_mut(&key) else {
            tracing::warn!(model = %self.parts.shared.model, request = key, "a response after the final flag is dropped");
            return Ok(());
        };
        let last = flags & FINAL != 0;
        let mut ended = false;
        if let Some(response) = response {
            let outcome = produced(&self.parts.shared, &self.parts.stub_pool, response);
            let error = outcome.is_err();
            if !open.send(outcome) || error {
                // Its client has gone, or it has had its last response
                // (an error): what the model still sends is dropped.
                ended = true;
            } else if open.too_far_behind() {
                open.send(Err(Error::new(
                    ErrorKind::ResourceExhausted,
                    format!(
                        "model '{}': the client fell more than {MAX_BEHIND} responses behind the stream; the request is \
                         cancelled",
                        self.parts.shared.model
                    ),
                )));
                ended = true;
            }
        }
        // The model learns of it once, unless it has ended the request itself.
        let cancel = ended && !last && !std::mem::replace(&mut open.told, true);
        if last {
            table.remove(&key);
        }
        drop(table);
        match cancel {
            true => self.cancel(key),
            false => Ok(()),
        }
    }

    /// Tells the stub that request `key` has lost its client.
    fn cancel(&self, key: u64) -> std::result::Result<(), Gone> {
        stub::send(&self.parts.writer, &ToStub::Cancelled { request: key })
            .map_err(|e| Gone::Exited(format!("could not be written to ({e})")))
    }

    /// Fails the running execute's requests still open with the error its
    /// `execute` raised.
    fn fail_running(&self, first: u64, count: u64, error: &WireError) {
        fail(&self.open, first..first + count, &error.to_error());
    }

    /// Tells the stub, once each, of the open requests whose clients have gone.
    fn tell_cancelled(&self) -> std::result::Result<(), Gone> {
        let gone: Vec<u64> = self
            .open
            .lock()
            .iter_mut()
            .filter(|(_, open)| !open.told && open.is_closed())
            .map(|(key, open)| {
                open.told = true;
                *key
            })
            .collect();
        gone.into_iter().try_for_each(|key| self.cancel(key))
    }
}
