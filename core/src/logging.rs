//! Logs through `tracing`, with Triton's settings, changeable while running.
//!
//! Triton's flags (`--log-info`, `--log-warning`, `--log-error`,
//! `--log-verbose`, `--log-format`) set a [`LogControl`]; its settings are
//! atomics read by the subscriber's filter on every event, so `/v2/logging`
//! and gRPC `LogSettings` change what is logged at once, without a restart.
//! Severities are switched independently, as in Triton; verbose levels 1
//! and 2 add the server's own debug and trace events (dependencies stay at
//! warnings). Text and JSON are two formatting layers, each enabled only
//! while its format is chosen. `RUST_LOG`, when set, narrows further.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use tracing::Level;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

use crate::error::{Error, Result};
use crate::parameter::Parameter;

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines with an ISO 8601 time (Triton's "default" and "ISO8601").
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl LogFormat {
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "default" | "ISO8601" | "text" => Some(LogFormat::Text),
            "json" => Some(LogFormat::Json),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            LogFormat::Text => "default",
            LogFormat::Json => "json",
        }
    }
}

/// A consistent copy of the settings, as the logging API reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSettings {
    pub info: bool,
    pub warning: bool,
    pub error: bool,
    pub verbose_level: u32,
    pub format: LogFormat,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            info: true,
            warning: true,
            error: true,
            verbose_level: 0,
            format: LogFormat::Text,
        }
    }
}

/// The live settings.
#[derive(Debug)]
pub struct LogControl {
    info: AtomicBool,
    warning: AtomicBool,
    error: AtomicBool,
    verbose_level: AtomicU32,
    json: AtomicBool,
    /// Serialises updates (a reader never sees half of one, and two never
    /// interleave).
    updates: parking_lot::Mutex<()>,
}

impl LogControl {
    pub fn new(settings: &LogSettings) -> Arc<Self> {
        Arc::new(LogControl {
            info: AtomicBool::new(settings.info),
            warning: AtomicBool::new(settings.warning),
            error: AtomicBool::new(settings.error),
            verbose_level: AtomicU32::new(settings.verbose_level),
            json: AtomicBool::new(settings.format == LogFormat::Json),
            updates: parking_lot::Mutex::new(()),
        })
    }

    pub fn settings(&self) -> LogSettings {
        let _guard = self.updates.lock();
        self.current()
    }

    /// The settings as stored; the caller holds `updates`.
    fn current(&self) -> LogSettings {
        LogSettings {
            info: self.info.load(Ordering::Relaxed),
            warning: self.warning.load(Ordering::Relaxed),
            error: self.error.load(Ordering::Relaxed),
            verbose_level: self.verbose_level.load(Ordering::Relaxed),
            format: if self.json.load(Ordering::Relaxed) {
                LogFormat::Json
            } else {
                LogFormat::Text
            },
        }
    }

    /// Applies changes by Triton's keys. Every change is checked first: one
    /// bad key or value changes nothing and names itself in the error. The
    /// whole update holds `updates`, so two at once cannot undo each other.
    pub fn update(&self, changes: &[(String, Parameter)]) -> Result<LogSettings> {
        let guard = self.updates.lock();
        let mut next = self.current();
        for (key, value) in changes {
            let flag = || {
                value
                    .as_bool()
                    .ok_or_else(|| Error::invalid(format!("log setting '{key}' must be a boolean, got {value:?}")))
            };
            match key.as_str() {
                "log_info" => next.info = flag()?,
                "log_warning" => next.warning = flag()?,
                "log_error" => next.error = flag()?,
                "log_verbose_level" => {
                    next.verbose_level = value.as_i64().and_then(|v| u32::try_from(v).ok()).ok_or_else(|| {
                        Error::invalid(format!(
                            "log setting 'log_verbose_level' must be a non-negative integer, got {value:?}"
                        ))
                    })?;
                }
                "log_format" => {
                    let text = value.as_str().ok_or_else(|| {
                        Error::invalid(format!("log setting 'log_format' must be a string, got {value:?}"))
                    })?;
                    next.format = LogFormat::parse(text).ok_or_else(|| {
                        Error::invalid(format!(
                            "log setting 'log_format' must be 'default', 'ISO8601' or 'json', got '{text}'"
                        ))
                    })?;
                }
                "log_file" => match value.as_str() {
                    Some("") => {}
                    Some(_) => {
                        return Err(Error::unsupported(
                            "log setting 'log_file' is not supported: the server logs to standard error",
                        ));
                    }
                    None => return Err(Error::invalid("log setting 'log_file' must be a string")),
                },
                _ => return Err(Error::invalid(format!("unknown log setting '{key}'"))),
            }
        }
        self.info.store(next.info, Ordering::Relaxed);
        self.warning.store(next.warning, Ordering::Relaxed);
        self.error.store(next.error, Ordering::Relaxed);
        self.verbose_level.store(next.verbose_level, Ordering::Relaxed);
        self.json.store(next.format == LogFormat::Json, Ordering::Relaxed);
        drop(guard);
        // Callsites cache whether they are enabled; make them ask again.
        tracing::callsite::rebuild_interest_cache();
        Ok(next)
    }

    /// Whether an event at `level` from `target` is logged now.
    fn enabled(&self, level: Level, target: &str) -> bool {
        let ours = target.starts_with("nereid");
        match level {
            Level::ERROR => self.error.load(Ordering::Relaxed),
            Level::WARN => self.warning.load(Ordering::Relaxed),
            // ONNX Runtime logs every optimisation pass at INFO.
            Level::INFO => self.info.load(Ordering::Relaxed) && (ours || !target.starts_with("ort")),
            Level::DEBUG => ours && self.verbose_level.load(Ordering::Relaxed) >= 1,
            Level::TRACE => ours && self.verbose_level.load(Ordering::Relaxed) >= 2,
        }
    }

