//! Scheduling: how requests reach a model's instances.
//!
//! Two schedulers, as in Triton: the default one hands each request to the
//! next free instance; the dynamic batcher ([`crate::dynamic_batch_scheduler`])
//! queues requests and forms batches. Both feed the same
//! [`InstancePool`](crate::instance_pool::InstancePool).

pub mod ordering;

use std::sync::Arc;
use std::time::Instant;

use tokio::sync::oneshot;

use crate::dynamic_batch_scheduler::DynamicBatchScheduler;
use crate::error::{Error, Result};
use crate::instance_pool::{InstancePool, Job};
use crate::parameter::Parameters;
use crate::tensor::Tensor;

pub use ordering::Reply;

/// A checked request on its way to an instance.
#[derive(Debug)]
pub struct Pending {
    /// In config order and in the shapes the model expects.
    pub inputs: Vec<Tensor>,
    /// Rows along the batch dimension (1 for models that do not batch).
    pub batch_size: usize,
    pub reply: Reply,
    pub arrived: Instant,
}

pub enum Scheduler {
    Default(InstancePool),
    Dynamic(Arc<DynamicBatchScheduler>),
}

impl Scheduler {
    /// Runs a request and returns its own outputs (every output the model produces).
    pub async fn schedule(
        &self,
        inputs: Vec<Tensor>,
        batch_size: usize,
        parameters: &Parameters,
    ) -> Result<Vec<Tensor>> {
        let (tx, rx) = oneshot::channel();
        let arrived = Instant::now();
        match self {
            Scheduler::Default(pool) => {
                let pending = Pending {
                    inputs,
                    batch_size,
                    reply: Reply::direct(tx),
                    arrived,
                };
                pool.try_submit(Job::single(pending))?;
            }
            Scheduler::Dynamic(batcher) => batcher.enqueue(inputs, batch_size, parameters, tx, arrived)?,
        }
        rx.await
            .unwrap_or_else(|_| Err(Error::internal("the model instance stopped before answering")))
    }
}
