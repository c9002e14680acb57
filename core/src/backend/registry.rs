//! Every backend, in one table: its kind, the `backend` / `platform` names
//! that pick it in a config, its default model file, and its
//! implementation. Adding a backend is one row here (and its module or
//! crate).
//!
//! Backends with heavy dependencies live in their own crates (ONNX
//! Runtime in nereid-onnxruntime, remote models in nereid-remote), so the
//! core depends on neither: the binary plugs them in at startup
//! ([`plug_in`]). A model of a backend that was not plugged in fails to
//! load, saying so.

use std::path::Path;

use nereid_proto::inference::ModelConfig;
use parking_lot::RwLock;

use super::{Backend, InstanceSpec, ModelInstance, NoInstances, builtin};
use crate::error::{Error, Result};
use crate::model_config::autocomplete::ModelSignature;

/// Which implementation runs a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// ONNX Runtime through the `ort` crate.
    OnnxRuntime,
    /// Copies each input to the output at the same position (Triton's identity backend).
    Identity,
    /// `OUTPUT0 = INPUT0 + INPUT1`, `OUTPUT1 = INPUT0 - INPUT1`.
    AddSub,
    /// Decoupled: streams its input back element by element.
    Repeat,
    /// Stateful: sums its inputs per sequence.
    Accumulate,
    /// Triton's `platform: "ensemble"`: a DAG of other models.
    Ensemble,
    /// `backend: "remote"`: another server's model, over KServe v2 gRPC.
    Remote,
    /// `backend: "python"`: Triton's `model.py`, each instance in its own
    /// Python process.
    Python,
}

/// One backend.
pub struct Registration {
    pub kind: BackendKind,
    /// The config's `backend` that names it ("" for none).
    pub backend: &'static str,
    /// Config `platform`s that name it when `backend` is empty; the first
    /// is the one reported.
    pub platforms: &'static [&'static str],
    /// The model file when the config names none.
    pub default_model_filename: Option<&'static str>,
    /// `None`: in another crate, plugged in at startup.
    pub implementation: Option<&'static dyn Backend>,
}

/// The implementations plugged in from other crates.
static PLUGGED_IN: RwLock<Vec<(BackendKind, &'static dyn Backend)>> = RwLock::new(Vec::new());

/// Makes `backend` the implementation of `kind` (one that lives in its
/// own crate); called by the binary before it loads models.
pub fn plug_in(kind: BackendKind, backend: &'static dyn Backend) {
    let mut plugged = PLUGGED_IN.write();
    plugged.retain(|(k, _)| *k != kind);
    plugged.push((kind, backend));
}

/// Stands in for a backend that was not plugged in.
struct NotPluggedIn;

impl NotPluggedIn {
    fn error(config: &ModelConfig) -> Error {
        Error::unsupported(format!(
            "model '{}': backend '{}' is not part of this server's build",
            config.name, config.backend
        ))
    }
}

impl Backend for NotPluggedIn {
    fn signature(&self, config: &ModelConfig, _: &Path) -> Result<Option<ModelSignature>> {
        Err(Self::error(config))
    }

    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
        Err(Self::error(spec.config))
    }

    fn complete_config(&self, config: &mut ModelConfig, _: &Path) -> Result<()> {
        Err(Self::error(config))
    }
}

/// The backends this server has.
pub static REGISTRY: [Registration; 8] = [
    Registration {
        kind: BackendKind::OnnxRuntime,
        backend: "onnxruntime",
        platforms: &["onnxruntime_onnx"],
        default_model_filename: Some("model.onnx"),
        implementation: None,
    },
    Registration {
        kind: BackendKind::Identity,
        backend: "identity",
        platforms: &[],
        default_model_filename: None,
        implementation: Some(&builtin::IdentityBackend),
    },
    Registration {
        kind: BackendKind::AddSub,
        backend: "add_sub",
        platforms: &[],
        default_model_filename: None,
        implementation: Some(&builtin::AddSubBackend),
    },
    Registration {
        kind: BackendKind::Repeat,
        backend: "repeat",
        platforms: &[],
        default_model_filename: None,
        implementation: Some(&builtin::repeat::RepeatBackend),
    },
    Registration {
        kind: BackendKind::Accumulate,
        backend: "accumulate",
        platforms: &[],
        default_model_filename: None,
        implementation: Some(&builtin::accumulate::AccumulateBackend),
    },
    Registration {
        kind: BackendKind::Ensemble,
        backend: "",
        platforms: &["ensemble"],
        default_model_filename: None,
        implementation: Some(&NoInstances),
    },
    Registration {
        kind: BackendKind::Remote,
        backend: "remote",
        platforms: &[],
        default_model_filename: None,
        implementation: None,
    },
    Registration {
        kind: BackendKind::Python,
        backend: "python",
        platforms: &[],
        default_model_filename: Some("model.py"),
        implementation: None,
    },
];

