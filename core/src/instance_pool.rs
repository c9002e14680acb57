//! The instances of one model version: one dedicated OS thread each.
//!
//! Each thread owns its backend instance (an ONNX Runtime session's `run`
//! is blocking and CPU-heavy, so it never runs on the async runtime) and
//! takes jobs from a queue: one shared by all instances, so whichever is
//! free takes the next job, or, for the sequence batcher, one per instance,
//! so a sequence stays where its state is. A job is a batch of one or more
//! requests: the thread executes it once and the instance sends each
//! request its responses through a sink ([`ResponseSink`]): one each for an
//! ordinary model, any number for a decoupled one, the same code for both.
//! With a dynamic batcher in front, each thread says when it is idle again,
//! so batches are formed only when an instance can take them, and hands the
//! finished job's answers back with that word ([`Finished`]) for the
//! batcher to send from the async runtime.
//!
//! A backend whose execution is a copy ([`Backend::runs_inline`]: identity)
//! gets no threads: without a batcher in front, its instances run each job
//! on the thread that submits it, so a request does not cross to an
//! instance thread and back (two wake-ups that cost far more than the copy).

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::{Arc, Weak};
use std::time::Instant;

use std::sync::atomic::{AtomicUsize, Ordering};

use crossbeam_channel::{Receiver, Sender, TrySendError};
use nereid_proto::inference::ModelConfig;
use parking_lot::Mutex;
use tokio::sync::mpsc::UnboundedSender;

use crate::backend::{self, Backend, Batch, Device, InstanceSpec, ModelInstance, RequestInfo, ResponseSink};
use crate::error::{Error, Result};
use crate::model_repository_manager::Members;
use crate::response::Produced;
use crate::scheduler::{Outcome, Request, Responder};
use crate::statistics::{ComputeTiming, ModelStatistics};
use crate::tensor::Tensor;
use crate::trace::{self, RequestTrace};
use crate::warmup;

/// How many jobs may wait per instance in front of the default scheduler.
const QUEUE_PER_INSTANCE: usize = 256;

/// Requests that execute together.
#[derive(Debug)]
pub struct Job {
    pub requests: Vec<Request>,
}

impl Job {
    pub fn single(request: Request) -> Self {
        Job {
            requests: vec![request],
        }
    }
}

/// Where and how one instance runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub device: Device,
    pub intra_op_threads: usize,
}

/// What the instances of one model version are made from.
pub struct InstanceSource {
    pub model: String,
    pub version: i64,
    pub backend: &'static dyn Backend,
    pub config: Arc<ModelConfig>,
    pub version_dir: PathBuf,
    pub statistics: Arc<ModelStatistics>,
    /// The server's models, for instances that call others.
    pub members: Members,
    /// Told once per finished job, with its answers, when a dynamic batcher
    /// feeds the pool.
    pub idle: Option<UnboundedSender<Finished>>,
}

impl InstanceSource {
    /// Whether the model is decoupled: its responses stream out as the
    /// instance sends them.
    fn decoupled(&self) -> bool {
        self.config
            .model_transaction_policy
            .as_ref()
            .is_some_and(|p| p.decoupled)
    }
}

/// A finished job's answers, each with the responder it goes to.
///
/// Sending a request's answer wakes its task. From an instance thread, each
/// wake pushes the task onto the runtime's shared queue under the runtime's
/// lock, which its worker threads take too, and may wake one of them; a
/// batch of 30 did that 30 times, and the instance thread blocked on that
/// lock about once per batch. Sent from a task on the runtime instead (the
/// dynamic batcher's, which the instance wakes once anyway to say it is
/// idle), the wakes go to that worker's own queue.
#[derive(Debug, Default)]
pub struct Finished {
    answers: Vec<(Responder, Outcome)>,
}

impl Finished {
    /// Sends every answer.
    pub fn send(self) {
        for (responder, outcome) in self.answers {
            responder.answer(outcome);
        }
    }
}

