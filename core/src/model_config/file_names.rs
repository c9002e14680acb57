//! The file names a config gives, confined to the model's own folder.
//!
//! A config can come from the repository API (a JSON override), so its file
//! names are client input: `label_filename: "/proc/self/environ"` would make
//! classification return the pod's environment, credentials included, and an
//! absolute `default_model_filename` would open any file as a model. So a
//! file name must be a plain relative path (no root, no `..`), checked when
//! the config is prepared, before any file is touched; and when it is opened,
//! its real path (symlinks resolved) must still be inside the folder.
//!
//! Every refusal reads the same whether or not something exists at the path,
//! so the error text cannot be used to probe the file system.

use std::path::{Component, Path, PathBuf};

use nereid_proto::inference::ModelConfig;
use nereid_proto::inference::model_warmup::input::InputDataType;

use crate::error::{Error, Result};

/// Checks every file name in `config` without touching the file system.
pub fn check(config: &ModelConfig) -> Result<()> {
    if !config.default_model_filename.is_empty() {
        check_name(&config.default_model_filename, "default_model_filename")?;
    }
    for (key, name) in &config.cc_model_filenames {
        check_name(name, &format!("cc_model_filenames['{key}']"))?;
    }
    for warmup in &config.model_warmup {
        for (input, data) in &warmup.inputs {
            if let Some(InputDataType::InputDataFile(name)) = &data.input_data_type {
                check_name(
                    name,
                    &format!("input_data_file of warmup '{}' input '{input}'", warmup.name),
                )?;
            }
        }
    }
    for output in &config.output {
        if !output.label_filename.is_empty() {
            check_name(
                &output.label_filename,
                &format!("label_filename of output '{}'", output.name),
            )?;
        }
    }
    Ok(())
}

/// A plain relative path: normal components only.
fn check_name(name: &str, field: &str) -> Result<()> {
    let plain = !name.contains('\0')
        && Path::new(name)
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
        && Path::new(name).components().any(|c| matches!(c, Component::Normal(_)));
    if plain {
        Ok(())
    } else {
        Err(Error::invalid(format!(
            "{field} '{name}' must be a relative path inside the model folder (no leading '/', no '..')"
        )))
    }
}

/// The real path of `name` under `base`, which must lie inside `folder`
/// (`base` is the folder or one of its version folders). `what` names the
/// file in the error.
pub fn resolve(folder: &Path, base: &Path, name: &str, what: &str) -> Result<PathBuf> {
    check_name(name, what)?;
    let refused = || {
        Error::invalid(format!(
            "{what} '{name}' is not a readable file inside the model folder"
        ))
    };
    let folder = folder.canonicalize().map_err(|_| refused())?;
    let path = base.join(name).canonicalize().map_err(|_| refused())?;
    if !path.starts_with(&folder) || !path.is_file() {
        return Err(refused());
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::inference::ModelOutput;

    fn with_label(label: &str) -> ModelConfig {
        ModelConfig {
            output: vec![ModelOutput {
                name: "OUT".into(),
                label_filename: label.into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn only_plain_relative_names_pass() {
        for good in ["labels.txt", "sub/labels.txt", "./labels.txt", "labels[1].txt"] {
            check(&with_label(good)).unwrap();
        }
        for bad in [
            "/proc/self/environ",
            "/etc/hostname",
            "../x",
            "a/../../x",
            "sub/..",
            ".",
            "a\0b",
        ] {
            let e = check(&with_label(bad)).unwrap_err();
            assert!(
                e.message().contains("must be a relative path inside the model folder"),
                "{bad}: {e}"
            );
        }
        let escaping = ModelConfig {
            default_model_filename: "../../model.onnx".into(),
            ..Default::default()
        };
        assert!(
            check(&escaping)
                .unwrap_err()
                .message()
                .contains("default_model_filename")
        );
    }

    #[test]
    fn symlinks_out_of_the_folder_are_refused_like_missing_files() {
        let root = std::env::temp_dir().join(format!("nereid-file-names-{}", std::process::id()));
        let folder = root.join("model");
        std::fs::create_dir_all(folder.join("1")).unwrap();
        std::fs::write(folder.join("labels.txt"), "a\nb\n").unwrap();
        std::fs::write(root.join("secret"), "s").unwrap();
        std::os::unix::fs::symlink(root.join("secret"), folder.join("outside")).unwrap();
        std::os::unix::fs::symlink(root.join("nothing-here"), folder.join("dangling")).unwrap();
        std::os::unix::fs::symlink(folder.join("labels.txt"), folder.join("inside")).unwrap();

        let ok = resolve(&folder, &folder, "labels.txt", "label file").unwrap();
        assert!(ok.ends_with("labels.txt"));
        resolve(&folder, &folder, "inside", "label file").unwrap();
        resolve(&folder, &folder.join("1"), "../labels.txt", "x").unwrap_err();
        let outside = resolve(&folder, &folder, "outside", "label file").unwrap_err();
        let dangling = resolve(&folder, &folder, "dangling", "label file").unwrap_err();
        let missing = resolve(&folder, &folder, "missing", "label file").unwrap_err();
        let message = |e: &Error, name: &str| e.message().replace(name, "NAME");
        assert_eq!(message(&outside, "outside"), message(&missing, "missing"));
        assert_eq!(message(&dangling, "dangling"), message(&missing, "missing"));
        let directory = resolve(&folder, &folder, "1", "label file").unwrap_err();
        assert_eq!(message(&directory, "1"), message(&missing, "missing"));
        std::fs::remove_dir_all(root).unwrap();
    }
}
