//! Trace settings with Triton's keys and string values, global and per
//! model, and the sampling they imply.
//!
//! `trace_level` (`OFF`, `TIMESTAMPS`), `trace_rate` (trace one request in
//! N), `trace_count` (traces left, -1 for no limit), `log_frequency`,
//! `trace_file` and `trace_mode` (Triton's file mode is not supported:
//! only OpenTelemetry). A model may override any of them; a `null` (HTTP) or
//! empty value (gRPC) clears the override.

use std::collections::HashMap;

use crate::error::{Error, Result};

/// One model's (or the global) settings; `None` inherits from the global.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    pub level: Option<TraceLevel>,
    pub rate: Option<u32>,
    pub count: Option<i64>,
    pub log_frequency: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceLevel {
    Off,
    Timestamps,
}

impl TraceLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            TraceLevel::Off => "OFF",
            TraceLevel::Timestamps => "TIMESTAMPS",
        }
    }
}

/// Settings in force for one model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Effective {
    pub level: TraceLevel,
    pub rate: u32,
    pub count: i64,
    pub log_frequency: u32,
}

impl Default for Effective {
    /// Triton's defaults: off, one in 1000, no limit.
    fn default() -> Self {
        Effective {
            level: TraceLevel::Off,
            rate: 1000,
            count: -1,
            log_frequency: 0,
        }
    }
}

/// A change to one key: a new value, or (per model) back to the global one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Set(Vec<String>),
    Clear,
}

/// The global settings, the per-model overrides and the sampling counters.
#[derive(Debug, Default)]
pub struct TraceSettings {
    global: Effective,
    models: HashMap<String, Overrides>,
    /// Requests seen since the last sampled one, per model.
    seen: HashMap<String, u64>,
}

impl TraceSettings {
    pub fn new(global: Effective) -> Self {
        TraceSettings {
            global,
            ..Default::default()
        }
    }

    pub fn effective(&self, model: Option<&str>) -> Effective {
        let Some(model) = model else { return self.global };
        let o = self.models.get(model).cloned().unwrap_or_default();
        Effective {
            level: o.level.unwrap_or(self.global.level),
            rate: o.rate.unwrap_or(self.global.rate),
            count: o.count.unwrap_or(self.global.count),
            log_frequency: o.log_frequency.unwrap_or(self.global.log_frequency),
        }
    }

    /// Applies changes, all or nothing; `model` for a model's overrides.
    pub fn update(&mut self, model: Option<&str>, changes: &[(String, Change)]) -> Result<Effective> {
        let mut next = match model {
            Some(m) => self.models.get(m).cloned().unwrap_or_default(),
            None => Overrides {
                level: Some(self.global.level),
                rate: Some(self.global.rate),
                count: Some(self.global.count),
                log_frequency: Some(self.global.log_frequency),
            },
        };
        for (key, change) in changes {
            let value = match change {
                Change::Clear if model.is_some() => None,
                Change::Clear => {
                    return Err(Error::invalid(format!(
                        "trace setting '{key}' cannot be cleared globally; give it a value"
                    )));
                }
                Change::Set(values) => Some(values),
            };
            match key.as_str() {
                "trace_level" => next.level = value.map(|v| parse_level(v)).transpose()?,
                "trace_rate" => next.rate = value.map(|v| parse_rate(single(key, v)?)).transpose()?,
                "trace_count" => next.count = value.map(|v| parse_count(single(key, v)?)).transpose()?,
                "log_frequency" => {
                    next.log_frequency = value
                        .map(|v| {
                            let text = single(key, v)?;
                            text.parse::<u32>().map_err(|_| {
                                Error::invalid(format!(
                                    "trace setting 'log_frequency' must be a non-negative integer, got '{text}'"
                                ))
                            })
                        })
                        .transpose()?;
                }
                "trace_file" => {
                    if value.is_some_and(|v| v.iter().any(|s| !s.is_empty())) {
                        return Err(Error::unsupported(
                            "trace setting 'trace_file' is not supported: traces go to OpenTelemetry (--trace-config opentelemetry,url=...)",
                        ));
                    }
                }
                "trace_mode" => {
                    if let Some(v) = value {
                        let mode = single(key, v)?;
                        if mode != "opentelemetry" {
                            return Err(Error::unsupported(format!(
                                "trace mode '{mode}' is not supported: only 'opentelemetry'"
                            )));
                        }
                    }
                }
                _ => return Err(Error::invalid(format!("unknown trace setting '{key}'"))),
            }
        }
        match model {
            Some(m) => {
                self.models.insert(m.to_string(), next);
            }
            None => {
                self.global = Effective {
                    level: next.level.unwrap_or(self.global.level),
                    rate: next.rate.unwrap_or(self.global.rate),
                    count: next.count.unwrap_or(self.global.count),
                    log_frequency: next.log_frequency.unwrap_or(self.global.log_frequency),
                };
            }
        }
        Ok(self.effective(model))
    }

