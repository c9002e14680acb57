//! Triton's dynamic batcher: requests that arrive one at a time run as
//! batches.
//!
//! The batcher is an actor. [`DynamicBatchScheduler`] is the handle the model
//! holds: it checks a request's priority and timeout against the queue
//! policies and sends it to the actor over a bounded channel. The actor task
//! owns the [`queue::Queue`], applies timeouts, asks the pure
//! [`policy::decide`] what to send, and sends a batch only when an instance
//! has said it is idle, so requests keep gathering while every instance is
//! busy. An instance says so with its finished job's answers, which the
//! actor sends ([`Finished`]); the actor notes when one frees after all were
//! busy, since a queued batch's delay runs from then (see [`policy`]).

pub mod policy;
pub mod queue;

#[cfg(test)]
mod paused_tests;

use std::sync::Arc;
use std::time::Duration;

use nereid_proto::inference::{ModelConfig, ModelDynamicBatching, ModelQueuePolicy, model_queue_policy};
use tokio::sync::mpsc;
use tokio::time::Instant;

use self::policy::{BatchPolicy, Decision};
use self::queue::{LevelPolicy, Queue, TimeoutAction};
use crate::error::{Error, Result};
use crate::instance_pool::{Finished, InstancePool, Job};
use crate::parameter::Parameters;
use crate::scheduler::Request;
use crate::scheduler::ordering::Reorderer;

/// Requests in transit from handlers to the actor, beyond the per-level limits.
const INTAKE: usize = 16_384;

/// The longest request timeout accepted: anything above is surely a mistake.
const MAX_TIMEOUT: Duration = Duration::from_secs(3600);

/// `dynamic_batching` turned into what the batcher needs.
#[derive(Debug, Clone, PartialEq)]
pub struct BatcherConfig {
    pub batch: BatchPolicy,
    pub preserve_ordering: bool,
    /// Index 0 is priority 1 (the highest). One level when priorities are off.
    pub levels: Vec<LevelPolicy>,
    /// Whether `priority_levels` was set, so requests may name a priority.
    pub priorities: bool,
    /// Index into `levels` for requests that name no priority.
    pub default_level: usize,
}

impl BatcherConfig {
    pub fn from_config(config: &ModelConfig, batching: &ModelDynamicBatching) -> Result<Self> {
        let max = usize::try_from(config.max_batch_size).unwrap_or(0);
        if max == 0 {
            return Err(Error::invalid("dynamic_batching needs max_batch_size > 0"));
        }
        let mut preferred = Vec::with_capacity(batching.preferred_batch_size.len());
        for &size in &batching.preferred_batch_size {
            let size = usize::try_from(size)
                .ok()
                .filter(|s| (1..=max).contains(s))
                .ok_or_else(|| {
                    Error::invalid(format!(
                        "dynamic_batching.preferred_batch_size {size} must be between 1 and max_batch_size {max}"
                    ))
                })?;
            preferred.push(size);
        }
        preferred.sort_unstable();
        preferred.dedup();

        let default_policy = queue_policy(batching.default_queue_policy.as_ref());
        let count = usize::try_from(batching.priority_levels).unwrap_or(usize::MAX);
        let priorities = count > 0;
        let levels: Vec<LevelPolicy> = if priorities {
            if count > 1024 {
                return Err(Error::invalid(format!(
                    "dynamic_batching.priority_levels {count} is too large (at most 1024)"
                )));
            }
            (1..=count as u64)
                .map(|level| {
                    batching
                        .priority_queue_policy
                        .get(&level)
                        .map_or(default_policy, |p| queue_policy(Some(p)))
                })
                .collect()
        } else {
            vec![default_policy]
        };
        let default_level = if priorities {
            let level = batching.default_priority_level;
            if level == 0 || level > count as u64 {
                return Err(Error::invalid(format!(
                    "dynamic_batching.default_priority_level {level} must be between 1 and priority_levels {count}"
                )));
            }
            (level - 1) as usize
        } else {
            0
        };
        Ok(BatcherConfig {
            batch: BatchPolicy {
                max_batch_size: max,
                preferred,
                max_queue_delay: Duration::from_micros(batching.max_queue_delay_microseconds),
            },
            preserve_ordering: batching.preserve_ordering,
            levels,
            priorities,
            default_level,
        })
    }
}

fn queue_policy(policy: Option<&ModelQueuePolicy>) -> LevelPolicy {
    let Some(p) = policy else {
        return LevelPolicy {
            timeout_action: TimeoutAction::Reject,
            default_timeout: None,
            allow_timeout_override: false,
            max_queue_size: 0,
        };
    };
    LevelPolicy {
        timeout_action: if p.timeout_action == model_queue_policy::TimeoutAction::Delay as i32 {
            TimeoutAction::Delay
        } else {
            TimeoutAction::Reject
        },
        default_timeout: (p.default_timeout_microseconds > 0)
            .then(|| Duration::from_micros(p.default_timeout_microseconds)),
        allow_timeout_override: p.allow_timeout_override,
        max_queue_size: p.max_queue_size as usize,
    }
}

/// The handle a model holds.
pub struct DynamicBatchScheduler {
    model: String,
    config: BatcherConfig,
    intake: mpsc::Sender<Request>,
}

