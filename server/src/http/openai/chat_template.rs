//! Chat messages to a prompt, with the model's chat template as the
//! Hugging Face tooling renders it: a Jinja template (minijinja, with its
//! Python-compatible methods) given `messages`, `add_generation_prompt`
//! and the tokenizer's `bos_token` and `eos_token`.
//!
//! The template is the model folder's `chat_template.jinja`, else the
//! `chat_template` of its `tokenizer_config.json` (a string, or a list of
//! named templates of which `default` is taken); a model with neither gets
//! [`DEFAULT_TEMPLATE`]. [`ChatTemplates`] reads and compiles it once per
//! loaded model.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Weak};

use minijinja::{Environment, context};
use parking_lot::Mutex;
use serde::Deserialize;

use super::wire::ChatMessage;
use crate::error::{Error, Result};
use crate::model::Model;

/// Each message as `<|role|>` on its line and its content on the next,
/// then `<|assistant|>` to prompt the answer.
pub const DEFAULT_TEMPLATE: &str = "{% for message in messages %}<|{{ message.role }}|>\n{{ message.content }}\n\
                                    {% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

/// The largest template file read: a bound on what a request makes the
/// server read and compile.
const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

/// The template's name in its environment.
const NAME: &str = "chat_template";

/// A model's chat template, compiled, and the special tokens it may use.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

/// `tokenizer_config.json`, what of it a template needs.
#[derive(Deserialize)]
struct TokenizerConfig {
    chat_template: Option<TemplateField>,
    bos_token: Option<Token>,
    eos_token: Option<Token>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum TemplateField {
    One(String),
    Named(Vec<NamedTemplate>),
}

#[derive(Deserialize)]
struct NamedTemplate {
    name: String,
    template: String,
}

/// A special token: its text, or an object with it as `content`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Token {
    Text(String),
    Added { content: String },
}

impl Token {
    fn text(self) -> String {
        match self {
            Token::Text(text) | Token::Added { content: text } => text,
        }
    }
}

impl ChatTemplate {
    /// The template of the model in `dir`, compiled.
    pub fn of_model(dir: &Path) -> Result<ChatTemplate> {
        let mut source = DEFAULT_TEMPLATE.to_string();
        let (mut bos_token, mut eos_token) = (String::new(), String::new());
        if let Some(text) = read(&dir.join("tokenizer_config.json"))? {
            let config: TokenizerConfig = serde_json::from_str(&text)
                .map_err(|e| Error::invalid(format!("the model's tokenizer_config.json is not valid: {e}")))?;
            bos_token = config.bos_token.map(Token::text).unwrap_or_default();
            eos_token = config.eos_token.map(Token::text).unwrap_or_default();
            match config.chat_template {
                Some(TemplateField::One(one)) => source = one,
                Some(TemplateField::Named(named)) => {
                    if let Some(default) = named.into_iter().find(|t| t.name == "default") {
                        source = default.template;
                    }
                }
                None => {}
            }
        }
        if let Some(file) = read(&dir.join("chat_template.jinja"))? {
            source = file;
        }
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<String, minijinja::Error> {
                Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source)
            .map_err(|e| Error::invalid(format!("the model's chat template does not compile: {e}")))?;
        Ok(ChatTemplate {
            env,
            bos_token,
            eos_token,
        })
    }

    /// The prompt for `messages`.
    pub fn render(&self, messages: &[ChatMessage]) -> Result<String> {
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| Error::internal(format!("the chat template is gone from its environment: {e}")))?;
        template
            .render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => self.bos_token,
                eos_token => self.eos_token,
            })
            .map_err(|e| Error::invalid(format!("the model's chat template failed on these messages: {e}")))
    }
}

