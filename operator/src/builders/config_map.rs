//! The ConfigMap that carries an InferenceModel's config override.
//!
//! It holds one key, `config.json`: the fields the user overrides, in the
//! JSON form of Triton's `ModelConfig` (proto field names, as the server's
//! repository load API takes its `config` parameter and as `/v2/models/{m}/config`
//! prints it). It is pbtxt-free on purpose: JSON has one canonical form, so the
//! hash below changes exactly when the override does.
//!
//! The operator never reads the model repository, so it cannot merge the
//! override over the repository's `config.pbtxt` itself. The pods mount this
//! ConfigMap and the merge happens next to the model files (see
//! [`super::deployment`] for where, and what is not done yet).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use nereid_crds::{DynamicBatching, InferenceModel, ModelConfigOverride, VersionPolicy};
use serde_json::{Map, Value, json};

use super::{Served, labels};

/// The ConfigMap's one key.
pub const CONFIG_KEY: &str = "config.json";

/// `<model>-config` (an ensemble's is named the same way).
pub fn name<S: Served>(model: &S) -> String {
    name_of(&model.name_any())
}

/// The ConfigMap of the resource named `resource`.
pub fn name_of(resource: &str) -> String {
    format!("{resource}-config")
}

/// The ConfigMap of `model`.
pub fn config_map(model: &InferenceModel) -> ConfigMap {
    let json = triton_config(model);
    ConfigMap {
        metadata: labels::object_meta(model, name(model)),
        data: Some(BTreeMap::from([(
            CONFIG_KEY.to_string(),
            serde_json::to_string_pretty(&json).expect("a JSON value always serializes"),
        )])),
        ..ConfigMap::default()
    }
}

/// A short, stable hash of the ConfigMap's data (FNV-1a, 64 bits, hex).
///
/// Stable across operator builds and Rust versions (unlike std's hasher),
/// so upgrading the operator does not roll every model's pods.
pub fn config_hash(config_map: &ConfigMap) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut feed = |bytes: &[u8]| {
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    // BTreeMap iterates in key order; the separators keep ("ab","c") and
    // ("a","bc") apart.
    for (key, value) in config_map.data.iter().flatten() {
        feed(key.as_bytes());
        feed(&[0]);
        feed(value.as_bytes());
        feed(&[0]);
    }
    format!("{hash:016x}")
}

/// The override as Triton's `ModelConfig` JSON: only the fields the user set,
/// plus `version_policy` from `spec.source.version`. `{}` when nothing is overridden.
pub fn triton_config(model: &InferenceModel) -> Value {
    let mut config = Map::new();
    if let Some(policy) = &model.spec.source.version
        && let Some(policy) = version_policy(policy)
    {
        config.insert("version_policy".into(), policy);
    }
    if let Some(over) = &model.spec.config {
        override_fields(over, &mut config);
    }
    Value::Object(config)
}

fn override_fields(over: &ModelConfigOverride, config: &mut Map<String, Value>) {
    if let Some(size) = over.max_batch_size {
        config.insert("max_batch_size".into(), json!(size));
    }
    if let Some(batching) = &over.dynamic_batching {
        config.insert("dynamic_batching".into(), dynamic_batching(batching));
    }
    if let Some(groups) = &over.instance_group {
        let groups = groups
            .iter()
            .map(|group| {
                let mut entry = Map::new();
                if let Some(count) = group.count {
                    entry.insert("count".into(), json!(count));
                }
                if let Some(kind) = group.kind {
                    entry.insert("kind".into(), serde_json::to_value(kind).expect("an enum serializes"));
                }
                Value::Object(entry)
            })
            .collect();
        config.insert("instance_group".into(), Value::Array(groups));
    }
    if let Some(parameters) = &over.parameters {
        let parameters = parameters
            .iter()
            .map(|(k, v)| (k.clone(), json!({ "string_value": v })))
            .collect();
        config.insert("parameters".into(), Value::Object(parameters));
    }
}

