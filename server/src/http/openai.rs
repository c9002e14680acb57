//! The OpenAI-compatible API on the HTTP port, for text models
//! ([`text_model`]): `GET /v1/models` (and `/v1/models/{id}`),
//! `POST /v1/completions` and `POST /v1/chat/completions`, streamed as server-sent events in OpenAI's
//! chunk format (ending with `data: [DONE]`) or answered once.
//!
//! A request becomes one inference request of the model (chat messages
//! rendered to a prompt by the model's chat template first), and its
//! responses become the answer: each response's text is one chunk. A
//! client that goes away drops the stream, which cancels the request in the
//! model. Errors are OpenAI's error object with the status the core's error
//! kind maps to.

mod chat_template;
mod metrics;
mod text_model;
mod wire;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde::de::DeserializeOwned;
use serde_json::json;

use self::chat_template::ChatTemplate;
use self::text_model::{Params, Piece, TextModel};
use self::wire::{ChatRequest, CompletionRequest, ErrorBody, ModelEntry, Sampling, Usage};
use super::{AppState, body};
use crate::error::{Error, ErrorKind, Result};
use crate::response::InferResponse;

pub(super) use self::metrics::TextMetrics;

/// The routes, under the HTTP port's inference API group.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
}

/// An error as OpenAI's JSON: `{"error": {"message", "type", "param", "code"}}`.
pub(super) struct OpenAiError {
    error: Error,
    param: Option<&'static str>,
}

impl From<Error> for OpenAiError {
    fn from(error: Error) -> Self {
        OpenAiError { error, param: None }
    }
}

impl OpenAiError {
    fn about(param: &'static str, error: Error) -> Self {
        OpenAiError {
            error,
            param: Some(param),
        }
    }

    fn body(&self) -> serde_json::Value {
        let (kind, code) = match self.error.kind() {
            ErrorKind::NotFound => ("invalid_request_error", Some("model_not_found")),
            ErrorKind::InvalidArgument | ErrorKind::AlreadyExists | ErrorKind::Unsupported => {
                ("invalid_request_error", None)
            }
            ErrorKind::Unavailable | ErrorKind::NotServing | ErrorKind::ResourceExhausted => {
                ("server_error", Some("unavailable"))
            }
            ErrorKind::PermissionDenied => ("permission_error", None),
            ErrorKind::Internal => ("server_error", None),
        };
        json!({ "error": ErrorBody { message: self.error.message(), kind, param: self.param, code } })
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        // An unsupported field is the client's mistake here, not a 501.
        let status = match self.error.kind() {
            ErrorKind::Unsupported => StatusCode::BAD_REQUEST,
            kind => super::error::status(kind),
        };
        (status, axum::Json(self.body())).into_response()
    }
}

type OpenAiResult = std::result::Result<Response, OpenAiError>;

/// `GET /v1/models`: the ready text models.
async fn models(State(s): State<AppState>) -> Response {
    let mut data: Vec<ModelEntry> = Vec::new();
    for model in s.server.manager().ready_models() {
        if TextModel::of(model.config()).is_ok() && data.last().is_none_or(|m| m.id != model.name()) {
            data.push(entry(model.name()));
        }
    }
    axum::Json(json!({ "object": "list", "data": data })).into_response()
}

/// `GET /v1/models/{id}`: one ready text model.
async fn model(State(s): State<AppState>, Path(id): Path<String>) -> OpenAiResult {
    let model = find(&s, &id)?;
    Ok(axum::Json(entry(model.name())).into_response())
}

fn entry(name: &str) -> ModelEntry {
    ModelEntry {
        id: name.to_string(),
        object: "model",
        created: 0,
        owned_by: "nereid",
    }
}

/// `POST /v1/completions`.
async fn completions(State(s): State<AppState>, headers: HeaderMap, body: Body) -> OpenAiResult {
    let request: CompletionRequest = read_json(&s, &headers, body).await?;
    let unsupported = [
        ("echo", request.echo),
        ("best_of", request.best_of.is_some_and(|n| n > 1)),
        ("suffix", request.suffix.is_some()),
    ];
    if let Some((field, _)) = unsupported.into_iter().find(|(_, set)| *set) {
        return Err(OpenAiError::about(
            field,
            Error::invalid(format!("'{field}' is not supported by this server")),
        ));
    }
    let mut prompts = request.prompt.into_vec();
    if prompts.len() != 1 {
        return Err(OpenAiError::about(
            "prompt",
            Error::invalid("'prompt' must be one string: batches of prompts are not supported"),
        ));
    }
    let prompt = prompts.pop().expect("one prompt");
    let model = find(&s, &request.model)?;
    generate(&s, Kind::Completion, &model, prompt, request.sampling).await
}

