//! A generation's answer in OpenAI's shapes: server-sent chunks as the
//! model's responses come (`data: {...}` each, then the finish reason, the
//! usage when asked for and `data: [DONE]`), or one JSON answer at the end;
//! and its text generation metrics, counted once when it ends or its client
//! goes away.

use std::convert::Infallible;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use serde_json::json;

use super::error::OpenAiError;
use super::metrics::ModelTextMetrics;
use super::text_model::Piece;
use super::wire::Usage;
use crate::error::Result;
use crate::response::InferResponse;

/// Which endpoint: they differ only in their JSON.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Kind {
    Completion,
    Chat,
}

/// A request's progress: what its answer and its metrics need.
pub(super) struct Generation {
    id: String,
    kind: Kind,
    created: u64,
    model: String,
    include_usage: bool,
    reports_tokens: bool,
    max_tokens: Option<u32>,
    /// The text so far (a whole answer's; a stream's is sent as it comes).
    text: String,
    usage: Usage,
    /// Responses that carried text: the token count of a model that
    /// reports none (one token per response, as such models stream).
    pieces: u64,
    finish_reason: Option<String>,
    started: Instant,
    /// When the last text came.
    last: Option<Instant>,
    metrics: ModelTextMetrics,
    /// Whether its tokens are in the metrics yet.
    counted: bool,
}

impl Generation {
    /// A request `id` for `model` about to run; `max_tokens` as asked (the
    /// finish reason is `length` when it is reached), `reports_tokens` when
    /// the model counts tokens itself, `include_usage` when a stream ends
    /// with the usage.
    pub(super) fn new(
        id: String,
        kind: Kind,
        model: String,
        max_tokens: Option<u32>,
        reports_tokens: bool,
        include_usage: bool,
        metrics: ModelTextMetrics,
    ) -> Generation {
        Generation {
            id,
            kind,
            created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
            model,
            include_usage,
            reports_tokens,
            max_tokens,
            text: String::new(),
            usage: Usage::default(),
            pieces: 0,
            finish_reason: None,
            started: Instant::now(),
            last: None,
            metrics,
            counted: false,
        }
    }

    /// Takes one response; the text it added.
    fn take(&mut self, piece: Piece) -> String {
        if let Some(n) = piece.input_tokens {
            self.usage.prompt_tokens = n;
        }
        if piece.finish_reason.is_some() {
            self.finish_reason = piece.finish_reason;
        }
        let tokens = piece.output_tokens.unwrap_or(u64::from(!piece.text.is_empty()));
        self.usage.completion_tokens += piece.output_tokens.unwrap_or(0);
        if !piece.text.is_empty() {
            self.pieces += 1;
            let now = Instant::now();
            match self.last {
                None => self.metrics.first_token(now - self.started),
                Some(last) => self.metrics.next_tokens(now - last, tokens),
            }
            self.last = Some(now);
        }
        piece.text
    }

    fn usage(&self) -> Option<Usage> {
        self.reports_tokens.then_some(Usage {
            total_tokens: self.usage.prompt_tokens + self.usage.completion_tokens,
            ..self.usage
        })
    }

    /// Why it ended: the model's word, else `length` when it produced
    /// `max_tokens`, else `stop`.
    fn finish_reason(&self) -> String {
        if let Some(reason) = &self.finish_reason {
            return reason.clone();
        }
        let produced = match self.reports_tokens {
            true => self.usage.completion_tokens,
            false => self.pieces,
        };
        match self.max_tokens {
            Some(max) if produced >= u64::from(max) => "length".to_string(),
            _ => "stop".to_string(),
        }
    }

    /// Counts the request's tokens in the metrics, once: when it ends, or
    /// when its client goes away (the stream is dropped).
    fn finish(&mut self) {
        if std::mem::replace(&mut self.counted, true) {
            return;
        }
        let generated = match self.reports_tokens {
            true => self.usage.completion_tokens,
            false => self.pieces,
        };
        self.metrics.finished(self.usage.prompt_tokens, generated);
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    /// One stream chunk: `text`, or the end with its reason.
    fn chunk(&self, text: &str, finish_reason: Option<&str>) -> serde_json::Value {
        let choice = match self.kind {
            Kind::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish_reason}),
            Kind::Chat => {
                let delta = match (self.pieces, finish_reason) {
                    (_, Some(_)) => json!({}),
                    (1, None) => json!({"role": "assistant", "content": text}),
                    _ => json!({"content": text}),
                };
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish_reason})
            }
        };
        let mut chunk = json!({
            "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
            "choices": [choice],
        });
        if self.include_usage {
            chunk["usage"] = serde_json::Value::Null;
        }
        chunk
    }

    /// The last events: the finish reason, the usage when asked for, `[DONE]`.
    fn end(&mut self) -> Bytes {
        self.finish();
        let mut out = event(&self.chunk("", Some(&self.finish_reason())));
        if self.include_usage {
            let usage = json!({
                "id": self.id, "object": self.object(true), "created": self.created, "model": self.model,
                "choices": [], "usage": self.usage(),
            });
            out.extend_from_slice(&event(&usage));
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        Bytes::from(out)
    }

    /// The whole answer.
    fn answer(&mut self) -> serde_json::Value {
        self.finish();
        let reason = self.finish_reason();
        let choice = match self.kind {
            Kind::Completion => json!({"index": 0, "text": self.text, "logprobs": null, "finish_reason": reason}),
            Kind::Chat => json!({
                "index": 0, "message": {"role": "assistant", "content": self.text},
                "logprobs": null, "finish_reason": reason,
            }),
        };
        json!({
            "id": self.id, "object": self.object(false), "created": self.created, "model": self.model,
            "choices": [choice], "usage": self.usage(),
        })
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The stream's events: a chunk per response with text, then the end; an
/// error ends it with OpenAI's error object as the last event.
pub(super) fn stream(
    responses: BoxStream<'static, Result<InferResponse>>,
    generation: Generation,
) -> impl Stream<Item = std::result::Result<Bytes, Infallible>> + Send + 'static {
    futures::stream::unfold(Some((responses, generation)), |state| async move {
        let (mut responses, mut generation) = state?;
        loop {
            let piece = match responses.next().await {
                None => return Some((Ok(generation.end()), None)),
                Some(response) => response.and_then(|r| Piece::of(&r)),
            };
            match piece {
                Ok(piece) => {
                    let text = generation.take(piece);
                    if !text.is_empty() {
                        let chunk = Bytes::from(event(&generation.chunk(&text, None)));
                        return Some((Ok(chunk), Some((responses, generation))));
                    }
                }
                Err(e) => {
                    let error = OpenAiError::from(e).body();
                    return Some((Ok(Bytes::from(event(&error))), None));
                }
            }
        }
    })
}

/// Every response, then one answer.
pub(super) async fn whole(
    mut responses: BoxStream<'static, Result<InferResponse>>,
    mut generation: Generation,
) -> Result<serde_json::Value> {
    while let Some(response) = responses.next().await {
        let text = generation.take(Piece::of(&response?)?);
        generation.text.push_str(&text);
    }
    Ok(generation.answer())
}

fn event(json: &serde_json::Value) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, json).expect("a JSON value serializes");
    out.extend_from_slice(b"\n\n");
    out
}
