//! The OpenAI-compatible API on the HTTP port, for text models
//! ([`text_model`]): `GET /v1/models` (and `/v1/models/{id}`),
//! `POST /v1/completions` and `POST /v1/chat/completions`, streamed as server-sent events in OpenAI's
//! chunk format (ending with `data: [DONE]`) or answered once.
//!
//! A request becomes one inference request of the model (chat messages
//! rendered to a prompt by the model's chat template first), and its
//! responses become the answer: each response's text is one chunk. A
//! client that goes away drops the stream, which cancels the request in the
//! model. Errors are OpenAI's error object ([`error`]); the answer's
//! shapes are [`answer`]'s.

mod answer;
mod chat_template;
mod error;
mod metrics;
mod text_model;
mod wire;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::StreamExt;
use futures::stream::BoxStream;
use http::{HeaderMap, HeaderValue, header};
use serde::de::DeserializeOwned;
use serde_json::json;

use self::answer::{Generation, Kind};
use self::chat_template::ChatTemplates;
use self::error::OpenAiError;
use self::metrics::TextMetrics;
use self::text_model::{Params, TextModel};
use self::wire::{ChatRequest, CompletionRequest, ModelEntry, Sampling};
use super::{AppState, body};
use crate::error::{Error, ErrorKind, Result};
use crate::response::InferResponse;

/// What the front end keeps across requests: its metrics and the loaded
/// models' chat templates.
pub(super) struct OpenAi {
    metrics: TextMetrics,
    templates: ChatTemplates,
}

impl OpenAi {
    pub(super) fn new(registry: &prometheus::Registry) -> OpenAi {
        OpenAi {
            metrics: TextMetrics::new(registry),
            templates: ChatTemplates::default(),
        }
    }
}

/// The routes, under the HTTP port's inference API group.
pub(super) fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/models", get(models))
        .route("/v1/models/{*id}", get(model))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
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
    let prompt = s.openai.templates.of(&model).await?.render(&request.messages)?;
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
    let generation = Generation::new(
        id,
        kind,
        model.name().to_string(),
        params.max_tokens,
        text.reports_tokens(),
        sampling.stream_options.is_some_and(|o| o.include_usage),
        s.openai.metrics.for_model(model.name(), model.version()),
    );
    if sampling.stream {
        let events = answer::stream(responses, generation);
        return Ok((
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream; charset=utf-8"),
            )],
            Body::from_stream(events),
        )
            .into_response());
    }
    Ok(axum::Json(answer::whole(responses, generation).await?).into_response())
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
