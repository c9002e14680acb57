//! Scheduling: how requests reach a model's instances.
//!
//! As in Triton: the default scheduler hands each request to the next free
//! instance; the dynamic batcher ([`crate::dynamic_batch_scheduler`])
//! queues requests and forms batches; the sequence batcher
//! ([`crate::sequence_batcher`]) keeps each sequence on one instance and
//! carries its state; all feed an
//! [`InstancePool`](crate::instance_pool::InstancePool). An ensemble
//! ([`crate::ensemble_scheduler`]) has no instances: it sends each step to
//! its member model. A model that runs elsewhere (a remote model) has a
//! [`Runner`] from its backend, which sends each request on.

pub mod ordering;
pub mod payload;
pub mod responder;

use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::batch::BatchKey;
use crate::dynamic_batch_scheduler::DynamicBatchScheduler;
use crate::ensemble_scheduler::EnsembleScheduler;
use crate::error::Result;
use crate::instance_pool::{Inline, InstancePool, Job};
use crate::metrics::model::GaugeGuard;
use crate::parameter::Parameters;
use crate::sequence_batcher::SequenceBatcher;
use crate::sequence_batcher::correlation::Flags;
use crate::statistics::{ComputeTiming, ModelStatistics};
use crate::tensor::Tensor;
use crate::trace::RequestTrace;

pub use payload::{CancelOnDrop, Payload};
pub use responder::{Outcome, Responder, Responses};

/// A checked request on its way to an instance: the one message every
/// scheduler queues and every instance runs, unary or decoupled alike.
/// Schedulers fill in what they decide (a priority level and deadline, a
/// sequence's flags) on the message itself rather than wrapping it.
#[derive(Debug)]
pub struct Request {
    /// The client's id, for the requests an ensemble or a remote model
    /// makes and for log lines.
    pub id: String,
    /// The inputs, in config order and in the shapes the model expects;
    /// taken by the instance, or dropped by the caller on cancellation.
    pub payload: Arc<Payload>,
    /// Rows along the batch dimension (1 for models that do not batch).
    pub batch_size: usize,
    /// Which requests it may share a batch with (set for the schedulers
    /// that batch).
    pub key: BatchKey,
    pub parameters: Parameters,
    /// The outputs the request asks for, for backends that tell their
    /// model (Triton's `requested_output_names()`); empty for the others.
    pub requested: Vec<String>,
    /// The dynamic batcher's priority level (an index, 0 the highest).
    pub priority: usize,
    /// When the dynamic batcher's queue policy gives up on it.
    pub deadline: Option<Instant>,
    /// Its place in a sequence, read by the sequence batcher's handle.
    pub sequence: Option<Flags>,
    /// When the request reached its scheduler (queue time starts here),
    /// on tokio's clock so the batchers' timing is testable on paused time.
    pub enqueued_at: Instant,
    /// Counts the request in `nv_inference_pending_request_count` until its
    /// execution starts or it is dropped (answered early, expired, cancelled).
    pub queued: GaugeGuard,
    /// The request's span (model, version, id): whatever logs about it, on
    /// whichever thread, logs inside it. Disabled spans cost a level check.
    pub span: tracing::Span,
    /// The request's trace, when it is sampled: the instance adds its queue
    /// and compute spans.
    pub trace: Option<Arc<RequestTrace>>,
    /// The client's W3C trace context, passed on by models that call others.
    pub trace_parent: Vec<(String, String)>,
    /// Where its responses go: one for a unary call, any number for a
    /// decoupled one.
    pub responder: Responder,
}

/// How a model's requests are run; the model does not know which it has.
pub enum Scheduler {
    /// Each request to the next free instance.
    Default(InstancePool),
    /// Triton's dynamic batcher in front of the instances.
    Dynamic(Arc<DynamicBatchScheduler>),
    /// Triton's sequence batcher: stateful models, one instance per sequence.
    Sequence(SequenceBatcher),
    /// Triton's ensemble: a DAG of other models, no instances of its own.
    Ensemble(Arc<EnsembleScheduler>),
    /// A model that runs elsewhere (another server's, over KServe v2 gRPC):
    /// its backend's runner takes every request.
    Runner(Arc<dyn Runner>),
}

impl Scheduler {
    /// The instances, when they run each request on the calling thread
    /// ([`Inline::run_now`]) with nothing in front of them.
    pub fn inline(&self) -> Option<&Inline> {
        match self {
            Scheduler::Default(pool) => pool.inline(),
            _ => None,
        }
    }

