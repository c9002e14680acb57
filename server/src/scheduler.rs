//! Scheduling: how requests reach a model's instances.
//!
//! Two schedulers, as in Triton: the default one hands each request to the
//! next free instance; the dynamic batcher ([`crate::dynamic_batch_scheduler`])
//! queues requests and forms batches. Both feed the same
//! [`InstancePool`](crate::instance_pool::InstancePool).

pub mod ordering;
pub mod payload;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::batch::BatchKey;
use crate::dynamic_batch_scheduler::DynamicBatchScheduler;
use crate::error::{Error, Result};
use crate::instance_pool::{InstancePool, Job};
use crate::metrics::model::GaugeGuard;
use crate::parameter::Parameters;
use crate::statistics::ModelStatistics;
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

pub enum Scheduler {
    Default(InstancePool),
    Dynamic(Arc<DynamicBatchScheduler>),
}

impl Scheduler {
    /// Runs a request and returns its own outputs (every output the model
    /// produces). Dropping the returned future cancels the request and
    /// drops its inputs at once, wherever it is queued.
    pub async fn schedule(
        &self,
        inputs: Vec<Tensor>,
        batch_size: usize,
        parameters: &Parameters,
        statistics: &ModelStatistics,
        trace: Option<Arc<RequestTrace>>,
    ) -> Result<Vec<Tensor>> {
        // The batch key is read before the inputs move into the payload.
        let key = match self {
            Scheduler::Dynamic(_) => Some(BatchKey::of(&inputs)),
            Scheduler::Default(_) => None,
        };
        let (tx, rx) = oneshot::channel();
        let payload = Payload::new(inputs);
        let _cancel = CancelOnDrop(Arc::clone(&payload));
        let pending = Pending {
            payload,
            batch_size,
            reply: Reply::direct(tx),
            arrived: Instant::now(),
            queued: statistics.pending(),
            trace,
        };
        match self {
            Scheduler::Default(pool) => pool.try_submit(Job::single(pending))?,
            Scheduler::Dynamic(batcher) => batcher.enqueue(pending, key.unwrap_or_default(), parameters)?,
        }
        rx.await
            .unwrap_or_else(|_| Err(Error::internal("the model instance stopped before answering")))
    }
}