impl BackendKind {
    fn registration(self) -> &'static Registration {
        REGISTRY
            .iter()
            .find(|r| r.kind == self)
            .expect("every kind has a registration")
    }

    /// Resolves `platform` / `backend` as Triton does; `None` when neither
    /// names a backend we have.
    pub fn from_config(config: &ModelConfig) -> Option<BackendKind> {
        REGISTRY
            .iter()
            .find(|r| match config.backend.as_str() {
                "" => r.platforms.contains(&config.platform.as_str()),
                backend => r.backend == backend,
            })
            .map(|r| r.kind)
    }

    /// The model file name used when the config names none.
    pub fn default_model_filename(self) -> Option<&'static str> {
        self.registration().default_model_filename
    }

    /// The implementation: built in, plugged in, or one that says it is
    /// missing.
    pub fn implementation(self) -> &'static dyn Backend {
        if let Some(backend) = self.registration().implementation {
            return backend;
        }
        PLUGGED_IN
            .read()
            .iter()
            .find(|(kind, _)| *kind == self)
            .map_or(&NotPluggedIn, |(_, backend)| *backend)
    }

    /// Fills `backend` / `platform` the way Triton reports them: the
    /// backend's name, and its platform when it has one and none was given.
    pub fn describe(self, config: &mut ModelConfig) {
        let registration = self.registration();
        config.backend = registration.backend.to_string();
        if config.platform.is_empty()
            && let Some(platform) = registration.platforms.first()
        {
            config.platform = platform.to_string();
        }
    }

    /// What the "unknown backend" error lists.
    pub fn known() -> String {
        let backends: Vec<String> = REGISTRY
            .iter()
            .filter(|r| !r.backend.is_empty())
            .map(|r| format!("'{}'", r.backend))
            .collect();
        let platforms: Vec<String> = REGISTRY
            .iter()
            .flat_map(|r| r.platforms.iter().map(|p| format!("'{p}'")))
            .collect();
        format!(
            "backends {} and platforms {}",
            backends.join(", "),
            platforms.join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(backend: &str, platform: &str) -> ModelConfig {
        ModelConfig {
            backend: backend.into(),
            platform: platform.into(),
            ..ModelConfig::default()
        }
    }

    #[test]
    fn backends_and_platforms_pick_their_kind() {
        assert_eq!(
            BackendKind::from_config(&config("onnxruntime", "")),
            Some(BackendKind::OnnxRuntime)
        );
        assert_eq!(
            BackendKind::from_config(&config("", "onnxruntime_onnx")),
            Some(BackendKind::OnnxRuntime)
        );
        assert_eq!(
            BackendKind::from_config(&config("", "ensemble")),
            Some(BackendKind::Ensemble)
        );
        assert_eq!(
            BackendKind::from_config(&config("repeat", "")),
            Some(BackendKind::Repeat)
        );
        assert_eq!(
            BackendKind::from_config(&config("python", "")),
            Some(BackendKind::Python)
        );
        assert_eq!(BackendKind::from_config(&config("tensorrt", "")), None);
        assert_eq!(BackendKind::from_config(&config("", "")), None);
        let mut described = config("", "onnxruntime_onnx");
        BackendKind::OnnxRuntime.describe(&mut described);
        assert_eq!(
            (described.backend.as_str(), described.platform.as_str()),
            ("onnxruntime", "onnxruntime_onnx")
        );
        let mut ensemble = config("", "ensemble");
        BackendKind::Ensemble.describe(&mut ensemble);
        assert_eq!(
            (ensemble.backend.as_str(), ensemble.platform.as_str()),
            ("", "ensemble")
        );
        assert_eq!(BackendKind::OnnxRuntime.default_model_filename(), Some("model.onnx"));
        assert!(BackendKind::known().contains("'remote'"));
    }

    #[test]
    fn a_backend_from_another_crate_is_plugged_in_and_one_missing_says_so() {
        let config = config("onnxruntime", "");
        let missing = BackendKind::OnnxRuntime
            .implementation()
            .signature(&config, Path::new("."))
            .unwrap_err();
        assert!(
            missing
                .message()
                .contains("backend 'onnxruntime' is not part of this server's build"),
            "{missing}"
        );

        plug_in(BackendKind::OnnxRuntime, &builtin::IdentityBackend);
        let plugged = BackendKind::OnnxRuntime.implementation();
        assert!(
            plugged.signature(&config, Path::new(".")).unwrap().is_none(),
            "the identity answers now"
        );
        PLUGGED_IN.write().clear();
    }
}