    /// Whether any request could be traced: some level is not OFF.
    pub fn any_on(&self) -> bool {
        self.global.level != TraceLevel::Off
            || self
                .models
                .values()
                .any(|o| o.level.is_some_and(|l| l != TraceLevel::Off))
    }

    /// Whether this request of `model` is traced: on, one in `rate`, and
    /// while traces are left (each sampled one uses one: the model's own
    /// count when it has one, else the global count).
    pub fn sample(&mut self, model: &str) -> bool {
        let e = self.effective(Some(model));
        if e.level == TraceLevel::Off || e.count == 0 {
            return false;
        }
        let seen = match self.seen.get_mut(model) {
            Some(seen) => seen,
            None => self.seen.entry(model.to_string()).or_insert(0),
        };
        *seen += 1;
        if *seen < u64::from(e.rate) {
            return false;
        }
        *seen = 0;
        if e.count > 0 {
            match self.models.get_mut(model).and_then(|o| o.count.as_mut()) {
                Some(count) => *count -= 1,
                None => self.global.count -= 1,
            }
        }
        true
    }
}

fn single<'v>(key: &str, values: &'v [String]) -> Result<&'v str> {
    match values {
        [one] => Ok(one),
        _ => Err(Error::invalid(format!(
            "trace setting '{key}' takes one value, got {}",
            values.len()
        ))),
    }
}

fn parse_level(values: &[String]) -> Result<TraceLevel> {
    let mut level = TraceLevel::Off;
    for value in values {
        match value.as_str() {
            "OFF" => {}
            "TIMESTAMPS" => level = TraceLevel::Timestamps,
            "TENSORS" => {
                return Err(Error::unsupported(
                    "trace level TENSORS is not supported: use TIMESTAMPS",
                ));
            }
            other => {
                return Err(Error::invalid(format!(
                    "unknown trace level '{other}': expected OFF, TIMESTAMPS or TENSORS"
                )));
            }
        }
    }
    Ok(level)
}

pub fn parse_rate(text: &str) -> Result<u32> {
    text.parse::<u32>().ok().filter(|r| *r > 0).ok_or_else(|| {
        Error::invalid(format!(
            "trace setting 'trace_rate' must be a positive integer, got '{text}'"
        ))
    })
}

pub fn parse_count(text: &str) -> Result<i64> {
    text.parse::<i64>().ok().filter(|c| *c >= -1).ok_or_else(|| {
        Error::invalid(format!(
            "trace setting 'trace_count' must be -1 or a non-negative integer, got '{text}'"
        ))
    })
}

/// A level from a flag (`level=TIMESTAMPS`).
pub fn parse_level_flag(text: &str) -> Result<TraceLevel> {
    parse_level(&[text.to_string()])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(key: &str, value: &str) -> (String, Change) {
        (key.to_string(), Change::Set(vec![value.to_string()]))
    }

    #[test]
    fn rate_and_count_decide_which_requests_are_traced() {
        let mut s = TraceSettings::new(Effective::default());
        assert!(!s.sample("m"), "off by default");
        s.update(
            None,
            &[
                set("trace_level", "TIMESTAMPS"),
                set("trace_rate", "3"),
                set("trace_count", "2"),
            ],
        )
        .unwrap();
        let traced: Vec<bool> = (0..9).map(|_| s.sample("m")).collect();
        assert_eq!(traced, [false, false, true, false, false, true, false, false, false]);
        assert_eq!(s.effective(None).count, 0);
    }

    #[test]
    fn a_model_overrides_and_clears_back_to_the_global() {
        let mut s = TraceSettings::new(Effective::default());
        let e = s
            .update(Some("m"), &[set("trace_level", "TIMESTAMPS"), set("trace_rate", "1")])
            .unwrap();
        assert_eq!((e.level, e.rate), (TraceLevel::Timestamps, 1));
        assert!(s.sample("m"));
        assert!(!s.sample("other"));
        let e = s.update(Some("m"), &[("trace_level".into(), Change::Clear)]).unwrap();
        assert_eq!(e.level, TraceLevel::Off);
        assert_eq!(e.rate, 1, "only the cleared key falls back");
    }

    #[test]
    fn bad_settings_change_nothing() {
        let mut s = TraceSettings::new(Effective::default());
        let before = s.effective(None);
        for (changes, needle) in [
            (vec![set("trace_level", "LOUD")], "unknown trace level 'LOUD'"),
            (
                vec![set("trace_level", "TIMESTAMPS"), set("trace_rate", "0")],
                "'trace_rate' must be a positive",
            ),
            (vec![set("trace_count", "-2")], "'trace_count'"),
            (vec![set("trace_colour", "1")], "unknown trace setting 'trace_colour'"),
            (vec![("trace_rate".into(), Change::Clear)], "cannot be cleared globally"),
        ] {
            let e = s.update(None, &changes).unwrap_err();
            assert!(e.message().contains(needle), "{e}");
        }
        assert_eq!(s.effective(None), before);
        assert_eq!(
            s.update(None, &[set("trace_mode", "triton")]).unwrap_err().kind(),
            crate::error::ErrorKind::Unsupported
        );
    }
}
