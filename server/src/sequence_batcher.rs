//! Triton's sequence batcher, for stateful models (`sequence_batching`).
//!
//! The requests of one sequence (one audio stream, one conversation) must
//! reach the same instance in order, and the model's state must travel from
//! each request to the next. The batcher is an actor, like the dynamic
//! batcher: [`SequenceBatcher`] is the handle the model holds; it reads the
//! request's sequence id and flags and sends it to the actor task, which
//! keeps the [`book::Book`] (live sequences, their places and queues, the
//! batching rules), adds the control and state tensors to each row
//! ([`rows`]), sends each batch to its instance's own queue, and keeps the
//! states the answers carry.

pub mod book;
pub mod correlation;
pub mod rows;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{mpsc, oneshot};

use self::book::{Book, Done, Item, Row};
use self::correlation::Flags;
use crate::batch::BatchKey;
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::instance_pool::{InstancePool, Job};
use crate::model_config::sequence::SequenceConfig;
use crate::parameter::Parameters;
use crate::scheduler::{Payload, Pending, Reply};

/// Requests in transit from handlers to the actor.
const INTAKE: usize = 16_384;

/// The handle a sequence model holds.
pub struct SequenceBatcher {
    model: String,
    batching: bool,
    /// The CORRID control's input and datatype, which ids must match.
    correlation: Option<(String, DataType)>,
    intake: mpsc::Sender<Arrival>,
}

struct Arrival {
    flags: Flags,
    waiting: Waiting,
}

/// A request in the book.
struct Waiting {
    pending: Pending,
    key: BatchKey,
}

impl Item for Waiting {
    type Key = BatchKey;

    fn key(&self) -> &BatchKey {
        &self.key
    }

    fn is_live(&self) -> bool {
        self.pending.payload.is_live() && !self.pending.reply.is_closed()
    }
}

type Running = Pin<Box<dyn Future<Output = (usize, Vec<Done>)> + Send>>;

impl SequenceBatcher {
    /// Starts the actor for a model whose instances each have their own
    /// queue in `pool` ([`InstancePool::start_per_instance`]).
    pub fn start(model: &str, settings: SequenceConfig, pool: InstancePool) -> Result<SequenceBatcher> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| Error::internal("the sequence batcher needs the async runtime"))?;
        let (intake, arrivals) = mpsc::channel(INTAKE);
        let settings = Arc::new(settings);
        let actor = Actor {
            model: model.to_string(),
            book: Book::new(
                model,
                settings.strategy.clone(),
                settings.slots,
                pool.lanes(),
                settings.idle,
                settings.max_backlog,
            ),
            settings: Arc::clone(&settings),
            pool,
            arrivals,
            running: FuturesUnordered::new(),
        };
        runtime.spawn(actor.run());
        Ok(SequenceBatcher {
            model: model.to_string(),
            batching: settings.batching,
            correlation: settings.correlation_control().map(|c| (c.input.clone(), c.datatype)),
            intake,
        })
    }

    /// Reads the request's sequence id and flags and queues it; `key` says
    /// which requests it may share a batch with.
    pub fn enqueue(&self, pending: Pending, key: BatchKey, parameters: &Parameters) -> Result<()> {
        let correlation = self
            .correlation
            .as_ref()
            .map(|(name, datatype)| (name.as_str(), *datatype));
        let flags = Flags::of(parameters, &self.model, correlation)?;
        if self.batching && pending.batch_size != 1 {
            return Err(Error::invalid(format!(
                "inference request to model '{}' must specify batch-size 1 due to requirements of sequence batcher, got {}",
                self.model, pending.batch_size
            )));
        }
        let arrival = Arrival {
            flags,
            waiting: Waiting { pending, key },
        };
        self.intake.try_send(arrival).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Error::unavailable("Exceeds maximum queue size"),
            mpsc::error::TrySendError::Closed(_) => Error::unavailable(format!("model '{}' is unloading", self.model)),
        })
    }
}

struct Actor {
    model: String,
    settings: Arc<SequenceConfig>,
    book: Book<Waiting>,
    pool: InstancePool,
    arrivals: mpsc::Receiver<Arrival>,
    /// One future per batch on an instance: its answers, forwarded.
    running: FuturesUnordered<Running>,
}

impl Actor {
    async fn run(mut self) {
        let mut open = true;
        loop {
            let polled = self.book.poll(Instant::now());
            for (lane, rows) in polled.batches {
                self.dispatch(lane, rows);
            }
            if !open && self.running.is_empty() {
                break;
            }
            let wake = polled.wake.map(tokio::time::Instant::from_std);
            tokio::select! {
                arrival = self.arrivals.recv(), if open => match arrival {
                    Some(arrival) => {
                        self.accept(arrival);
                        // Whatever else has arrived joins the same poll.
                        while let Ok(arrival) = self.arrivals.try_recv() {
                            self.accept(arrival);
                        }
                    }
                    None => {
                        open = false;
                        for waiting in self.book.drain() {
                            let error = Error::unavailable(format!("model '{}' is unloading", self.model));
                            waiting.pending.reply.send(Err(error));
                        }
                    }
                },
                Some((lane, done)) = self.running.next(), if !self.running.is_empty() => {
                    self.book.complete(lane, done, Instant::now());
                }
                () = async { tokio::time::sleep_until(wake.expect("guarded")).await }, if wake.is_some() => {}
            }
        }
    }

    fn accept(&mut self, arrival: Arrival) {
        let Arrival { flags, waiting } = arrival;
        let arrived = waiting.pending.arrived;
        if let Err((waiting, error)) = self.book.accept(flags, waiting, arrived) {
            waiting.pending.reply.send(Err(error));
        }
    }

    /// Sends one batch to its instance; its answers come back through
    /// `running`.
    fn dispatch(&mut self, lane: usize, rows: Vec<Row<Waiting>>) {
        let mut requests = Vec::with_capacity(rows.len());
        let mut answers = Vec::with_capacity(rows.len());
        let mut skipped = Vec::new();
        for row in rows {
            let Pending {
                payload,
                batch_size,
                reply,
                arrived,
                queued,
                trace,
            } = row.item.pending;
            // Its client went away since the book looked.
            let Some(inputs) = payload.take() else {
                skipped.push(Done {
                    id: row.id,
                    end: row.end,
                    state: None,
                });
                continue;
            };
            let tensors = rows::inputs(
                &self.settings,
                inputs,
                &row.id,
                row.start,
                row.end,
                row.state.as_deref(),
            );
            let (tx, rx) = oneshot::channel();
            requests.push(Pending {
                payload: Payload::new(tensors),
                batch_size,
                reply: Reply::direct(tx),
                arrived,
                queued,
                trace,
            });
            answers.push((row.id, row.end, reply, rx));
        }
        let submitted = match requests.is_empty() {
            true => Ok(()),
            false => self.pool.submit_to(lane, Job { requests }),
        };
        let settings = Arc::clone(&self.settings);
        let model = self.model.clone();
        self.running.push(Box::pin(async move {
            let mut done = skipped;
            for (id, end, reply, rx) in answers {
                let outcome = match &submitted {
                    Ok(()) => rx
                        .await
                        .unwrap_or_else(|_| Err(Error::internal("the model instance stopped before answering"))),
                    Err(e) => Err(e.clone()),
                };
                let (outcome, state) = rows::take_states(&settings, &model, outcome);
                reply.send(outcome);
                done.push(Done { id, end, state });
            }
            (lane, done)
        }));
    }
}
