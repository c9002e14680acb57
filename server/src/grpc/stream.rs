//! `ModelStreamInfer`: many requests on one bidirectional stream.
//!
//! A request of an ordinary model is answered before the next message is
//! read, so its one response keeps the order of the requests (what Triton's
//! clients expect). A request of a decoupled model runs alongside the rest:
//! each of its responses goes out as the model sends it, tagged with the
//! request's id, and `triton_final_response` tells the client which one is
//! its last (an empty response with the flag set closes a decoupled request
//! when it asked for one with `triton_enable_empty_final_response`).
//!
//! An error answers one request and the stream goes on, as `error_message`;
//! when the stream's metadata carries Triton's `triton_grpc_error: true`
//! the first error ends the stream with its status instead. A client that
//! goes away cancels whatever it still had running.

use std::sync::Arc;

use futures::StreamExt;
use nereid_proto::inference::infer_parameter::ParameterChoice;
use nereid_proto::inference::{InferParameter, ModelInferRequest, ModelInferResponse, ModelStreamInferResponse};
use tokio::sync::{Semaphore, mpsc};
use tonic::{Status, Streaming};

use super::budget::{BodyAccount, with_call_allowance};
use super::convert::{self, EMPTY_FINAL, FINAL};
use super::status::to_status;
use crate::error::{Error, Result};
use crate::model::stream::ResponseStream;
use crate::parameter::Parameter;
use crate::request::InferRequest;
use crate::server::InferenceServer;

/// Triton's stream metadata that makes the first error end the stream.
pub const GRPC_ERROR_HEADER: &str = "triton_grpc_error";

/// Responses waiting for a slow client before the stream stops reading.
const OUTBOX: usize = 16;

/// Decoupled requests one stream may have running at once; the next
/// message waits (the client feels it as flow control).
const DECOUPLED_IN_FLIGHT: usize = 64;

/// What one stream is given by the handler.
pub struct StreamContext {
    pub server: Arc<InferenceServer>,
    /// The call's request-byte account (each message takes its share),
    /// which also admits each message's decoded size.
    pub account: Option<BodyAccount>,
    /// The stream metadata's trace context, every message's parent.
    pub trace_parent: Vec<(String, String)>,
    /// `triton_grpc_error: true`: errors close the stream with a status.
    pub errors_close: bool,
}

pub type Outbox = mpsc::Receiver<Result<ModelStreamInferResponse, Status>>;

/// Starts serving `incoming`; the responses come on the returned channel.
pub fn serve(context: StreamContext, incoming: Streaming<ModelInferRequest>) -> Outbox {
    let (tx, rx) = mpsc::channel(OUTBOX);
    // Messages are decoded where `incoming` is polled: in the reader.
    let allowance = context.account.as_ref().map(BodyAccount::allowance);
    tokio::spawn(with_call_allowance(allowance, read(context, incoming, tx)));
    rx
}

type Sender = mpsc::Sender<Result<ModelStreamInferResponse, Status>>;