pub struct InstancePool {
    /// One queue all instances take from, or one per instance.
    queues: Vec<Sender<Job>>,
    /// The instances themselves, for a backend that runs inline.
    inline: Option<Inline>,
    /// Held strongly by every instance thread (and inline instances) until
    /// its instance is dropped: gone once they all are ([`Self::instances`]).
    source: Weak<InstanceSource>,
    /// The threads that take jobs: one per instance, more for an instance
    /// with more lanes ([`ModelInstance::lane`]).
    threads: usize,
}

/// Whether an instance thread may start more for its instance's other
/// lanes ([`ModelInstance::lane`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lanes {
    Allowed,
    One,
}

/// The most threads one instance runs on, and their names' suffixes.
const MAX_LANES: usize = 4;
const LANE_NAMES: [&str; MAX_LANES] = ["", "b", "c", "d"];

/// Instances that run jobs on the submitting thread.
pub struct Inline {
    source: Arc<InstanceSource>,
    instances: Vec<Mutex<Box<dyn ModelInstance>>>,
    /// Where the search for a free instance starts, turn by turn.
    next: AtomicUsize,
}

impl Inline {
    fn start(source: InstanceSource, placements: &[Placement], warmup: &[warmup::Sample]) -> Result<Inline> {
        let mut instances = Vec::with_capacity(placements.len());
        for (index, placement) in placements.iter().enumerate() {
            let mut instance = create(&source, *placement)?;
            warm_up(&source, index, instance.as_mut(), warmup)?;
            instances.push(Mutex::new(instance));
        }
        Ok(Inline {
            source: Arc::new(source),
            instances,
            next: AtomicUsize::new(0),
        })
    }

    /// A free instance, or the next one to be free: they are busy for
    /// microseconds.
    fn instance(&self) -> parking_lot::MutexGuard<'_, Box<dyn ModelInstance>> {
        let count = self.instances.len();
        let first = self.next.fetch_add(1, Ordering::Relaxed) % count;
        (0..count)
            .find_map(|i| self.instances[(first + i) % count].try_lock())
            .unwrap_or_else(|| self.instances[first].lock())
    }

    /// Runs `job` on a free instance.
    fn run(&self, job: Job) {
        let mut instance = self.instance();
        // As on an instance thread: a panic around the batch fails only it
        // (its requests' responders drop: "stopped before answering").
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| run(&self.source, instance.as_mut(), job).send()));
        if ran.is_err() {
            tracing::error!(model = %self.source.model, version = self.source.version, "a job panicked outside its batch; the instance goes on");
        }
    }

    /// Runs one request now and returns its outputs: it never waits in a
    /// queue, so it needs no [`Request`], no payload to cancel and no
    /// channel, only the statistics a queued request would have (a queue
    /// time of zero: it starts when it `arrived`).
    pub fn run_now(
        &self,
        inputs: Vec<Tensor>,
        batch_size: usize,
        trace: Option<Arc<RequestTrace>>,
        arrived: Instant,
    ) -> Result<Produced> {
        let mut instance = self.instance();
        self.source.statistics.record_queue(std::time::Duration::ZERO);
        let traces = match trace {
            Some(trace) => {
                trace.child("queue", arrived, arrived);
                vec![trace]
            }
            None => Vec::new(),
        };
        let mut outputs = None;
        execute(
            &self.source,
            instance.as_mut(),
            arrived,
            Shape {
                rows: batch_size,
                requests: 1,
            },
            &traces,
            |instance| {
                let (produced, timing) = backend::execute_one(instance, inputs, batch_size)?;
                outputs = Some(produced);
                Ok(timing)
            },
        )?;
        outputs.ok_or_else(|| Error::internal("the model instance sent no response"))
    }
}