impl DynamicBatchScheduler {
    /// Starts the actor for a pool whose instances report idleness on `idle`,
    /// with the answers of the job they finished, which the actor sends.
    /// `instances` is how many are idle at the start.
    pub fn start(
        model: &str,
        config: BatcherConfig,
        pool: InstancePool,
        instances: usize,
        idle: mpsc::UnboundedReceiver<Finished>,
    ) -> Result<Arc<Self>> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::internal("the dynamic batcher needs the async runtime"))?;
        let (intake, requests) = mpsc::channel(INTAKE);
        let actor = Actor {
            queue: Queue::new(config.levels.clone()),
            policy: config.batch.clone(),
            reorderer: config.preserve_ordering.then(Reorderer::new),
            pool,
            idle_instances: instances,
            free_since: Instant::now(),
            requests,
            idle,
        };
        runtime.spawn(actor.run());
        Ok(Arc::new(DynamicBatchScheduler {
            model: model.to_string(),
            config,
            intake,
        }))
    }

    /// Reads the request's `priority` and `timeout` parameters into its
    /// level and deadline, and queues it.
    pub fn enqueue(&self, mut request: Request) -> Result<()> {
        let level = self.level(&request.parameters)?;
        let policy = &self.config.levels[level];
        let timeout = self.timeout(&request.parameters, policy)?.or(policy.default_timeout);
        request.priority = level;
        request.deadline = timeout.map(|t| request.enqueued_at + t);
        self.intake.try_send(request).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Error::unavailable("Exceeds maximum queue size"),
            mpsc::error::TrySendError::Closed(_) => Error::unavailable(format!("model '{}' is unloading", self.model)),
        })
    }

    fn level(&self, parameters: &Parameters) -> Result<usize> {
        let Some(value) = parameters.get("priority") else {
            return Ok(self.config.default_level);
        };
        let priority = value
            .as_i64()
            .ok_or_else(|| Error::invalid("parameter 'priority' must be an integer"))?;
        if priority == 0 {
            return Ok(self.config.default_level);
        }
        let levels = self.config.levels.len() as i64;
        if !self.config.priorities {
            return Err(Error::invalid(format!(
                "invalid priority {priority}: model '{}' does not define priority levels (dynamic_batching.priority_levels)",
                self.model
            )));
        }
        if !(1..=levels).contains(&priority) {
            return Err(Error::invalid(format!(
                "invalid priority {priority}: model '{}' has priority levels 1 to {levels}",
                self.model
            )));
        }
        Ok((priority - 1) as usize)
    }

    fn timeout(&self, parameters: &Parameters, policy: &LevelPolicy) -> Result<Option<Duration>> {
        let Some(value) = parameters.get("timeout") else {
            return Ok(None);
        };
        let micros = value
            .as_i64()
            .ok_or_else(|| Error::invalid("parameter 'timeout' must be an integer number of microseconds"))?;
        if micros < 0 {
            return Err(Error::invalid(format!(
                "parameter 'timeout' must not be negative, got {micros}"
            )));
        }
        if micros == 0 {
            return Ok(None);
        }
        if !policy.allow_timeout_override {
            return Err(Error::invalid(format!(
                "request timeout override is not allowed for model '{}': set allow_timeout_override in its queue policy",
                self.model
            )));
        }
        let timeout = Duration::from_micros(micros as u64);
        if timeout > MAX_TIMEOUT {
            return Err(Error::invalid(format!(
                "parameter 'timeout' {micros} us is longer than the maximum of {} us",
                MAX_TIMEOUT.as_micros()
            )));
        }
        Ok(Some(timeout))
    }
}

struct Actor {
    queue: Queue,
    policy: BatchPolicy,
    reorderer: Option<Arc<Reorderer>>,
    pool: InstancePool,
    idle_instances: usize,
    /// When an instance last became free while all were busy (or the start).
    free_since: Instant,
    requests: mpsc::Receiver<Request>,
    idle: mpsc::UnboundedReceiver<Finished>,
}

impl Actor {
    async fn run(mut self) {
        loop {
            let now = Instant::now();
            for expired in self.queue.expire(now) {
                expired.responder.fail(Error::unavailable("Request timeout expired"));
            }
            let mut wake = None;
            while self.idle_instances > 0 {
                let candidates = self.queue.candidates(self.policy.max_batch_size + 1);
                match policy::decide(&candidates, now, self.free_since, &self.policy) {
                    Decision::Dispatch(n) => {
                        let requests = self.queue.take(n);
                        if let Err(e) = self.pool.try_submit(Job { requests }) {
                            tracing::error!(error = %e, "could not hand a batch to the instances");
                        }
                        self.idle_instances -= 1;
                    }
                    Decision::WaitUntil(at) => {
                        wake = Some(at);
                        break;
                    }
                    Decision::Empty => break,
                }
            }
            let deadline = match (wake, self.queue.next_deadline()) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let sleep = async {
                match deadline {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                incoming = self.requests.recv() => match incoming {
                    Some(entry) => self.accept(entry),
                    None => break,
                },
                Some(finished) = self.idle.recv() => {
                    finished.send();
                    if self.idle_instances == 0 {
                        self.free_since = Instant::now();
                    }
                    self.idle_instances += 1;
                }
                () = sleep => {}
            }
        }
        for request in self.queue.drain() {
            request.responder.fail(Error::unavailable("the model was unloaded"));
        }
        // Answers already handed back go out; an instance that finishes
        // later finds the channel closed and sends its own.
        self.idle.close();
        while let Ok(finished) = self.idle.try_recv() {
            finished.send();
        }
    }

    fn accept(&mut self, mut request: Request) {
        // Ordering starts when the request is accepted, not when it was sent.
        if let Some(reorderer) = &self.reorderer {
            request.responder = request.responder.in_order_of(reorderer);
        }
        if let Err(rejected) = self.queue.push(request) {
            rejected
                .responder
                .fail(Error::unavailable("Exceeds maximum queue size"));
        }
    }
}
