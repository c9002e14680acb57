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

#[cfg(test)]
mod paused_tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;
use tokio::time::Instant;

use self::book::{Book, Done, Item, Row};
use self::correlation::{CorrelationId, Flags};
use crate::batch::BatchKey;
use crate::datatype::DataType;
use crate::error::{Error, Result};
use crate::instance_pool::{InstancePool, Job};
use crate::model_config::sequence::SequenceConfig;
use crate::scheduler::responder::{self, Responses, STREAM_DEPTH, UNARY_DEPTH};
use crate::scheduler::{Payload, Request, Responder};

/// Requests in transit from handlers to the actor.
const INTAKE: usize = 16_384;

/// The handle a sequence model holds.
pub struct SequenceBatcher {
    model: String,
    batching: bool,
    /// The CORRID control's input and datatype, which ids must match.
    correlation: Option<(String, DataType)>,
    intake: mpsc::Sender<Request>,
}

impl Item for Request {
    type Key = BatchKey;

    fn key(&self) -> &BatchKey {
        &self.key
    }

    fn is_live(&self) -> bool {
        self.payload.is_live() && !self.responder.is_closed()
    }
}

type Running = Pin<Box<dyn Future<Output = (usize, Vec<Done>)> + Send>>;

impl SequenceBatcher {
    /// Starts the actor for a model whose instances each have their own
    /// queue in `pool` ([`InstancePool::start_per_instance`]). A decoupled
    /// model's requests stream their responses through, each carrying the
    /// states it updates.
    pub fn start(
        model: &str,
        settings: SequenceConfig,
        pool: InstancePool,
        decoupled: bool,
    ) -> Result<SequenceBatcher> {
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
            decoupled,
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

    /// Reads the request's sequence id and flags onto it and queues it.
    pub fn enqueue(&self, mut request: Request) -> Result<()> {
        let correlation = self
            .correlation
            .as_ref()
            .map(|(name, datatype)| (name.as_str(), *datatype));
        let flags = Flags::of(&request.parameters, &self.model, correlation)?;
        if self.batching && request.batch_size != 1 {
            return Err(Error::invalid(format!(
                "inference request to model '{}' must specify batch-size 1 due to requirements of sequence batcher, got {}",
                self.model, request.batch_size
            )));
        }
        request.sequence = Some(flags);
        self.intake.try_send(request).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => Error::unavailable("Exceeds maximum queue size"),
            mpsc::error::TrySendError::Closed(_) => Error::unavailable(format!("model '{}' is unloading", self.model)),
        })
    }
}

struct Actor {
    model: String,
    settings: Arc<SequenceConfig>,
    decoupled: bool,
    book: Book<Request>,
    pool: InstancePool,
    arrivals: mpsc::Receiver<Request>,
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
            let wake = polled.wake;
            tokio::select! {
                arrival = self.arrivals.recv(), if open => match arrival {
                    Some(request) => {
                        self.accept(request);
                        // Whatever else has arrived joins the same poll.
                        while let Ok(request) = self.arrivals.try_recv() {
                            self.accept(request);
                        }
                    }
                    None => {
                        open = false;
                        for request in self.book.drain() {
                            let error = Error::unavailable(format!("model '{}' is unloading", self.model));
                            request.responder.fail(error);
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

    fn accept(&mut self, mut request: Request) {
        let Some(flags) = request.sequence.take() else {
            request
                .responder
                .fail(Error::internal("a sequence request came without its flags"));
            return;
        };
        let arrived = request.enqueued_at;
        if let Err((request, error)) = self.book.accept(flags, request, arrived) {
            request.responder.fail(error);
        }
    }

    /// Sends one batch to its instance. Each row's request goes as it is,
    /// its inputs joined by the controls and states, and its responses
    /// through a tap beside it that keeps the states they carry and
    /// forwards the rest to the client; the taps' ends come back through
    /// `running`.
    fn dispatch(&mut self, lane: usize, rows: Vec<Row<Request>>) {
        let mut requests = Vec::with_capacity(rows.len());
        let mut taps = Vec::with_capacity(rows.len());
        let mut skipped = Vec::new();
        let depth = if self.decoupled { STREAM_DEPTH } else { UNARY_DEPTH };
        for row in rows {
            let mut request = row.item;
            // Its client went away since the book looked.
            let Some(inputs) = request.payload.take() else {
                skipped.push(Done {
                    id: row.id,
                    end: row.end,
                    state: None,
                });
                continue;
            };
            request.payload = Payload::new(rows::inputs(
                &self.settings,
                inputs,
                &row.id,
                row.start,
                row.end,
                row.state.as_deref(),
            ));
            // What the instance may read of its place (a Python model's
            // correlation_id() and flags()): START as the book decided it.
            request.sequence = Some(Flags {
                id: row.id.clone(),
                start: row.start,
                end: row.end,
            });
            let (inner, responses) = responder::channel(depth);
            let client = std::mem::replace(&mut request.responder, inner);
            requests.push(request);
            taps.push(Tap {
                id: row.id,
                end: row.end,
                streamed: self.decoupled,
                client,
                responses,
            });
        }
        let submitted = match requests.is_empty() {
            true => Ok(()),
            false => self.pool.submit_to(lane, Job { requests }),
        };
        let settings = Arc::clone(&self.settings);
        let model = self.model.clone();
        self.running.push(Box::pin(async move {
            let forwarded = taps.into_iter().map(|tap| {
                let submitted = submitted.clone();
                let (settings, model) = (&settings, &model);
                async move {
                    match submitted {
                        Ok(()) => tap.forward(settings, model).await,
                        Err(e) => {
                            tap.client.fail(e);
                            Done {
                                id: tap.id,
                                end: tap.end,
                                state: None,
                            }
                        }
                    }
                }
            });
            let mut done = skipped;
            // At once: a decoupled instance may be streaming to all of them.
            done.extend(futures::future::join_all(forwarded).await);
            (lane, done)
        }));
    }
}

/// One row's responses on their way from the instance to the client.
struct Tap {
    id: CorrelationId,
    end: bool,
    /// A decoupled model's: any number of responses, states in some.
    streamed: bool,
    client: Responder,
    responses: Responses,
}

impl Tap {
    /// Forwards every response, its state outputs taken out and kept, and
    /// says how the row ended: with the last states it carried, or none
    /// when it failed (the sequence keeps its old ones).
    async fn forward(mut self, settings: &SequenceConfig, model: &str) -> Done {
        let mut state = None;
        let mut failed = false;
        let mut answered = false;
        while let Some(outcome) = self.responses.recv().await {
            answered = true;
            let (outcome, states) = match &outcome {
                // A decoupled model's response that updates no state.
                Ok(produced) if self.streamed && !rows::carries_states(settings, &produced.outputs) => (outcome, None),
                _ => rows::take_states(settings, model, outcome),
            };
            match states {
                Some(states) => state = Some(states),
                None if outcome.is_err() => failed = true,
                None => {}
            }
            if !self.client.send(outcome).await {
                // The client went away: dropping the channel tells the instance.
                break;
            }
        }
        if !answered {
            failed = true;
            self.client
                .fail(Error::internal("the model instance stopped before answering"));
        }
        Done {
            id: self.id,
            end: self.end,
            state: if failed { None } else { state },
        }
    }
}
