//! Text generation metrics, per model, beside the server's own on the
//! metrics port. Named as vLLM names them, under `nv_llm_` instead of
//! `vllm:` (a vLLM model.py registers the `vllm:` families itself, through
//! pb_utils, in the same registry): a dashboard built for vLLM's carries
//! over by its prefix.

use std::time::Duration;

use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

/// The families, registered once per server.
pub struct TextMetrics {
    time_to_first_token: HistogramVec,
    inter_token_latency: HistogramVec,
    prompt_tokens: IntCounterVec,
    generation_tokens: IntCounterVec,
}

/// Latency buckets, in seconds: from a millisecond to a minute.
const BUCKETS: [f64; 16] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 60.0,
];

impl TextMetrics {
    /// The families, in `registry`; in a registry of their own (counted,
    /// not exported) if it refuses them, which it does only when they are
    /// already there.
    pub fn new(registry: &Registry) -> TextMetrics {
        Self::register(registry).unwrap_or_else(|e| {
            tracing::warn!(error = %e, "the text generation metrics could not be registered; they are not exported");
            Self::register(&Registry::new()).expect("a new registry takes them")
        })
    }

    fn register(registry: &Registry) -> prometheus::Result<TextMetrics> {
        let labels = ["model", "version"];
        let histogram = |name: &str, help: &str| {
            let family = HistogramVec::new(HistogramOpts::new(name, help).buckets(BUCKETS.to_vec()), &labels)?;
            registry.register(Box::new(family.clone()))?;
            Ok::<_, prometheus::Error>(family)
        };
        let counter = |name: &str, help: &str| {
            let family = IntCounterVec::new(Opts::new(name, help), &labels)?;
            registry.register(Box::new(family.clone()))?;
            Ok::<_, prometheus::Error>(family)
        };
        Ok(TextMetrics {
            time_to_first_token: histogram(
                "nv_llm_time_to_first_token_seconds",
                "Time from an OpenAI API request to its first generated text, in seconds",
            )?,
            inter_token_latency: histogram(
                "nv_llm_inter_token_latency_seconds",
                "Time between generated tokens of an OpenAI API request, in seconds",
            )?,
            prompt_tokens: counter(
                "nv_llm_prompt_tokens_total",
                "Prompt tokens of OpenAI API requests, as the model counted them",
            )?,
            generation_tokens: counter(
                "nv_llm_generation_tokens_total",
                "Tokens generated for OpenAI API requests",
            )?,
        })
    }

    /// The series of one model version.
    pub fn for_model(&self, model: &str, version: i64) -> ModelTextMetrics {
        let version = version.to_string();
        let labels = [model, version.as_str()];
        ModelTextMetrics {
            time_to_first_token: self.time_to_first_token.with_label_values(&labels),
            inter_token_latency: self.inter_token_latency.with_label_values(&labels),
            prompt_tokens: self.prompt_tokens.with_label_values(&labels),
            generation_tokens: self.generation_tokens.with_label_values(&labels),
        }
    }
}

/// One model version's series, taken once per request.
pub struct ModelTextMetrics {
    time_to_first_token: prometheus::Histogram,
    inter_token_latency: prometheus::Histogram,
    prompt_tokens: prometheus::IntCounter,
    generation_tokens: prometheus::IntCounter,
}

impl ModelTextMetrics {
    pub fn first_token(&self, after: Duration) {
        self.time_to_first_token.observe(after.as_secs_f64());
    }

    /// `tokens` more came `after` the last ones: each took its share.
    pub fn next_tokens(&self, after: Duration, tokens: u64) {
        let each = after.as_secs_f64() / tokens.max(1) as f64;
        for _ in 0..tokens.clamp(1, 64) {
            self.inter_token_latency.observe(each);
        }
    }

    pub fn finished(&self, prompt_tokens: u64, generated: u64) {
        self.prompt_tokens.inc_by(prompt_tokens);
        self.generation_tokens.inc_by(generated);
    }
}
