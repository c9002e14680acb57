//! `--backend-config`: Triton's settings for its backends, from the command
//! line, as `<backend>,<setting>=<value>` or, for every backend that has the
//! setting, `<setting>=<value>`. A backend's own value wins over one given
//! for all, whatever their order.
//!
//! Triton stores any pair and lets each backend ignore what it does not
//! read, so a misspelt setting silently changes nothing. Here a setting no
//! backend of this server reads is refused at start-up, with the ones it
//! has. The settings:
//!
//! - `onnxruntime,default-max-batch-size=N`: what auto-complete sets an
//!   unset `max_batch_size` to for a model that can batch (4 unless set; 0
//!   leaves such models unbatched).
//! - `python,…`: the Python backend's shared memory and timeouts (read by
//!   nereid-python; docs/python-backend.md).

use std::str::FromStr;

use crate::model_config::DEFAULT_MAX_BATCH_SIZE;

/// The settings this server's backends read: (backend, setting).
const KNOWN: &[(&str, &str)] = &[
    ("onnxruntime", DEFAULT_MAX_BATCH_SIZE_SETTING),
    ("python", "shm-default-byte-size"),
    ("python", "shm-growth-byte-size"),
    ("python", "shm-limit-byte-size"),
    ("python", "stub-timeout-seconds"),
    ("python", "execute-timeout-seconds"),
    ("python", "execute-ahead"),
];
const DEFAULT_MAX_BATCH_SIZE_SETTING: &str = "default-max-batch-size";

/// Why a `--backend-config` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BackendConfigError {
    #[error("expected <backend>,<setting>=<value> or <setting>=<value>, got '{0}'")]
    Form(String),
    #[error("no backend of this server is named '{backend}'; backends with settings: {known}")]
    UnknownBackend { backend: String, known: String },
    #[error("backend '{backend}' has no setting '{setting}'; its settings: {known}")]
    UnknownSetting {
        backend: String,
        setting: String,
        known: String,
    },
    #[error("no backend of this server has the setting '{setting}'; the settings: {known}")]
    UnknownGlobalSetting { setting: String, known: String },
    #[error("'{setting}' must be a whole number of 0 or more, got '{value}'")]
    NotACount { setting: String, value: String },
}

/// One `--backend-config` value, checked against the settings there are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendConfig {
    /// `None`: for every backend with the setting.
    pub backend: Option<String>,
    pub setting: String,
    pub value: String,
}

impl FromStr for BackendConfig {
    type Err = BackendConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let form = || BackendConfigError::Form(text.to_string());
        let (backend, pair) = match text.split_once(',') {
            Some((backend, pair)) => (Some(backend), pair),
            None => (None, text),
        };
        let (setting, value) = pair.split_once('=').ok_or_else(form)?;
        if backend.is_some_and(str::is_empty) || setting.is_empty() || value.is_empty() {
            return Err(form());
        }
        let listed = |pairs: Vec<String>| pairs.join(", ");
        match backend {
            Some(backend) if !KNOWN.iter().any(|(b, _)| *b == backend) => {
                return Err(BackendConfigError::UnknownBackend {
                    backend: backend.to_string(),
                    known: listed(KNOWN.iter().map(|(b, _)| (*b).to_string()).collect()),
                });
            }
            Some(backend) if !KNOWN.contains(&(backend, setting)) => {
                return Err(BackendConfigError::UnknownSetting {
                    backend: backend.to_string(),
                    setting: setting.to_string(),
                    known: listed(
                        KNOWN
                            .iter()
                            .filter(|(b, _)| *b == backend)
                            .map(|(_, s)| (*s).to_string())
                            .collect(),
                    ),
                });
            }
            None if !KNOWN.iter().any(|(_, s)| *s == setting) => {
                return Err(BackendConfigError::UnknownGlobalSetting {
                    setting: setting.to_string(),
                    known: listed(KNOWN.iter().map(|(b, s)| format!("{b},{s}")).collect()),
                });
            }
            _ => {}
        }
        // Every setting there is is a count.
        if value.parse::<u64>().is_err() {
            return Err(BackendConfigError::NotACount {
                setting: setting.to_string(),
                value: value.to_string(),
            });
        }
        Ok(BackendConfig {
            backend: backend.map(str::to_string),
            setting: setting.to_string(),
            value: value.to_string(),
        })
    }
}

