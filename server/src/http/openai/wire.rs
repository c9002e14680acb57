//! The OpenAI API's JSON: the requests as clients send them (fields this
//! server cannot honour are refused by name, the rest of what the `openai`
//! SDKs send is accepted and ignored), the answers and stream chunks as the
//! SDKs parse them, and OpenAI's error object.

use serde::{Deserialize, Serialize};

/// A string or a list of strings (`prompt`, `stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

/// What both endpoints share: the sampling and the stream.
#[derive(Debug, Default, Deserialize)]
pub struct Sampling {
    pub max_tokens: Option<u32>,
    /// The chat endpoint's newer name for `max_tokens`.
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub n: Option<u32>,
    pub stop: Option<OneOrMany>,
    pub seed: Option<u64>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    /// Refused when set: this server returns no log probabilities.
    pub logprobs: Option<serde_json::Value>,
    pub top_logprobs: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// `POST /v1/completions`.
#[derive(Debug, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: OneOrMany,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(default)]
    pub echo: bool,
    pub best_of: Option<u32>,
    pub suffix: Option<String>,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: Sampling,
    /// Refused when set: a text model has no tools.
    pub tools: Option<serde_json::Value>,
}

/// One message: its role and its text (a string, or the SDKs' list of
/// `{"type": "text", "text": ...}` parts).
#[derive(Debug, Deserialize, Serialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(deserialize_with = "content_text", default)]
    pub content: String,
}

fn content_text<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<String, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Content {
        Text(String),
        Parts(Vec<Part>),
        Null(()),
    }
    #[derive(Deserialize)]
    struct Part {
        #[serde(rename = "type")]
        kind: String,
        #[serde(default)]
        text: String,
    }
    match Content::deserialize(deserializer)? {
        Content::Text(text) => Ok(text),
        Content::Null(()) => Ok(String::new()),
        Content::Parts(parts) => {
            let mut text = String::new();
            for part in parts {
                if part.kind != "text" {
                    return Err(serde::de::Error::custom(format!(
                        "message content of type '{}' is not supported: only text",
                        part.kind
                    )));
                }
                text.push_str(&part.text);
            }
            Ok(text)
        }
    }
}

/// Token counts, when the model reports them.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
}

/// `GET /v1/models`'s entries, and `GET /v1/models/{id}`'s answer.
#[derive(Debug, Serialize)]
pub struct ModelEntry {
    pub id: String,
    pub object: &'static str,
    pub created: u64,
    pub owned_by: &'static str,
}

/// OpenAI's error object, under `"error"`.
#[derive(Debug, Serialize)]
pub struct ErrorBody<'a> {
    pub message: &'a str,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub param: Option<&'a str>,
    pub code: Option<&'a str>,
}