    /// Whether requests must carry their [`BatchKey`].
    pub fn batches(&self) -> bool {
        matches!(self, Scheduler::Dynamic(_) | Scheduler::Sequence(_))
    }

    /// Queues a request; its responses go to its responder, and the
    /// responder's end is the request's end. Refused at once (full queue,
    /// bad priority or sequence flags) with the request dropped. Dropping
    /// the request's [`Responses`] and its [`CancelOnDrop`] cancels it
    /// wherever it is.
    pub fn submit(&self, request: Request, statistics: &Arc<ModelStatistics>) -> Result<()> {
        match self {
            Scheduler::Default(pool) => pool.try_submit(Job::single(request)),
            Scheduler::Dynamic(batcher) => batcher.enqueue(request),
            Scheduler::Sequence(batcher) => batcher.enqueue(request),
            Scheduler::Ensemble(ensemble) => {
                spawn_counted(Arc::clone(ensemble) as Arc<dyn Runner>, request, statistics);
                Ok(())
            }
            Scheduler::Runner(runner) => {
                spawn_counted(Arc::clone(runner), request, statistics);
                Ok(())
            }
        }
    }
}

/// Runs a request that has no instance of its own (an ensemble's DAG, a
/// remote call) on its own task, which stops when the client goes away,
/// and counts it as one execution of its batch, its whole time as compute,
/// as Triton counts an ensemble. `run` sends the responses and returns
/// the error that ends the request, if one does.
fn spawn_counted(runner: Arc<dyn Runner>, request: Request, statistics: &Arc<ModelStatistics>) {
    let statistics = Arc::clone(statistics);
    let span = request.span.clone();
    let Request {
        id,
        payload,
        batch_size,
        parameters,
        trace,
        trace_parent,
        responder,
        queued,
        enqueued_at,
        ..
    } = request;
    let task = async move {
        // No queue of its own: its queue time is zero, and it leaves the
        // pending count as it starts.
        drop(queued);
        statistics.record_queue(enqueued_at.elapsed());
        let Some(inputs) = payload.take() else {
            return;
        };
        let started = Instant::now();
        let ran = Ran {
            id,
            inputs,
            parameters,
            trace,
            trace_parent,
            responder: &responder,
        };
        tokio::select! {
            outcome = runner.run(&ran) => match outcome {
                Ok(()) => {
                    let timing = ComputeTiming {
                        infer: started.elapsed(),
                        ..ComputeTiming::default()
                    };
                    statistics.record_execution(batch_size as u64, 1, timing);
                }
                Err(e) => responder.fail(e),
            },
            () = responder.closed() => {}
        }
    };
    tokio::spawn(tracing::Instrument::instrument(task, span));
}

/// What runs a request of a model that has no instances of its own: an
/// ensemble's DAG, or what the backend of a model that runs elsewhere
/// provides.
pub trait Runner: Send + Sync {
    /// Sends the request's responses (one for a unary model, any number
    /// for a decoupled one); the error that ends it, if one does.
    fn run<'a>(&'a self, ran: &'a Ran<'a>) -> BoxFuture<'a, Result<()>>;
}

/// A request as a model without instances runs it: its inputs taken, the
/// rest borrowed for the requests it makes.
#[derive(Debug)]
pub struct Ran<'a> {
    pub id: String,
    pub inputs: Vec<Tensor>,
    pub parameters: Parameters,
    pub trace: Option<Arc<RequestTrace>>,
    pub trace_parent: Vec<(String, String)>,
    pub responder: &'a Responder,
}

#[cfg(test)]
impl Request {
    /// A unary request of `batch_size` rows, for tests, with its responses.
    pub fn for_test(inputs: Vec<Tensor>, batch_size: usize) -> (Request, Responses) {
        let (responder, responses) = responder::channel(responder::UNARY_DEPTH);
        let request = Request {
            id: String::new(),
            key: BatchKey::of(&inputs),
            payload: Payload::new(inputs),
            batch_size,
            parameters: Parameters::default(),
            requested: Vec::new(),
            priority: 0,
            deadline: None,
            sequence: None,
            enqueued_at: Instant::now(),
            queued: crate::metrics::ModelMetrics::none().pending(),
            span: tracing::Span::none(),
            trace: None,
            trace_parent: Vec::new(),
            responder,
        };
        (request, responses)
    }
}