/// The loaded models' chat templates, each read from its model's folder
/// and compiled once, off the runtime: a loaded model's files do not change
/// under it, and a reload makes a new [`Model`], which misses the cache and
/// is read afresh. The entries of models no longer loaded go when another
/// is added, so there is at most one per loaded model. A template that
/// fails is not kept: each request says why, and a fixed model reloads.
#[derive(Default)]
pub struct ChatTemplates {
    /// By the model's address, which its `Weak` keeps from being reused.
    loaded: Mutex<HashMap<usize, Cached>>,
}

/// One loaded model's template.
struct Cached {
    model: Weak<Model>,
    template: Arc<ChatTemplate>,
}

impl ChatTemplates {
    /// `model`'s template.
    pub async fn of(&self, model: &Arc<Model>) -> Result<Arc<ChatTemplate>> {
        let key = Arc::as_ptr(model) as usize;
        if let Some(cached) = self.loaded.lock().get(&key) {
            return Ok(Arc::clone(&cached.template));
        }
        let dir = model.dir().to_path_buf();
        let template = tokio::task::spawn_blocking(move || ChatTemplate::of_model(&dir))
            .await
            .map_err(|e| Error::internal(format!("reading the chat template failed: {e}")))??;
        let template = Arc::new(template);
        let mut loaded = self.loaded.lock();
        loaded.retain(|_, cached| cached.model.strong_count() > 0);
        let cached = Cached {
            model: Arc::downgrade(model),
            template: Arc::clone(&template),
        };
        loaded.insert(key, cached);
        Ok(template)
    }
}

/// A file's text, `None` when there is none; bounded in size.
fn read(path: &Path) -> Result<Option<String>> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::internal(format!("cannot read {}: {e}", path.display()))),
        Ok(m) if m.len() > MAX_TEMPLATE_BYTES => {
            return Err(Error::invalid(format!(
                "{} is {} bytes, over the {MAX_TEMPLATE_BYTES}-byte limit of a chat template",
                path.display(),
                m.len()
            )));
        }
        Ok(_) => {}
    }
    std::fs::read_to_string(path)
        .map(Some)
        .map_err(|e| Error::internal(format!("cannot read {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn messages() -> Vec<ChatMessage> {
        vec![
            ChatMessage {
                role: "system".into(),
                content: "Be brief.".into(),
            },
            ChatMessage {
                role: "user".into(),
                content: "Hi".into(),
            },
        ]
    }

    #[test]
    fn the_default_template_and_a_tokenizer_configs_template_render() {
        let dir = tempfile::tempdir().unwrap();
        let default = ChatTemplate::of_model(dir.path()).unwrap();
        assert_eq!(
            default.render(&messages()).unwrap(),
            "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\n"
        );

        // Hugging Face's form: Python string methods, special tokens, raise_exception.
        let config = serde_json::json!({
            "bos_token": {"content": "<s>"},
            "eos_token": "</s>",
            "chat_template": "{{ bos_token }}{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role') }}{% endif %}[{{ m.role.upper() }}] {{ m.content.strip() }}{{ eos_token }}{% endfor %}",
        });
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        let template = ChatTemplate::of_model(dir.path()).unwrap();
        assert_eq!(
            template.render(&messages()).unwrap(),
            "<s>[SYSTEM] Be brief.</s>[USER] Hi</s>"
        );
        let odd = vec![ChatMessage {
            role: "robot".into(),
            content: "x".into(),
        }];
        assert!(template.render(&odd).unwrap_err().message().contains("bad role"));

        // A chat_template.jinja file wins.
        std::fs::write(dir.path().join("chat_template.jinja"), "{{ messages[-1].content }}!").unwrap();
        assert_eq!(
            ChatTemplate::of_model(dir.path()).unwrap().render(&messages()).unwrap(),
            "Hi!"
        );
        std::fs::write(dir.path().join("chat_template.jinja"), "{% for %}").unwrap();
        let broken = ChatTemplate::of_model(dir.path())
            .err()
            .expect("a template that does not compile");
        assert!(broken.message().contains("does not compile"), "{}", broken.message());
    }
}