/// `POST /v1/chat/completions`.
async fn chat_completions(State(s): State<AppState>, headers: HeaderMap, body: Body) -> OpenAiResult {
    let request: ChatRequest = read_json(&s, &headers, body).await?;
    if request.tools.is_some() {
        return Err(OpenAiError::about(
            "tools",
            Error::invalid("'tools' is not supported by this server"),
        ));
    }
    if request.messages.is_empty() {
        return Err(OpenAiError::about("messages", Error::invalid("'messages' is empty")));
    }
    let model = find(&s, &request.model)?;
    let dir = model.dir().to_path_buf();
    let messages = request.messages;
    // A template is a file or two in the model's folder: read off the runtime.
    let prompt = tokio::task::spawn_blocking(move || ChatTemplate::of_model(&dir)?.render(&messages))
        .await
        .map_err(|e| Error::internal(format!("rendering the chat template failed: {e}")))??;
    generate(&s, Kind::Chat, &model, prompt, request.sampling).await
}

/// The request body as `T`, within the port's body limits.
async fn read_json<T: DeserializeOwned>(s: &AppState, headers: &HeaderMap, body: Body) -> Result<T> {
    let mut reservation = s.options.budget.reservation();
    let received = body::receive(body, headers, s.options.body, &mut reservation).await?;
    let body = received.inflate(s.options.body, &mut reservation)?;
    serde_json::from_slice(&body).map_err(|e| Error::invalid(format!("the request body is not a valid request: {e}")))
}

/// The ready model `name`, as a text model.
fn find(s: &AppState, name: &str) -> std::result::Result<Arc<crate::model::Model>, OpenAiError> {
    let model = s.server.model(name, "").map_err(|e| match e.kind() {
        ErrorKind::NotFound => OpenAiError::about(
            "model",
            Error::new(ErrorKind::NotFound, format!("The model '{name}' does not exist")),
        ),
        _ => OpenAiError::from(e),
    })?;
    TextModel::of(model.config()).map_err(not_text)?;
    Ok(model)
}

fn not_text(why: String) -> OpenAiError {
    OpenAiError::about("model", Error::invalid(why))
}

/// Which endpoint: they differ only in their JSON.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Completion,
    Chat,
}

/// Runs `prompt` on the model and answers, streamed or whole.
async fn generate(
    s: &AppState,
    kind: Kind,
    model: &crate::model::Model,
    prompt: String,
    sampling: Sampling,
) -> OpenAiResult {
    if sampling
        .logprobs
        .as_ref()
        .is_some_and(|v| !v.is_null() && v != &json!(false))
        || sampling.top_logprobs.is_some()
    {
        return Err(OpenAiError::about(
            "logprobs",
            Error::invalid("'logprobs' is not supported by this server"),
        ));
    }
    if sampling.n.is_some_and(|n| n != 1) {
        return Err(OpenAiError::about(
            "n",
            Error::invalid("'n' must be 1: one choice per request"),
        ));
    }
    let text = TextModel::of(model.config()).map_err(not_text)?;
    let params = Params {
        max_tokens: sampling.max_tokens.or(sampling.max_completion_tokens),
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        stop: sampling.stop.map(wire::OneOrMany::into_vec).unwrap_or_default(),
        seed: sampling.seed,
        n: sampling.n,
    };
    let id = format!(
        "{}-{:032x}",
        match kind {
            Kind::Completion => "cmpl",
            Kind::Chat => "chatcmpl",
        },
        rand_id()
    );
    let mut request = text.request(id.clone(), &prompt, &params, sampling.stream)?;
    request.model_version = Some(model.version());
    let responses: BoxStream<'static, Result<InferResponse>> = if model.is_decoupled() {
        s.server.infer_stream(request)?.boxed()
    } else {
        let server = Arc::clone(&s.server);
        futures::stream::once(async move { server.infer(request).await }).boxed()
    };
    let generation = Generation {
        id,
        kind,
        created: SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()),
        model: model.name().to_string(),
        include_usage: sampling.stream_options.is_some_and(|o| o.include_usage),
        reports_tokens: text.reports_tokens(),
        max_tokens: params.max_tokens,
        text: String::new(),
        usage: Usage::default(),
        pieces: 0,
        finish_reason: None,
        started: Instant::now(),
        last: None,
        metrics: s.text_metrics.for_model(model.name(), model.version()),
        counted: false,
    };
    if sampling.stream {
        let events = stream(responses, generation);
        return Ok((
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream; charset=utf-8"),
            )],
            Body::from_stream(events),
        )
            .into_response());
    }
    whole(responses, generation).await
}

/// A request's progress: what its answer and its metrics need.
struct Generation {
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
    metrics: metrics::ModelTextMetrics,
    /// Whether its tokens are in the metrics yet.
    counted: bool,
}

impl Generation {
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
fn stream(
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
async fn whole(mut responses: BoxStream<'static, Result<InferResponse>>, mut generation: Generation) -> OpenAiResult {
    while let Some(response) = responses.next().await {
        let text = generation.take(Piece::of(&response?)?);
        generation.text.push_str(&text);
    }
    Ok(axum::Json(generation.answer()).into_response())
}

fn event(json: &serde_json::Value) -> Vec<u8> {
    let mut out = b"data: ".to_vec();
    serde_json::to_writer(&mut out, json).expect("a JSON value serializes");
    out.extend_from_slice(b"\n\n");
    out
}

/// A request id's random part: unique enough to tell requests apart in
/// logs (the clock and a counter, mixed).
fn rand_id() -> u128 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let count = u128::from(COUNTER.fetch_add(1, Ordering::Relaxed));
    (nanos ^ (count << 64) ^ count).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
}
