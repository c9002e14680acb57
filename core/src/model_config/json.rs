//! `ModelConfig` as JSON, the way Triton shows it on `/v2/models/{m}/config`
//! and takes it in the repository load `config` parameter.
//!
//! Field names are the proto names (`max_batch_size`), enums are their
//! names, every field is printed (Triton prints defaults too), and 64-bit
//! integers are numbers, not strings, as Triton's own converter emits them.

use nereid_proto::inference::ModelConfig;
use prost_reflect::{DynamicMessage, SerializeOptions};

use crate::error::{Error, Result};

pub fn to_json(config: &ModelConfig) -> serde_json::Value {
    let mut message = DynamicMessage::new(super::descriptor());
    // Transcoding between two representations of the same message cannot fail.
    message
        .transcode_from(config)
        .expect("ModelConfig transcodes into its own descriptor");
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .stringify_64_bit_integers(false)
        .skip_default_fields(false);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .expect("a DynamicMessage serializes into a JSON value")
}

/// Parses a JSON model config (proto or JSON field names both accepted).
pub fn from_json(text: &str) -> Result<ModelConfig> {
    let mut de = serde_json::Deserializer::from_str(text);
    let message = DynamicMessage::deserialize(super::descriptor(), &mut de)
        .map_err(|e| Error::invalid(format!("failed to parse model config JSON: {e}")))?;
    de.end()
        .map_err(|e| Error::invalid(format!("failed to parse model config JSON: {e}")))?;
    message
        .transcode_to::<ModelConfig>()
        .map_err(|e| Error::invalid(format!("failed to convert model config JSON: {e}")))
}

/// Merges a partial config in JSON over `config`, as a JSON merge patch
/// (RFC 7386): objects merge field by field, anything else replaces, and
/// `null` removes. This is how a Kubernetes InferenceModel's `spec.config`
/// changes only the fields it names.
pub fn merge_patch(config: &ModelConfig, patch: &str) -> Result<ModelConfig> {
    let patch: serde_json::Value = serde_json::from_str(patch)
        .map_err(|e| Error::invalid(format!("failed to parse the model config patch: {e}")))?;
    if !patch.is_object() {
        return Err(Error::invalid("the model config patch must be a JSON object"));
    }
    let mut merged = to_json(config);
    merge(&mut merged, patch);
    from_json(&merged.to_string()).map_err(|e| e.context("the model config patch"))
}

fn merge(target: &mut serde_json::Value, patch: serde_json::Value) {
    match (target, patch) {
        (serde_json::Value::Object(target), serde_json::Value::Object(patch)) => {
            for (key, value) in patch {
                if value.is_null() {
                    target.remove(&key);
                } else {
                    merge(target.entry(key).or_insert(serde_json::Value::Null), value);
                }
            }
        }
        (target, patch) => *target = patch,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_with_triton_field_names() {
        let config = super::super::text::parse(
            r#"name: "m" max_batch_size: 4 input [ { name: "X" data_type: TYPE_FP32 dims: [ -1, 3 ] } ]"#,
        )
        .unwrap();
        let json = to_json(&config);
        assert_eq!(json["max_batch_size"], 4);
        assert_eq!(json["input"][0]["data_type"], "TYPE_FP32");
        assert_eq!(json["input"][0]["dims"], serde_json::json!([-1, 3]));
        let back = from_json(&json.to_string()).unwrap();
        assert_eq!(back, config);
    }

    #[test]
    fn merge_patch_changes_only_what_it_names() {
        let config = super::super::text::parse(
            r#"name: "m" max_batch_size: 4 input [ { name: "X" data_type: TYPE_FP32 dims: [ 3 ] } ]
               parameters { key: "a" value: { string_value: "1" } }"#,
        )
        .unwrap();
        let merged = merge_patch(
            &config,
            r#"{"max_batch_size": 16, "dynamic_batching": {"max_queue_delay_microseconds": 100},
                "parameters": {"b": {"string_value": "2"}}}"#,
        )
        .unwrap();
        assert_eq!(merged.max_batch_size, 16);
        assert_eq!(merged.input, config.input);
        assert_eq!(merged.parameters["a"].string_value, "1");
        assert_eq!(merged.parameters["b"].string_value, "2");
        assert!(merged.scheduling_choice.is_some());
        assert!(merge_patch(&config, "[1]").is_err());
        assert!(merge_patch(&config, r#"{"max_batch_size": "many"}"#).is_err());
    }

    #[test]
    fn bad_json_is_an_invalid_argument() {
        let err = from_json("{\"max_batch_size\": \"x\"").unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::InvalidArgument);
        let err = from_json("{\"no_such\": 1}").unwrap_err();
        assert!(err.message().contains("no_such"), "{err}");
    }
}
