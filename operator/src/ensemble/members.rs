//! What an ensemble's members serve: each member InferenceModel's config,
//! asked of one of its ready pods (`/v2/models/<member>/config`), since the
//! InferenceModel's spec does not declare tensors (the model repository
//! does). The ensemble's DAG is checked against these configs, and with
//! placement `remote` they become the ensemble pod's remote models.

use k8s_openapi::api::core::v1::Pod;
use serde_json::Value;

use crate::controller::loaded_versions::ask_a_ready_pod;

/// A member's tensors and batching, as its server reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberConfig {
    pub max_batch_size: i64,
    pub inputs: Vec<TensorConfig>,
    pub outputs: Vec<TensorConfig>,
}

/// One input or output of a member.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorConfig {
    pub name: String,
    /// Triton's config name, e.g. `TYPE_FP32`.
    pub data_type: String,
    /// Without the batch dimension, as the config has them.
    pub dims: Vec<i64>,
    pub optional: bool,
}

impl TensorConfig {
    /// The KServe v2 datatype name (`FP32` for `TYPE_FP32`; `BYTES` for `TYPE_STRING`).
    pub fn datatype(&self) -> &str {
        match self.data_type.strip_prefix("TYPE_").unwrap_or(&self.data_type) {
            "STRING" => "BYTES",
            other => other,
        }
    }
}

/// The config a server answered, in Triton's JSON form; `None` when it is
/// not one. Dims may be numbers or (proto JSON's int64) strings.
pub fn parse(config: &Value) -> Option<MemberConfig> {
    let int = |v: &Value| v.as_i64().or_else(|| v.as_str()?.parse().ok());
    let tensors = |key: &str| -> Option<Vec<TensorConfig>> {
        config
            .get(key)?
            .as_array()?
            .iter()
            .map(|t| {
                Some(TensorConfig {
                    name: t.get("name")?.as_str()?.to_string(),
                    data_type: t.get("data_type")?.as_str()?.to_string(),
                    dims: t.get("dims")?.as_array()?.iter().map(int).collect::<Option<_>>()?,
                    optional: t.get("optional").and_then(Value::as_bool).unwrap_or(false),
                })
            })
            .collect()
    };
    Some(MemberConfig {
        max_batch_size: config.get("max_batch_size").map_or(Some(0), int)?,
        inputs: tensors("input")?,
        outputs: tensors("output")?,
    })
}

/// Asks a ready pod of the member `model` (serving HTTP on `http_port`) for
/// its config; `None` when no pod is ready or none answers in time.
pub async fn query(pods: &[Pod], model: &str, http_port: i32) -> Option<MemberConfig> {
    parse(&ask_a_ready_pod(pods, &format!("/v2/models/{model}/config"), http_port).await?)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn reads_a_servers_config_json() {
        let config = parse(&json!({
            "name": "simple", "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16], "optional": false}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_STRING", "dims": ["-1", "2"]}],
        }))
        .unwrap();
        assert_eq!(config.max_batch_size, 8);
        assert_eq!(config.inputs[0].datatype(), "INT32");
        assert_eq!(config.outputs[0].datatype(), "BYTES");
        assert_eq!(config.outputs[0].dims, [-1, 2]);
        assert_eq!(parse(&json!({"name": "x"})), None);
    }
}
