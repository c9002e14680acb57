//! Scheduling: how requests reach a model's instances.
//!
//! As in Triton: the default scheduler hands each request to the next free
//! instance; the dynamic batcher ([`crate::dynamic_batch_scheduler`])
//! queues requests and forms batches; the sequence batcher
//! ([`crate::sequence_batcher`]) keeps each sequence on one instance and
//! carries its state; all feed an
//! [`InstancePool`](crate::instance_pool::InstancePool). An ensemble
//! ([`crate::ensemble_scheduler`]) has no instances: it sends each step to
//! its member model. A remote model ([`crate::backend::remote`]) sends each
//! request to another server.

pub mod ordering;
pub mod payload;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use crate::backend::remote::RemoteModel;
use crate::batch::BatchKey;
use crate::dynamic_batch_scheduler::DynamicBatchScheduler;
use crate::ensemble_scheduler::EnsembleScheduler;
use crate::error::{Error, Result};
use crate::instance_pool::{Inline, InstancePool, Job};
use crate::metrics::model::GaugeGuard;
use crate::parameter::Parameters;
use crate::sequence_batcher::SequenceBatcher;
use crate::statistics::{ComputeTiming, ModelStatistics};
use crate::tensor::Tensor;
use crate::trace::RequestTrace;

pub use ordering::Reply;
pub use payload::{CancelOnDrop, Payload};

/// A checked request on its way to an instance: the one message every
/// scheduler queues and every instance runs.
#[derive(Debug)]
pub struct Pending {
    /// The inputs, in config order and in the shapes the model expects;
    /// taken by the instance, or dropped by the caller on cancellation.
    pub payload: Arc<Payload>,
    /// Rows along the batch dimension (1 for models that do not batch).
    pub batch_size: usize,
    pub reply: Reply,
    /// When the request reached its scheduler (queue time starts here).
    pub arrived: Instant,
    /// Counts the request in `nv_inference_pending_request_count` until its
    /// execution starts or it is dropped (answered early, expired, cancelled).
    pub queued: GaugeGuard,
    /// The request's trace, when it is sampled: the instance adds its queue
    /// and compute spans.
    pub trace: Option<Arc<RequestTrace>>,
}

/// What a scheduler needs of a request besides its inputs.
#[derive(Debug)]
pub struct Work<'a> {
    /// Rows along the batch dimension (1 for models that do not batch).
    pub batch_size: usize,
    /// The request's id, for the requests an ensemble or a remote model makes.
    pub id: &'a str,
    pub parameters: &'a Parameters,
    /// The request's trace, when it is sampled.
    pub trace: Option<Arc<RequestTrace>>,
    /// The client's W3C trace context, passed on by models that call others.
    pub trace_parent: &'a [(String, String)],
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
    Ensemble(EnsembleScheduler),
    /// Another server's model, called over KServe v2 gRPC.
    Remote(Box<RemoteModel>),
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

    /// Runs a request and returns its own outputs (every output the model
    /// produces). Dropping the returned future cancels the request and
    /// drops its inputs at once, wherever it is queued.
    pub async fn schedule(
        &self,
        inputs: Vec<Tensor>,
        work: Work<'_>,
        statistics: &ModelStatistics,
    ) -> Result<Vec<Tensor>> {
        match self {
            Scheduler::Default(pool) => {
                on_instances(inputs, work, statistics, |p| pool.try_submit(Job::single(p))).await
            }
            Scheduler::Dynamic(batcher) => {
                // The batch key is read before the inputs move into the payload.
                let key = BatchKey::of(&inputs);
                let parameters = work.parameters;
                on_instances(inputs, work, statistics, |p| batcher.enqueue(p, key, parameters)).await
            }
            Scheduler::Sequence(batcher) => {
                let key = BatchKey::of(&inputs);
                let parameters = work.parameters;
                on_instances(inputs, work, statistics, |p| batcher.enqueue(p, key, parameters)).await
            }
            // Boxed: these futures are kilobytes (a whole DAG's, a client's),
            // and every future awaiting this one would carry their size
            // (twice, as rustc lays nested futures out today) on the
            // per-request path of every other model.
            Scheduler::Ensemble(ensemble) => counted(&work, statistics, Box::pin(ensemble.run(inputs, &work))).await,
            Scheduler::Remote(remote) => counted(&work, statistics, Box::pin(remote.infer(inputs, &work))).await,
        }
    }
}

/// Runs a request that has no instance of its own (an ensemble's DAG, a
/// remote call) and counts it as one execution of its batch, its whole
/// time as compute, as Triton counts an ensemble.
async fn counted(
    work: &Work<'_>,
    statistics: &ModelStatistics,
    run: impl Future<Output = Result<Vec<Tensor>>>,
) -> Result<Vec<Tensor>> {
    let started = Instant::now();
    let outputs = run.await?;
    let timing = ComputeTiming {
        infer: started.elapsed(),
        ..ComputeTiming::default()
    };
    statistics.record_execution(work.batch_size as u64, 1, timing);
    Ok(outputs)
}

/// How many responses of one decoupled request may wait for its client
/// before the backend sending them waits too.
const STREAM_DEPTH: usize = 16;

impl Scheduler {
    /// Queues a request of a decoupled model; its responses arrive on the
    /// returned channel, which closes when the model is done with it.
    /// Dropping the guard (with the channel) cancels it.
    pub fn schedule_stream(
        &self,
        inputs: Vec<Tensor>,
        work: Work<'_>,
        statistics: &ModelStatistics,
    ) -> Result<(mpsc::Receiver<Result<Vec<Tensor>>>, CancelOnDrop)> {
        let (tx, rx) = mpsc::channel(STREAM_DEPTH);
        let key = BatchKey::of(&inputs);
        let payload = Payload::new(inputs);
        let cancel = CancelOnDrop(Arc::clone(&payload));
        let pending = Pending {
            payload,
            batch_size: work.batch_size,
            reply: Reply::streaming(tx),
            arrived: Instant::now(),
            queued: statistics.pending(),
            trace: work.trace,
        };
        match self {
            Scheduler::Default(pool) => pool.try_submit(Job::single(pending))?,
            Scheduler::Dynamic(batcher) => batcher.enqueue(pending, key, work.parameters)?,
            Scheduler::Sequence(_) | Scheduler::Ensemble(_) | Scheduler::Remote(_) => {
                return Err(Error::unsupported(
                    "decoupled sequence models, ensembles and remote models are not supported yet",
                ));
            }
        }
        Ok((rx, cancel))
    }
}

/// Hands a request to `submit` (a queue in front of the instances) and
/// waits for the instance's answer.
async fn on_instances(
    inputs: Vec<Tensor>,
    work: Work<'_>,
    statistics: &ModelStatistics,
    submit: impl FnOnce(Pending) -> Result<()>,
) -> Result<Vec<Tensor>> {
    let (tx, rx) = oneshot::channel();
    let payload = Payload::new(inputs);
    let _cancel = CancelOnDrop(Arc::clone(&payload));
    submit(Pending {
        payload,
        batch_size: work.batch_size,
        reply: Reply::direct(tx),
        arrived: Instant::now(),
        queued: statistics.pending(),
        trace: work.trace,
    })?;
    rx.await
        .unwrap_or_else(|_| Err(Error::internal("the model instance stopped before answering")))
}