impl InstancePool {
    /// Starts one thread per placement, all taking jobs from one queue,
    /// and waits until each has created its instance and run the `warmup`
    /// samples on it ([`warmup`]; their data is dropped once all have). If
    /// any fails, all stop and the first reason is returned. Blocking: call
    /// it from a blocking context.
    pub fn start(
        source: InstanceSource,
        placements: &[Placement],
        warmup: Vec<warmup::Sample>,
    ) -> Result<InstancePool> {
        if source.idle.is_none() && !source.decoupled() && source.backend.runs_inline(&source.config) {
            let inline = Inline::start(source, placements, &warmup)?;
            return Ok(InstancePool {
                queues: Vec::new(),
                source: Arc::downgrade(&inline.source),
                threads: 0,
                inline: Some(inline),
            });
        }
        // A batcher only sends when an instance is idle, so its queue never
        // holds more than one job per instance; the default scheduler's is bounded.
        let queue = if source.idle.is_some() {
            crossbeam_channel::unbounded::<Job>()
        } else {
            crossbeam_channel::bounded::<Job>(QUEUE_PER_INSTANCE * placements.len().max(1))
        };
        let receivers = vec![queue.1; placements.len()];
        Self::start_with(source, placements, warmup, vec![queue.0], receivers, Lanes::Allowed)
    }

    /// Like [`Self::start`], but each instance has its own queue
    /// ([`Self::submit_to`]): for the sequence batcher, which must send a
    /// sequence's requests to the instance that holds it. Whoever submits
    /// sends one job per instance at a time, so the queues are unbounded.
    pub fn start_per_instance(
        source: InstanceSource,
        placements: &[Placement],
        warmup: Vec<warmup::Sample>,
    ) -> Result<InstancePool> {
        let (senders, receivers) = placements.iter().map(|_| crossbeam_channel::unbounded::<Job>()).unzip();
        // The sequence batcher sends an instance one job at a time (a
        // sequence's next request needs the state its last one left): a
        // second lane would never have a job to take ahead.
        Self::start_with(source, placements, warmup, senders, receivers, Lanes::One)
    }

    fn start_with(
        source: InstanceSource,
        placements: &[Placement],
        warmup: Vec<warmup::Sample>,
        queues: Vec<Sender<Job>>,
        receivers: Vec<Receiver<Job>>,
        lanes: Lanes,
    ) -> Result<InstancePool> {
        let source = Arc::new(source);
        // Shared by the threads while they warm up; the last to finish frees it.
        let warmup = Arc::new(warmup);
        // Each instance says how many threads it runs on.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<usize>>();
        for ((index, placement), receiver) in placements.iter().copied().enumerate().zip(receivers) {
            let source = Arc::clone(&source);
            let ready = ready_tx.clone();
            let warmup = Arc::clone(&warmup);
            std::thread::Builder::new()
                .name(format!("{}-{}-{index}", source.model, source.version))
                .spawn(move || worker(source, index, placement, warmup, receiver, &ready, lanes))
                .map_err(|e| Error::internal(format!("failed to start an instance thread: {e}")))?;
        }
        drop(ready_tx);
        drop(warmup);
        let mut pool = InstancePool {
            queues,
            inline: None,
            source: Arc::downgrade(&source),
            threads: 0,
        };
        for _ in placements {
            match ready_rx.recv() {
                Ok(Ok(threads)) => pool.threads += threads,
                // Dropping the pool closes the queue, which stops the
                // instances that did start.
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::internal("an instance thread exited while loading")),
            }
        }
        Ok(pool)
    }

    /// The instances, when they run on the submitting thread
    /// ([`Backend::runs_inline`]): a request can then be run now
    /// ([`Inline::run_now`]) instead of queued.
    pub fn inline(&self) -> Option<&Inline> {
        self.inline.as_ref()
    }

    /// Queues a job, refusing at once when the queue is full; an inline
    /// pool runs it before returning.
    pub fn try_submit(&self, job: Job) -> Result<()> {
        if let Some(inline) = &self.inline {
            inline.run(job);
            return Ok(());
        }
        self.submit_to(0, job)
    }

    /// Queues a job for instance `lane` (of a pool with a queue per
    /// instance), refusing at once when its queue is full.
    pub fn submit_to(&self, lane: usize, job: Job) -> Result<()> {
        let queue = self
            .queues
            .get(lane)
            .ok_or_else(|| Error::internal(format!("no instance queue {lane}")))?;
        match queue.try_send(job) {
            Ok(()) => Ok(()),
            Err(TrySendError::Full(_)) => Err(Error::unavailable("Exceeds maximum queue size")),
            Err(TrySendError::Disconnected(_)) => Err(Error::unavailable("model instances have stopped")),
        }
    }

    /// How many queues: one, or one per instance.
    pub fn lanes(&self) -> usize {
        self.queues.len()
    }

    /// How many threads take jobs from the queues: as many batches as a
    /// batcher may have out at once.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// What tells when every instance of the pool has been dropped: after
    /// the pool is, once each thread finished its job and its instance
    /// (a Python model's `finalize`, its stub's exit) and let go of it.
    pub fn instances(&self) -> Weak<InstanceSource> {
        self.source.clone()
    }
}