fn dynamic_batching(batching: &DynamicBatching) -> Value {
    let mut out = Map::new();
    if !batching.preferred_batch_size.is_empty() {
        out.insert("preferred_batch_size".into(), json!(batching.preferred_batch_size));
    }
    let scalars = [
        (
            "max_queue_delay_microseconds",
            batching.max_queue_delay_microseconds.map(Value::from),
        ),
        ("preserve_ordering", batching.preserve_ordering.map(Value::from)),
        ("priority_levels", batching.priority_levels.map(Value::from)),
        (
            "default_priority_level",
            batching.default_priority_level.map(Value::from),
        ),
    ];
    for (key, value) in scalars {
        if let Some(value) = value {
            out.insert(key.into(), value);
        }
    }
    // Triton keeps the queue bound and default timeout in the queue policy.
    let mut queue = Map::new();
    if let Some(size) = batching.max_queue_size {
        queue.insert("max_queue_size".into(), json!(size));
    }
    if let Some(timeout) = batching.default_timeout_microseconds {
        queue.insert("default_timeout_microseconds".into(), json!(timeout));
    }
    if !queue.is_empty() {
        out.insert("default_queue_policy".into(), Value::Object(queue));
    }
    Value::Object(out)
}

fn version_policy(policy: &VersionPolicy) -> Option<Value> {
    if let Some(versions) = &policy.specific {
        Some(json!({ "specific": { "versions": versions } }))
    } else if policy.all == Some(true) {
        Some(json!({ "all": {} }))
    } else {
        policy.latest.map(|n| json!({ "latest": { "num_versions": n } }))
    }
}

#[cfg(test)]
mod tests {
    use nereid_crds::{InferenceModelSpec, InstanceGroup, InstanceKind, ModelSource};

    use super::*;

    fn model(config: Option<ModelConfigOverride>) -> InferenceModel {
        let spec = InferenceModelSpec {
            source: ModelSource {
                uri: "s3://bucket/resnet".into(),
                ..ModelSource::default()
            },
            config,
            ..InferenceModelSpec::default()
        };
        let mut model = InferenceModel::new("resnet", spec);
        model.metadata.namespace = Some("ml".into());
        model
    }

    #[test]
    fn no_override_is_an_empty_object() {
        let cm = config_map(&model(None));
        assert_eq!(cm.metadata.name.as_deref(), Some("resnet-config"));
        assert_eq!(cm.data.unwrap()[CONFIG_KEY], "{}");
    }

    #[test]
    fn override_uses_triton_field_names() {
        let over = ModelConfigOverride {
            max_batch_size: Some(8),
            dynamic_batching: Some(DynamicBatching {
                preferred_batch_size: vec![4, 8],
                max_queue_delay_microseconds: Some(100),
                max_queue_size: Some(64),
                ..DynamicBatching::default()
            }),
            instance_group: Some(vec![InstanceGroup {
                count: Some(2),
                kind: Some(InstanceKind::Gpu),
            }]),
            parameters: Some(BTreeMap::from([("k".to_string(), "v".to_string())])),
        };
        let json = triton_config(&model(Some(over)));
        assert_eq!(json["max_batch_size"], 8);
        assert_eq!(json["dynamic_batching"]["preferred_batch_size"], json!([4, 8]));
        assert_eq!(json["dynamic_batching"]["max_queue_delay_microseconds"], 100);
        assert_eq!(json["dynamic_batching"]["default_queue_policy"]["max_queue_size"], 64);
        assert_eq!(json["instance_group"], json!([{ "count": 2, "kind": "KIND_GPU" }]));
        assert_eq!(json["parameters"]["k"]["string_value"], "v");
    }

    #[test]
    fn version_policy_comes_from_the_source() {
        let mut m = model(None);
        m.spec.source.version = Some(VersionPolicy {
            latest: Some(2),
            ..VersionPolicy::default()
        });
        assert_eq!(
            triton_config(&m)["version_policy"],
            json!({ "latest": { "num_versions": 2 } })
        );
        m.spec.source.version = Some(VersionPolicy {
            specific: Some(vec![1, 3]),
            ..VersionPolicy::default()
        });
        assert_eq!(
            triton_config(&m)["version_policy"],
            json!({ "specific": { "versions": [1, 3] } })
        );
        m.spec.source.version = Some(VersionPolicy {
            all: Some(true),
            ..VersionPolicy::default()
        });
        assert_eq!(triton_config(&m)["version_policy"], json!({ "all": {} }));
    }

    #[test]
    fn hash_changes_with_the_config_and_only_with_it() {
        let a = config_hash(&config_map(&model(None)));
        assert_eq!(a, config_hash(&config_map(&model(None))));
        assert_eq!(a.len(), 16);
        let b = config_hash(&config_map(&model(Some(ModelConfigOverride {
            max_batch_size: Some(4),
            ..ModelConfigOverride::default()
        }))));
        assert_ne!(a, b);
    }
}