    fn json(&self) -> bool {
        self.json.load(Ordering::Relaxed)
    }
}

/// Installs the global subscriber: stderr, text or JSON, filtered by
/// `control` (and by `RUST_LOG` when it is set).
pub fn install(control: &Arc<LogControl>, ansi: bool) {
    // Without `RUST_LOG` there must be no filter layer at all: an empty
    // `Option` layer counts as one that wants every span, and then every
    // library's spans are built on every request.
    match std::env::var("RUST_LOG") {
        Ok(narrowing) => tracing_subscriber::registry()
            .with(EnvFilter::new(narrowing))
            .with(stderr(control, ansi))
            .init(),
        Err(_) => tracing_subscriber::registry().with(stderr(control, ansi)).init(),
    }
}

/// The text and the JSON layer, only one of them on at a time.
fn stderr<S>(control: &Arc<LogControl>, ansi: bool) -> impl Layer<S> + Send + Sync
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    let text_control = Arc::clone(control);
    let json_control = Arc::clone(control);
    let text = fmt::layer()
        .with_writer(|| OneLine)
        .with_ansi(ansi)
        .with_filter(filter_fn(move |meta| {
            !text_control.json() && text_control.enabled(*meta.level(), meta.target())
        }));
    let json = fmt::layer()
        .json()
        .with_writer(std::io::stderr)
        .with_filter(filter_fn(move |meta| {
            json_control.json() && json_control.enabled(*meta.level(), meta.target())
        }));
    text.and_then(json)
}

/// stderr for the text format, one line per event: a line break inside an
/// event (a client's text in a field: a sequence id, a region name, an
/// error quoting a request) is written as `\n` or `\r`, so no request can
/// forge a log line. (The JSON format escapes them already.) The formatter
/// writes each event whole in one call, its last byte the line's end.
struct OneLine;

impl std::io::Write for OneLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stderr().lock().write_all(&one_line(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// `event` with its inner line breaks escaped (its final one kept).
fn one_line(event: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    let (body, end): (&[u8], &[u8]) = match event.strip_suffix(b"\n") {
        Some(body) => (body, b"\n"),
        None => (event, b""),
    };
    if !body.iter().any(|b| matches!(b, b'\n' | b'\r')) {
        return std::borrow::Cow::Borrowed(event);
    }
    let mut out = Vec::with_capacity(event.len() + 8);
    for &byte in body {
        match byte {
            b'\n' => out.extend_from_slice(b"\\n"),
            b'\r' => out.extend_from_slice(b"\\r"),
            _ => out.push(byte),
        }
    }
    out.extend_from_slice(end);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_is_one_line_whatever_its_fields_hold() {
        assert_eq!(&*one_line(b"plain event\n"), b"plain event\n");
        assert_eq!(
            &*one_line(b"sequence='a\n2026-12-06 INFO forged'\r x\n"),
            b"sequence='a\\n2026-12-06 INFO forged'\\r x\n"
        );
        assert_eq!(&*one_line(b"no end\nhere"), b"no end\\nhere");
    }

    fn set(pairs: &[(&str, Parameter)]) -> Vec<(String, Parameter)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
    }

    #[test]
    fn severities_switch_independently_and_verbose_adds_our_debug() {
        let control = LogControl::new(&LogSettings::default());
        assert!(control.enabled(Level::INFO, "nereid_server::x"));
        assert!(!control.enabled(Level::DEBUG, "nereid_server::x"));
        assert!(!control.enabled(Level::INFO, "ort::session"));
        control
            .update(&set(&[
                ("log_info", Parameter::Bool(false)),
                ("log_verbose_level", Parameter::Int(1)),
            ]))
            .unwrap();
        assert!(!control.enabled(Level::INFO, "nereid_server::x"));
        assert!(control.enabled(Level::WARN, "nereid_server::x"));
        assert!(control.enabled(Level::DEBUG, "nereid_server::x"));
        assert!(!control.enabled(Level::DEBUG, "hyper::proto"));
        assert!(!control.enabled(Level::TRACE, "nereid_server::x"));
    }

    #[test]
    fn a_bad_change_changes_nothing_and_names_itself() {
        let control = LogControl::new(&LogSettings::default());
        let before = control.settings();
        for (changes, needle) in [
            (
                set(&[
                    ("log_info", Parameter::Bool(false)),
                    ("log_error", Parameter::String("yes".into())),
                ]),
                "'log_error' must be a boolean",
            ),
            (set(&[("log_verbose_level", Parameter::Int(-1))]), "non-negative"),
            (set(&[("log_format", Parameter::String("xml".into()))]), "'log_format'"),
            (
                set(&[("log_colour", Parameter::Bool(true))]),
                "unknown log setting 'log_colour'",
            ),
        ] {
            let e = control.update(&changes).unwrap_err();
            assert!(e.message().contains(needle), "{e}");
        }
        let e = control
            .update(&set(&[("log_file", Parameter::String("/tmp/x".into()))]))
            .unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Unsupported);
        assert_eq!(control.settings(), before);
        let after = control
            .update(&set(&[("log_format", Parameter::String("json".into()))]))
            .unwrap();
        assert_eq!(after.format, LogFormat::Json);
    }
}
