//! `config.pbtxt`: protobuf text format into the generated `ModelConfig`.
//!
//! prost-reflect's text-format parser is strict where protoc is lenient:
//! it rejects a repeated message field written without a colon
//! (`input [ { ... } ]`), which nearly every Triton config uses. So the text
//! is first normalised by inserting the colon between a field name and `[`,
//! outside strings and comments. Everything else is plain text format.

use nereid_proto::inference::ModelConfig;
use prost_reflect::DynamicMessage;

use crate::error::{Error, Result};

/// Parses a Triton `config.pbtxt`.
pub fn parse(text: &str) -> Result<ModelConfig> {
    let descriptor = super::descriptor();
    let normalized = normalize(text);
    let message = DynamicMessage::parse_text_format(descriptor, &normalized)
        .map_err(|e| Error::invalid(format!("failed to parse config.pbtxt: {e}")))?;
    message
        .transcode_to::<ModelConfig>()
        .map_err(|e| Error::invalid(format!("failed to convert config.pbtxt: {e}")))
}

/// Inserts `:` between a field name and a following `[`.
fn normalize(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 16);
    let mut chars = text.chars().peekable();
    // The last significant character written outside strings and comments.
    let mut last: Option<char> = None;
    while let Some(c) = chars.next() {
        match c {
            '#' => {
                out.push(c);
                for c in chars.by_ref() {
                    out.push(c);
                    if c == '\n' {
                        break;
                    }
                }
            }
            '"' | '\'' => {
                out.push(c);
                while let Some(s) = chars.next() {
                    out.push(s);
                    if s == '\\' {
                        if let Some(escaped) = chars.next() {
                            out.push(escaped);
                        }
                    } else if s == c {
                        break;
                    }
                }
                last = Some(c);
            }
            '[' => {
                if last.is_some_and(|l| l.is_ascii_alphanumeric() || l == '_') {
                    out.push(':');
                }
                out.push(c);
                last = Some(c);
            }
            c if c.is_whitespace() => out.push(c),
            c => {
                out.push(c);
                last = Some(c);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::inference::{DataType, model_instance_group::Kind};

    const SIMPLE: &str = r#"
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
# comments with [brackets] and "quotes" are left alone
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
    label_filename: "labels[1].txt"
  }
]
instance_group [ { count: 2, kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
version_policy: { latest { num_versions: 2 } }
"#;

    #[test]
    fn parses_triton_style_config() {
        let config = parse(SIMPLE).unwrap();
        assert_eq!(config.name, "simple");
        assert_eq!(config.max_batch_size, 8);
        assert_eq!(config.input.len(), 2);
        assert_eq!(config.input[1].name, "INPUT1");
        assert_eq!(config.input[0].data_type, DataType::TypeInt32 as i32);
        assert_eq!(config.input[0].dims, vec![16]);
        assert_eq!(config.output[0].label_filename, "labels[1].txt");
        assert_eq!(config.instance_group[0].count, 2);
        assert_eq!(config.instance_group[0].kind, Kind::Cpu as i32);
        assert_eq!(config.parameters["intra_op_thread_count"].string_value, "1");
    }

    #[test]
    fn syntax_errors_are_reported() {
        let err = parse("name: \"x\"\ninput [ { name: } ]").unwrap_err();
        assert!(err.message().contains("config.pbtxt"), "{err}");
        let err = parse("no_such_field: 3").unwrap_err();
        assert!(err.message().contains("no_such_field"), "{err}");
    }

    #[test]
    fn normalize_keeps_existing_colons_and_strings() {
        assert_eq!(normalize("dims: [1]"), "dims: [1]");
        assert_eq!(normalize("input [ ]"), "input :[ ]");
        assert_eq!(normalize("name: \"a [b\""), "name: \"a [b\"");
        assert_eq!(normalize("# x [\ninput["), "# x [\ninput:[");
    }
}
