//! The default scheduler: each request goes to the next free instance.
//!
//! Every instance is a dedicated OS thread that owns its backend instance
//! (an ONNX Runtime session's `run` is blocking and CPU-heavy, so it never
//! runs on the async runtime). The threads drain one bounded queue: whichever
//! instance is free takes the next job, and a full queue is refused at once
//! rather than growing without limit.

use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use nereid_proto::inference::ModelConfig;
use tokio::sync::oneshot;

use crate::backend::{Backend, Device, InstanceSpec, ModelInstance};
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// How many jobs may wait per instance before new ones are refused.
const QUEUE_PER_INSTANCE: usize = 256;

/// One request travelling to an instance, with its reply channel.
struct Job {
    inputs: Vec<Tensor>,
    reply: oneshot::Sender<Result<Vec<Tensor>>>,
    enqueued_at: Instant,
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
}

/// The instances of one model version and the queue in front of them.
pub struct DefaultScheduler {
    queue: Sender<Job>,
}

impl DefaultScheduler {
    /// Starts one worker thread per placement and waits until each has
    /// created its instance. If any fails, all are stopped and the first
    /// reason is returned. Blocking: call it from a blocking context.
    pub fn start(source: InstanceSource, placements: &[Placement]) -> Result<DefaultScheduler> {
        let capacity = QUEUE_PER_INSTANCE * placements.len().max(1);
        let (queue, jobs) = crossbeam_channel::bounded::<Job>(capacity);
        let source = Arc::new(source);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<()>>();
        for (index, placement) in placements.iter().copied().enumerate() {
            let source = Arc::clone(&source);
            let jobs = jobs.clone();
            let ready = ready_tx.clone();
            std::thread::Builder::new()
                .name(format!("{}-{}-{index}", source.model, source.version))
                .spawn(move || worker(&source, placement, &jobs, &ready))
                .map_err(|e| Error::internal(format!("failed to start an instance thread: {e}")))?;
        }
        drop(ready_tx);
        let scheduler = DefaultScheduler { queue };
        for _ in placements {
            match ready_rx.recv() {
                Ok(Ok(())) => {}
                // Dropping the scheduler closes the queue, which stops the
                // instances that did start.
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(Error::internal("an instance thread exited while loading")),
            }
        }
        Ok(scheduler)
    }

    /// Queues a request and waits for its outputs.
    pub async fn execute(&self, inputs: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let (reply, response) = oneshot::channel();
        let job = Job {
            inputs,
            reply,
            enqueued_at: Instant::now(),
        };
        match self.queue.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                return Err(Error::unavailable("Exceeds maximum queue size"));
            }
            Err(TrySendError::Disconnected(_)) => {
                return Err(Error::unavailable("model instances have stopped"));
            }
        }
        response.await.unwrap_or_else(|_| {
            Err(Error::internal(
                "the model instance stopped before answering",
            ))
        })
    }
}

/// The life of one instance thread: create the instance, report, serve jobs
/// until the queue closes.
fn worker(
    source: &InstanceSource,
    placement: Placement,
    jobs: &Receiver<Job>,
    ready: &std::sync::mpsc::Sender<Result<()>>,
) {
    let spec = InstanceSpec {
        config: &source.config,
        version_dir: &source.version_dir,
        device: placement.device,
        intra_op_threads: placement.intra_op_threads,
    };
    let created =
        std::panic::catch_unwind(AssertUnwindSafe(|| source.backend.create_instance(spec)))
            .unwrap_or_else(|_| {
                Err(Error::internal(
                    "the backend panicked while creating an instance",
                ))
            });
    let mut instance: Box<dyn ModelInstance> = match created {
        Ok(instance) => instance,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let _ = ready.send(Ok(()));
    for job in jobs.iter() {
        // A client that went away gets no compute.
        if job.reply.is_closed() {
            continue;
        }
        tracing::trace!(
            queue_us = job.enqueued_at.elapsed().as_micros() as u64,
            "executing"
        );
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| instance.execute(job.inputs)))
            .unwrap_or_else(|_| {
                Err(Error::internal(
                    "the model instance panicked while executing",
                ))
            });
        let _ = job.reply.send(result);
    }
}