#[cfg(test)]
impl InstancePool {
    /// A pool of `lanes` queues and no instances: the test takes the jobs
    /// and answers them itself, at the moment it chooses.
    pub fn without_instances(lanes: usize) -> (InstancePool, Vec<Receiver<Job>>) {
        let (queues, receivers) = (0..lanes).map(|_| crossbeam_channel::unbounded::<Job>()).unzip();
        (
            InstancePool {
                queues,
                inline: None,
                source: Weak::new(),
                threads: lanes,
            },
            receivers,
        )
    }
}

/// Instance threads alive in this process. Their instances are dropped on
/// the thread, once the queue closes, some time after their model was
/// unloaded; shutdown waits for them ([`wait_for_instances`]) so that the
/// process does not exit under an instance still finalizing (a Python
/// model's `finalize`, its stub's exit and the removal of its shared
/// memory).
static LIVE_INSTANCES: Mutex<usize> = Mutex::new(0);
static INSTANCE_ENDED: parking_lot::Condvar = parking_lot::Condvar::new();

/// Counts one instance thread while it lives.
struct Alive;

impl Alive {
    fn enter() -> Alive {
        *LIVE_INSTANCES.lock() += 1;
        Alive
    }
}

impl Drop for Alive {
    fn drop(&mut self) {
        *LIVE_INSTANCES.lock() -= 1;
        INSTANCE_ENDED.notify_all();
    }
}

/// Waits until every instance thread has ended (their models unloaded),
/// at most `timeout`; `false` when some were still running.
pub fn wait_for_instances(timeout: std::time::Duration) -> bool {
    let until = Instant::now() + timeout;
    let mut live = LIVE_INSTANCES.lock();
    while *live > 0 {
        if INSTANCE_ENDED.wait_until(&mut live, until).timed_out() {
            return *live == 0;
        }
    }
    true
}