/// What the backends read from their settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendSettings {
    /// The onnxruntime backend's `default-max-batch-size`.
    pub default_max_batch_size: i32,
}

impl Default for BackendSettings {
    fn default() -> Self {
        BackendSettings {
            default_max_batch_size: DEFAULT_MAX_BATCH_SIZE,
        }
    }
}

impl BackendConfig {
    /// `backend`'s value of `setting` among `configs`: its own, else the
    /// one given for every backend.
    pub fn value_of<'a>(configs: &'a [BackendConfig], backend: &str, setting: &str) -> Option<&'a str> {
        let last = |given_for: Option<&str>| {
            configs
                .iter()
                .rev()
                .find(|c| c.setting == setting && c.backend.as_deref() == given_for)
                .map(|c| c.value.as_str())
        };
        last(Some(backend)).or_else(|| last(None))
    }
}

impl BackendSettings {
    /// The settings `configs` give: those for every backend first, then
    /// each backend's own over them.
    pub fn from_configs(configs: &[BackendConfig]) -> Self {
        let mut settings = BackendSettings::default();
        let everyone = configs.iter().filter(|c| c.backend.is_none());
        let own = configs.iter().filter(|c| c.backend.is_some());
        for config in everyone.chain(own) {
            if config.setting == DEFAULT_MAX_BATCH_SIZE_SETTING {
                // Checked when parsed: a u64; beyond i32 it is as good as unlimited.
                let count = config.value.parse::<u64>().unwrap_or(0);
                settings.default_max_batch_size = i32::try_from(count).unwrap_or(i32::MAX);
            }
        }
        settings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<BackendConfig, BackendConfigError> {
        text.parse()
    }

    #[test]
    fn both_forms_parse_and_a_backends_own_value_wins() {
        let own = parse("onnxruntime,default-max-batch-size=8").unwrap();
        assert_eq!(own.backend.as_deref(), Some("onnxruntime"));
        let everyone = parse("default-max-batch-size=2").unwrap();
        assert_eq!(everyone.backend, None);
        assert_eq!(
            BackendSettings::from_configs(&[own.clone(), everyone.clone()]).default_max_batch_size,
            8
        );
        assert_eq!(BackendSettings::from_configs(&[everyone]).default_max_batch_size, 2);
        assert_eq!(BackendSettings::from_configs(&[]).default_max_batch_size, 4);
    }

    #[test]
    fn malformed_and_unknown_values_are_refused_with_what_there_is() {
        assert!(matches!(
            parse("onnxruntime,default-max-batch-size"),
            Err(BackendConfigError::Form(_))
        ));
        assert!(matches!(
            parse(",default-max-batch-size=4"),
            Err(BackendConfigError::Form(_))
        ));
        assert!(matches!(parse("onnxruntime,=4"), Err(BackendConfigError::Form(_))));
        let backend = parse("tensorrt,default-max-batch-size=4").unwrap_err().to_string();
        assert!(
            backend.contains("'tensorrt'") && backend.contains("onnxruntime"),
            "{backend}"
        );
        let setting = parse("onnxruntime,max-batch=4").unwrap_err().to_string();
        assert!(
            setting.contains("'max-batch'") && setting.contains("default-max-batch-size"),
            "{setting}"
        );
        let global = parse("shm-message-queue-size=1024").unwrap_err().to_string();
        assert!(global.contains("'shm-message-queue-size'"), "{global}");
        let python = [
            parse("shm-default-byte-size=1").unwrap(),
            parse("python,shm-default-byte-size=2").unwrap(),
        ];
        assert_eq!(
            BackendConfig::value_of(&python, "python", "shm-default-byte-size"),
            Some("2")
        );
        assert_eq!(
            BackendConfig::value_of(&python[..1], "python", "shm-default-byte-size"),
            Some("1")
        );
        assert_eq!(BackendConfig::value_of(&python, "python", "stub-timeout-seconds"), None);
        let count = parse("onnxruntime,default-max-batch-size=-1").unwrap_err().to_string();
        assert!(count.contains("got '-1'"), "{count}");
    }
}
