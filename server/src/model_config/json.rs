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
    fn bad_json_is_an_invalid_argument() {
        let err = from_json("{\"max_batch_size\": \"x\"").unwrap_err();
        assert_eq!(err.kind(), crate::error::ErrorKind::InvalidArgument);
        let err = from_json("{\"no_such\": 1}").unwrap_err();
        assert!(err.message().contains("no_such"), "{err}");
    }
}