/// The life of one instance thread: create the instance, report, run jobs
/// until the queue closes. An instance with more lanes gets a thread for
/// each on the same queue, started here once the instance is ready.
fn worker(
    source: Arc<InstanceSource>,
    index: usize,
    placement: Placement,
    warmup: Arc<Vec<warmup::Sample>>,
    jobs: Receiver<Job>,
    ready: &std::sync::mpsc::Sender<Result<usize>>,
    lanes: Lanes,
) {
    // Declared first, dropped last: after the instance.
    let _alive = Alive::enter();
    let mut instance = match create(&source, placement) {
        Ok(instance) => instance,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let warmed = warm_up(&source, index, instance.as_mut(), &warmup);
    // Its data is not held while the instance serves.
    drop(warmup);
    if let Err(e) = warmed {
        let _ = ready.send(Err(e));
        return;
    }
    let mut threads = 1;
    while lanes == Lanes::Allowed && threads < MAX_LANES {
        let Some(lane) = instance.lane() else { break };
        let (theirs, jobs) = (Arc::clone(&source), jobs.clone());
        let started = std::thread::Builder::new()
            .name(format!(
                "{}-{}-{index}{}",
                source.model, source.version, LANE_NAMES[threads]
            ))
            .spawn(move || {
                let _alive = Alive::enter();
                // Moved in here, so that they go before `_alive` does.
                let (source, lane, jobs) = (theirs, lane, jobs);
                serve(&source, lane, &jobs);
            });
        match started {
            Ok(_) => threads += 1,
            // The instance serves on the threads it has.
            Err(e) => {
                tracing::warn!(model = %source.model, version = source.version, "no more threads for instance {index}: {e}");
                break;
            }
        }
    }
    let _ = ready.send(Ok(threads));
    serve(&source, instance, &jobs);
}

/// Runs jobs on `instance` until the queue closes.
fn serve(source: &InstanceSource, mut instance: Box<dyn ModelInstance>, jobs: &Receiver<Job>) {
    for job in jobs.iter() {
        // `run` already contains a panic in the batch it runs; this second
        // guard keeps the thread (and every request queued behind it) alive
        // even if bookkeeping around the batch ever panics. Requests whose
        // responders are lost that way get "stopped before answering".
        let ran = std::panic::catch_unwind(AssertUnwindSafe(|| run(source, instance.as_mut(), job)));
        let finished = ran.unwrap_or_else(|_| {
            tracing::error!(model = %source.model, version = source.version, "a job panicked outside its batch; the instance goes on");
            Finished::default()
        });
        match &source.idle {
            // A batcher that has stopped (its model unloading) cannot send
            // them: this thread does.
            Some(idle) => {
                if let Err(unsent) = idle.send(finished) {
                    unsent.0.send();
                }
            }
            None => finished.send(),
        }
    }
}

/// Creates one instance, a panic in the backend being an error.
fn create(source: &InstanceSource, placement: Placement) -> Result<Box<dyn ModelInstance>> {
    let spec = InstanceSpec {
        config: &source.config,
        version_dir: &source.version_dir,
        device: placement.device,
        intra_op_threads: placement.intra_op_threads,
        members: &source.members,
    };
    std::panic::catch_unwind(AssertUnwindSafe(|| source.backend.create_instance(spec)))
        .unwrap_or_else(|_| Err(Error::internal("the backend panicked while creating an instance")))
}

/// Runs the config's warmup samples on a new instance ([`warmup`]).
fn warm_up(
    source: &InstanceSource,
    index: usize,
    instance: &mut dyn ModelInstance,
    samples: &[warmup::Sample],
) -> Result<()> {
    if samples.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    warmup::run(samples, instance, source.backend, &source.config)?;
    tracing::info!(
        model = %source.model,
        version = source.version,
        instance = index,
        samples = samples.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "instance warmed up"
    );
    Ok(())
}

/// A queued request as an instance takes it up.
struct Admitted {
    inputs: Vec<Tensor>,
    info: RequestInfo,
    batch_size: usize,
    responder: Responder,
    trace: Option<Arc<RequestTrace>>,
}

/// Takes `request` out of the queue (its pending count drops either way)
/// and records its queue time, or `None` when its caller went away: its
/// inputs are already gone from its payload, and it gets no compute.
fn admit(source: &InstanceSource, started: Instant, request: Request) -> Option<Admitted> {
    let inputs = request.payload.take()?;
    if request.responder.is_closed() {
        return None;
    }
    let Request {
        id,
        parameters,
        requested,
        sequence,
        batch_size,
        responder,
        trace,
        span,
        queued,
        enqueued_at,
        ..
    } = request;
    drop(queued);
    let waited = tokio::time::Instant::now().saturating_duration_since(enqueued_at);
    source.statistics.record_queue(waited);
    if let Some(trace) = &trace {
        trace.child("queue", started.checked_sub(waited).unwrap_or(started), started);
    }
    // The instance thread's line about the request, inside its span (its
    // model, version and id).
    tracing::debug!(parent: &span, queued_us = waited.as_micros() as u64, "taken up by an instance");
    Some(Admitted {
        inputs,
        info: RequestInfo {
            id,
            parameters,
            requested,
            sequence,
        },
        batch_size,
        responder,
        trace,
    })
}

/// Runs a job: each request's responses go out through the sink as the
/// instance sends them, or, for an ordinary model's one answer, come back
/// in the [`Finished`] for the caller to send.
fn run(source: &InstanceSource, instance: &mut dyn ModelInstance, job: Job) -> Finished {
    let started = Instant::now();
    let mut responders = Vec::with_capacity(job.requests.len());
    let mut batch = Batch::default();
    let mut traces: Vec<Arc<RequestTrace>> = Vec::new();
    for request in job.requests {
        let Some(admitted) = admit(source, started, request) else {
            continue;
        };
        traces.extend(admitted.trace);
        batch.sizes.push(admitted.batch_size);
        batch.requests.push(admitted.inputs);
        batch.info.push(admitted.info);
        responders.push(Some(admitted.responder));
    }
    if responders.is_empty() {
        return Finished::default();
    }
    let shape = Shape {
        rows: batch.rows(),
        requests: batch.sizes.len(),
    };
    let mut sink = Sinks {
        responders,
        streaming: source.decoupled(),
        answers: Vec::new(),
    };
    let outcome = execute(source, instance, started, shape, &traces, |instance| {
        instance.execute(batch, &mut sink)
    });
    sink.end(outcome.err())
}

/// How big a batch is, for its statistics and traces.
#[derive(Debug, Clone, Copy)]
struct Shape {
    rows: usize,
    requests: usize,
}

/// Executes one batch of `shape` with `run`, records it,
/// and returns how long it took. Nothing in here may take the thread
/// down: a panic anywhere (backend, batch assembly, statistics, splitting)
/// fails this batch and only it.
fn execute(
    source: &InstanceSource,
    instance: &mut dyn ModelInstance,
    started: Instant,
    shape: Shape,
    traces: &[Arc<RequestTrace>],
    run: impl FnOnce(&mut dyn ModelInstance) -> Result<ComputeTiming>,
) -> Result<()> {
    let _executing = source.statistics.executing(shape.requests);
    std::panic::catch_unwind(AssertUnwindSafe(|| {
        let timing = run(instance)?;
        let total = shape.rows;
        source
            .statistics
            .record_execution(total as u64, shape.requests as u64, timing);
        if !traces.is_empty() {
            for trace in traces {
                trace.compute(started, timing);
            }
            let traced: Vec<&Arc<RequestTrace>> = traces.iter().collect();
            let ended = started + timing.input + timing.infer + timing.output;
            trace::request::batch(&traced, started, ended, total);
        }
        Ok(())
    }))
    .unwrap_or_else(|panic| {
        let what = panic_message(panic.as_ref());
        tracing::error!(model = %source.model, version = source.version, panic = %what, "a batch panicked; its requests fail, the instance goes on");
        Err(Error::internal(format!("the model instance panicked while executing: {what}")))
    })
}

/// The responders of one execution, by request position.
struct Sinks {
    /// `None` once a request has ended (answered, or its client gone).
    responders: Vec<Option<Responder>>,
    /// A decoupled model: responses go out from this thread as they come,
    /// waiting while a client reads slower than the model answers.
    streaming: bool,
    /// An ordinary model's answers, sent after the execution.
    answers: Vec<(Responder, Outcome)>,
}

impl Sinks {
    /// Ends every request the execution left open: with its `error`, or,
    /// after a decoupled execution, with the final flag. An ordinary
    /// request must have had its answer.
    fn end(mut self, error: Option<Error>) -> Finished {
        for responder in self.responders.into_iter().flatten() {
            match (&error, self.streaming) {
                (Some(e), true) => {
                    responder.blocking_send(Err(e.clone()));
                }
                (Some(e), false) => self.answers.push((responder, Err(e.clone()))),
                // Dropped: the stream's end.
                (None, true) => {}
                (None, false) => {
                    let missing = Error::internal("the model instance sent no response");
                    self.answers.push((responder, Err(missing)));
                }
            }
        }
        Finished { answers: self.answers }
    }
}

impl ResponseSink for Sinks {
    fn send(&mut self, request: usize, response: Produced) -> bool {
        let Some(slot) = self.responders.get_mut(request) else {
            return false;
        };
        if !self.streaming {
            // An ordinary model's one answer ends its request.
            return match slot.take() {
                Some(responder) => {
                    self.answers.push((responder, Ok(response)));
                    true
                }
                None => false,
            };
        }
        match slot {
            Some(responder) if responder.blocking_send(Ok(response)) => true,
            _ => {
                *slot = None;
                false
            }
        }
    }

    fn fail(&mut self, request: usize, error: Error) -> bool {
        let Some(responder) = self.responders.get_mut(request).and_then(Option::take) else {
            return false;
        };
        match self.streaming {
            true => responder.blocking_send(Err(error)),
            false => {
                self.answers.push((responder, Err(error)));
                true
            }
        }
    }

    fn is_cancelled(&self, request: usize) -> bool {
        self.responders
            .get(request)
            .and_then(Option::as_ref)
            .is_none_or(Responder::is_closed)
    }

    fn detach(&mut self, request: usize) -> Option<Responder> {
        match self.streaming {
            true => self.responders.get_mut(request).and_then(Option::take),
            false => None,
        }
    }
}

/// The text of a panic payload, when it has one.
fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a non-text panic".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BackendKind;
    use crate::backend::for_kind;
    use crate::datatype::DataType;
    use crate::model_config::text::parse;
    use crate::scheduler::Responses;
    use crate::scheduler::responder::single;
    use bytes::Bytes;

    fn pending(value: f32) -> (Request, Responses) {
        let data = Bytes::copy_from_slice(&value.to_le_bytes());
        Request::for_test(vec![Tensor::new("INPUT0", DataType::Fp32, vec![1, 1], data)], 1)
    }

    /// A pool of one identity instance, with `parameters` added to its config.
    fn identity_pool(parameters: &str) -> (InstancePool, Arc<ModelStatistics>) {
        let config = parse(&format!(
            r#"name: "id" backend: "identity" max_batch_size: 4
               input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
               output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
               {parameters}"#
        ))
        .unwrap();
        let statistics = Arc::new(ModelStatistics::default());
        let source = InstanceSource {
            model: "id".into(),
            version: 1,
            backend: for_kind(BackendKind::Identity),
            config: Arc::new(config),
            version_dir: PathBuf::from("."),
            statistics: Arc::clone(&statistics),
            members: Members::default(),
            idle: None,
        };
        let placement = Placement {
            device: Device::Cpu,
            intra_op_threads: 1,
        };
        (
            InstancePool::start(source, &[placement], Vec::new()).unwrap(),
            statistics,
        )
    }

    #[tokio::test]
    async fn skips_requests_whose_client_left_and_answers_the_rest() {
        // On an instance thread, and inline.
        for parameters in [
            r#"parameters { key: "execute_delay_ms" value: { string_value: "1" } }"#,
            "",
        ] {
            let (pool, statistics) = identity_pool(parameters);
            let (gone, receiver) = pending(1.0);
            drop(receiver);
            pool.try_submit(Job::single(gone)).unwrap();
            let (a, a_rx) = pending(2.0);
            let (b, b_rx) = pending(3.0);
            pool.try_submit(Job { requests: vec![a, b] }).unwrap();
            let (mut a_rx, mut b_rx) = (a_rx, b_rx);
            let a_out = single(&mut a_rx).await.unwrap().outputs;
            let b_out = single(&mut b_rx).await.unwrap().outputs;
            assert_eq!(a_out[0].data.as_ref(), &2.0f32.to_le_bytes());
            assert_eq!(b_out[0].data.as_ref(), &3.0f32.to_le_bytes());
            assert_eq!(b_out[0].shape, vec![1, 1]);
            let stats = statistics.snapshot();
            // The abandoned request cost no execution; the pair ran as one batch of 2.
            assert_eq!((stats.execution_count, stats.inference_count), (1, 2), "{parameters}");
        }
    }

    #[tokio::test]
    async fn a_copy_runs_on_the_submitting_thread_and_a_sleep_on_its_own() {
        let (pool, statistics) = identity_pool("");
        assert!(pool.inline.is_some() && pool.queues.is_empty());
        let (request, mut reply) = pending(4.0);
        pool.try_submit(Job::single(request)).unwrap();
        // Answered before try_submit returned.
        let outputs = reply.try_recv().expect("answered inline").unwrap().outputs;
        assert_eq!(outputs[0].data.as_ref(), &4.0f32.to_le_bytes());
        assert_eq!(statistics.snapshot().execution_count, 1);

        let (pool, _) = identity_pool(r#"parameters { key: "execute_delay_ms" value: { string_value: "5" } }"#);
        assert!(pool.inline.is_none() && pool.queues.len() == 1);
        assert!(pool.inline().is_none());
    }

    #[test]
    fn a_request_run_now_counts_as_queued_and_executed() {
        let (pool, statistics) = identity_pool("");
        let inline = pool.inline().expect("identity runs inline");
        let data = Bytes::copy_from_slice(&5.0f32.to_le_bytes());
        let inputs = vec![Tensor::new("INPUT0", DataType::Fp32, vec![1, 1], data)];
        let outputs = inline.run_now(inputs, 1, None, Instant::now()).unwrap().outputs;
        assert_eq!(outputs[0].name, "OUTPUT0");
        assert_eq!(outputs[0].data.as_ref(), &5.0f32.to_le_bytes());
        let stats = statistics.snapshot();
        assert_eq!((stats.execution_count, stats.inference_count), (1, 1));
        assert_eq!(stats.inference_stats.queue.count, 1);
    }

    /// An instance that always offers another lane: each execute says which
    /// thread ran it, then waits until the test lets it finish.
    struct Gated {
        entered: crossbeam_channel::Sender<String>,
        release: crossbeam_channel::Receiver<()>,
    }

    struct GatedBackend(Arc<Gated>);

    struct GatedInstance(Arc<Gated>);

    impl Backend for GatedBackend {
        fn signature(
            &self,
            _: &ModelConfig,
            _: &std::path::Path,
        ) -> Result<Option<crate::model_config::autocomplete::ModelSignature>> {
            Ok(None)
        }

        fn create_instance(&self, _: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
            Ok(Box::new(GatedInstance(Arc::clone(&self.0))))
        }
    }

    impl ModelInstance for GatedInstance {
        fn execute(&mut self, batch: Batch, sink: &mut dyn ResponseSink) -> Result<ComputeTiming> {
            let name = std::thread::current().name().unwrap_or_default().to_string();
            self.0.entered.send(name).unwrap();
            self.0.release.recv().unwrap();
            for request in 0..batch.requests.len() {
                sink.send(request, Produced::from(Vec::new()));
            }
            Ok(ComputeTiming::default())
        }

        fn lane(&mut self) -> Option<Box<dyn ModelInstance>> {
            Some(Box::new(GatedInstance(Arc::clone(&self.0))))
        }
    }

    #[tokio::test]
    async fn another_lane_takes_the_next_job_while_the_first_runs() {
        let (entered_tx, entered) = crossbeam_channel::unbounded();
        let (release, release_rx) = crossbeam_channel::unbounded();
        let gated = Arc::new(Gated {
            entered: entered_tx,
            release: release_rx,
        });
        let backend: &'static GatedBackend = Box::leak(Box::new(GatedBackend(gated)));
        let config = parse(
            r#"name: "gated" backend: "python" max_batch_size: 0
               input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
               output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]"#,
        )
        .unwrap();
        let source = InstanceSource {
            model: "gated".into(),
            version: 1,
            backend,
            config: Arc::new(config),
            version_dir: PathBuf::from("."),
            statistics: Arc::new(ModelStatistics::default()),
            members: Members::default(),
            idle: None,
        };
        let placement = Placement {
            device: Device::Cpu,
            intra_op_threads: 1,
        };
        let pool = InstancePool::start(source, &[placement], Vec::new()).unwrap();
        // It offers lanes without end: the pool stops at its bound.
        assert_eq!(pool.threads(), MAX_LANES);
        let (first, mut first_rx) = pending(1.0);
        let (second, mut second_rx) = pending(2.0);
        pool.try_submit(Job::single(first)).unwrap();
        let running = entered.recv().unwrap();
        // The first job holds its thread; the second is taken by the other.
        pool.try_submit(Job::single(second)).unwrap();
        let ahead = entered.recv().unwrap();
        assert_ne!(running, ahead);
        for name in [&running, &ahead] {
            assert!(
                LANE_NAMES.iter().any(|lane| *name == format!("gated-1-0{lane}")),
                "{name}"
            );
        }
        release.send(()).unwrap();
        release.send(()).unwrap();
        single(&mut first_rx).await.unwrap();
        single(&mut second_rx).await.unwrap();
    }
}