async fn read(context: StreamContext, mut incoming: Streaming<ModelInferRequest>, tx: Sender) {
    let slots = Arc::new(Semaphore::new(DECOUPLED_IN_FLIGHT));
    let replies = Replies {
        tx,
        errors_close: context.errors_close,
    };
    loop {
        let message = tokio::select! {
            message = incoming.message() => message,
            // The client went away: nothing more to read or answer.
            () = replies.tx.closed() => return,
        };
        let message = match message {
            Ok(Some(message)) => message,
            // The client finished sending; running requests still answer.
            Ok(None) => return,
            // A message that cannot be read (one over a limit, one that does
            // not parse) ends the stream with its status: what follows it
            // cannot be trusted to be framed.
            Err(status) => {
                tracing::debug!(%status, "a ModelStreamInfer stream ended with an error");
                let _ = replies.tx.send(Err(status)).await;
                return;
            }
        };
        // Each message takes the bytes that arrived before it.
        let reservation = context.account.as_ref().map(BodyAccount::take).unwrap_or_default();
        let mut request = match convert::request(message) {
            Ok(request) => request,
            Err(e) => {
                if !replies.error(None, &e).await {
                    return;
                }
                continue;
            }
        };
        request.reservation = reservation;
        request.trace_parent = context.trace_parent.clone();
        let who = Who::of(&request);
        if !context.server.is_decoupled(&request.model_name, request.model_version) {
            let answered = match context.server.infer(request).await {
                Ok(response) => replies.send(with_final(convert::response(response), true)).await,
                Err(e) => replies.error(Some(&who), &e).await,
            };
            if !answered {
                return;
            }
            continue;
        }
        let empty_final = request.parameters.get(EMPTY_FINAL).and_then(Parameter::as_bool) == Some(true);
        let responses = match context.server.infer_stream(request) {
            Ok(responses) => responses,
            Err(e) => {
                if !replies.error(Some(&who), &e).await {
                    return;
                }
                continue;
            }
        };
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        let replies = replies.clone();
        tokio::spawn(async move {
            let _slot = slot;
            forward(responses, who, empty_final, &replies).await;
        });
    }
}

/// Sends a decoupled request's responses as they come; stops (cancelling
/// the request) as soon as the client has gone.
async fn forward(mut responses: ResponseStream, who: Who, empty_final: bool, replies: &Replies) {
    loop {
        let next = tokio::select! {
            next = responses.next() => next,
            () = replies.tx.closed() => return,
        };
        let sent = match next {
            Some(Ok(response)) => replies.send(with_final(convert::response(response), false)).await,
            Some(Err(e)) => {
                replies.error(Some(&who), &e).await;
                return;
            }
            None => break,
        };
        if !sent {
            return;
        }
    }
    if empty_final {
        let last = ModelInferResponse {
            model_name: who.model_name,
            model_version: responses.model_version().to_string(),
            id: who.id,
            ..ModelInferResponse::default()
        };
        replies.send(with_final(last, true)).await;
    }
}

/// Which request a response answers, for responses that carry no output.
struct Who {
    model_name: String,
    model_version: String,
    id: String,
}

impl Who {
    fn of(request: &InferRequest) -> Who {
        Who {
            model_name: request.model_name.clone(),
            model_version: request.model_version.map(|v| v.to_string()).unwrap_or_default(),
            id: request.id.clone(),
        }
    }
}

fn with_final(mut response: ModelInferResponse, last: bool) -> ModelInferResponse {
    response.parameters.insert(
        FINAL.to_string(),
        InferParameter {
            parameter_choice: Some(ParameterChoice::BoolParam(last)),
        },
    );
    response
}

/// The way back to the client, shared by every request of the stream.
#[derive(Clone)]
struct Replies {
    tx: Sender,
    errors_close: bool,
}

impl Replies {
    /// `false` when the client is gone.
    async fn send(&self, response: ModelInferResponse) -> bool {
        let reply = ModelStreamInferResponse {
            error_message: String::new(),
            infer_response: Some(response),
        };
        self.tx.send(Ok(reply)).await.is_ok()
    }

    /// Answers a request with an error: in-stream, or by ending the
    /// stream when the client asked for that. `false` when the stream is
    /// over.
    async fn error(&self, who: Option<&Who>, error: &Error) -> bool {
        if self.errors_close {
            let _ = self.tx.send(Err(to_status(error.clone()))).await;
            return false;
        }
        // The id lets a client with many requests in flight tell which
        // one failed; tritonclient reads only the message.
        let infer_response = who.map(|who| {
            with_final(
                ModelInferResponse {
                    model_name: who.model_name.clone(),
                    model_version: who.model_version.clone(),
                    id: who.id.clone(),
                    ..ModelInferResponse::default()
                },
                true,
            )
        });
        let reply = ModelStreamInferResponse {
            error_message: error.message().to_string(),
            infer_response,
        };
        self.tx.send(Ok(reply)).await.is_ok()
    }
}
