//! Every manifest under deploy/examples deserializes into the Rust types
//! without losing a field; the valid ones pass `validate`, and each one under
//! invalid/ fails it with the message of the rule its comment names.

use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Secret;
use nereid_crds::{InferenceModel, ModelEnsemble, validate, validate_ensemble};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no examples in {}", dir.display());
    files
}

/// Deserializes `doc` into `T` and checks that serializing it back gives
/// the same document, so a misspelt field cannot be silently dropped.
fn typed<T: DeserializeOwned + Serialize>(file: &Path, doc: &Value) -> T {
    let value: T = serde_json::from_value(doc.clone()).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert_eq!(
        &serde_json::to_value(&value).unwrap(),
        doc,
        "{}: a field was lost",
        file.display()
    );
    value
}

/// The validation result of every document in a file (Secrets always pass).
fn check_file(file: &Path) -> Vec<Result<(), Vec<String>>> {
    let text = std::fs::read_to_string(file).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    assert!(!docs.is_empty(), "{}: no documents", file.display());
    docs.iter()
        .map(|doc| match doc["kind"].as_str() {
            Some("InferenceModel") => validate(&typed::<InferenceModel>(file, doc).spec),
            Some("ModelEnsemble") => validate_ensemble(&typed::<ModelEnsemble>(file, doc).spec),
            Some("Secret") => {
                typed::<Secret>(file, doc);
                Ok(())
            }
            other => panic!("{}: unexpected kind {other:?}", file.display()),
        })
        .collect()
}

#[test]
fn valid_examples_pass() {
    for file in yaml_files(&examples_dir()) {
        for result in check_file(&file) {
            assert_eq!(result, Ok(()), "{}", file.display());
        }
    }
}

#[test]
fn invalid_examples_fail_with_the_rule_they_name() {
    for file in yaml_files(&examples_dir().join("invalid")) {
        let text = std::fs::read_to_string(&file).unwrap();
        // The comment quotes the message kubectl shows; validate says the
        // same, unless the API server words it itself (a rule of the
        // platform, not ours): then a second comment quotes validate's words.
        let quoted = |prefix: &str| text.lines().find_map(|l| l.strip_prefix(prefix));
        let expected = quoted("# the operator's status says: ")
            .or_else(|| quoted("# kubectl apply answers: "))
            .unwrap_or_else(|| panic!("{}: no '# kubectl apply answers:' comment", file.display()))
            .trim_end_matches(" ...");
        let results = check_file(&file);
        assert_eq!(results.len(), 1, "{}: one document per invalid example", file.display());
        let errors = results[0]
            .clone()
            .expect_err(&format!("{} should be invalid", file.display()));
        assert_eq!(
            errors.len(),
            1,
            "{}: exactly one rule broken, got {errors:?}",
            file.display()
        );
        assert!(
            errors[0].starts_with(expected),
            "{}: {:?} does not start with {expected:?}",
            file.display(),
            errors[0]
        );
    }
}
