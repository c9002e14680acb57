//! What an ensemble pod serves, by placement, as the ConfigMap its
//! model folder is written from and the [`Repository`] of its Deployment.
//! Pure: the ensemble, its members and their configs go in.
//!
//! - `remote`: the ensemble's own config and, for each member, a remote
//!   model (`backend: "remote"`) with the member's tensors, calling the
//!   member's Service over gRPC (through nereid-gateway, which balances each
//!   request, when one routes the namespace; else the Service directly, over
//!   several connections so that they spread over the member's pods). Each
//!   member keeps its own pods, replicas and autoscaling.
//! - `colocated`: the ensemble's config, and each member fetched from its
//!   own `spec.source` into the same pod (with its own credentials and its
//!   `spec.config` as a patch), so a request never leaves the pod.
//!
//! Model configs are written in Triton's text format, as a repository holds
//! them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use nereid_crds::{EnsembleTensor, InferenceModel, ModelEnsemble, Placement};

use super::members::{MemberConfig, TensorConfig};
use super::tensors;
use crate::builders::deployment::{Fetched, Repository};
use crate::builders::{config_map, labels, service};
use crate::context::OperatorConfig;

/// Connections a remote model keeps to a member's Service: a Service
/// balances connections, not requests, so several spread the calls.
pub const SERVICE_CONNECTIONS: u32 = 4;

/// One member: its InferenceModel and the config its pods reported.
#[derive(Clone, Copy, Debug)]
pub struct Member<'a> {
    pub model: &'a InferenceModel,
    pub config: &'a MemberConfig,
}

/// The ConfigMap and the pod's repository of `ensemble` with `members` (in
/// step order, each once).
pub fn build(ensemble: &ModelEnsemble, members: &[Member<'_>], config: &OperatorConfig) -> (ConfigMap, Repository) {
    let configs: BTreeMap<String, MemberConfig> =
        members.iter().map(|m| (m.model.name_any(), m.config.clone())).collect();
    let name = ensemble.name_any();
    let mut data = BTreeMap::from([(
        format!("{name}.pbtxt"),
        ensemble_config(ensemble, tensors::max_batch_size(&configs)),
    )]);
    let mut repository = Repository {
        written: true,
        ..Repository::default()
    };
    match ensemble.spec.placement.unwrap_or_default() {
        Placement::Remote => {
            for member in members {
                let member_name = member.model.name_any();
                data.insert(format!("{member_name}.pbtxt"), remote_config(member, config));
            }
        }
        Placement::Colocated => {
            for (i, member) in members.iter().enumerate() {
                let member_name = member.model.name_any();
                let key = format!("{member_name}.json");
                let patch = config_map::triton_config(member.model);
                data.insert(
                    key.clone(),
                    serde_json::to_string_pretty(&patch).expect("a JSON value always serializes"),
                );
                repository.fetched.push(Fetched {
                    model: member_name.clone(),
                    source: member.model.spec.source.clone(),
                    container: format!("model-fetch-{i}"),
                    volume: format!("model-source-{i}"),
                    config_key: key.clone(),
                });
                repository.patches.push((member_name, key));
            }
        }
    }
    let config_map = ConfigMap {
        metadata: labels::object_meta(ensemble, config_map::name(ensemble)),
        data: Some(data),
        ..ConfigMap::default()
    };
    (config_map, repository)
}

/// The ensemble's `config.pbtxt`.
pub fn ensemble_config(ensemble: &ModelEnsemble, max_batch_size: i64) -> String {
    let spec = &ensemble.spec;
    let declared = |t: &EnsembleTensor| tensor(&t.name, &config_type(&t.datatype), &t.dims, false);
    let steps: Vec<String> = spec
        .steps
        .iter()
        .map(|step| {
            let map = |field: &str, pairs: &BTreeMap<String, String>| {
                pairs
                    .iter()
                    .map(|(k, v)| format!("{field} {{ key: {} value: {} }}", quoted(k), quoted(v)))
                    .collect::<Vec<_>>()
                    .join(" ")
            };
            format!(
                "  {{ model_name: {} model_version: {} {} {} }}",
                quoted(&step.model),
                step.model_version.unwrap_or(-1),
                map("input_map", &step.input_map),
                map("output_map", &step.output_map)
            )
        })
        .collect();
    format!(
        "# Written by nereid-operator from ModelEnsemble {}/{}.\nname: {}\nplatform: \"ensemble\"\n\
         max_batch_size: {max_batch_size}\ninput [\n{}\n]\noutput [\n{}\n]\nensemble_scheduling {{ step [\n{}\n] }}\n",
        ensemble.namespace().unwrap_or_default(),
        ensemble.name_any(),
        quoted(&ensemble.name_any()),
        spec.inputs.iter().map(declared).collect::<Vec<_>>().join(",\n"),
        spec.outputs.iter().map(declared).collect::<Vec<_>>().join(",\n"),
        steps.join(",\n")
    )
}

/// A member as a remote model: its tensors, and where to call it.
fn remote_config(member: &Member<'_>, config: &OperatorConfig) -> String {
    let name = member.model.name_any();
    let namespace = member.model.namespace().unwrap_or_default();
    let parameter = |key: &str, value: &str| {
        format!(
            "parameters {{ key: {} value: {{ string_value: {} }} }}",
            quoted(key),
            quoted(value)
        )
    };
    let mut parameters = vec![parameter("model_name", &name)];
    match config.gateway.as_ref().filter(|g| g.routes(&namespace)) {
        // The gateway balances each request over the member's ready pods.
        Some(gateway) => {
            parameters.push(parameter("endpoint", &gateway.grpc));
            parameters.push(parameter("namespace", &namespace));
        }
        None => {
            let host = format!(
                "{name}.{namespace}.svc.{}:{}",
                config.cluster_domain,
                service::ports(member.model).grpc
            );
            parameters.push(parameter("endpoint", &host));
            parameters.push(parameter("connections", &SERVICE_CONNECTIONS.to_string()));
        }
    }
    let list = |tensors: &[TensorConfig]| {
        tensors
            .iter()
            .map(|t| tensor(&t.name, &t.data_type, &t.dims, t.optional))
            .collect::<Vec<_>>()
            .join(",\n")
    };
    format!(
        "# Written by nereid-operator: InferenceModel {namespace}/{name}, called as a remote model.\n\
         name: {}\nbackend: \"remote\"\nmax_batch_size: {}\ninput [\n{}\n]\noutput [\n{}\n]\n{}\n",
        quoted(&name),
        member.config.max_batch_size,
        list(&member.config.inputs),
        list(&member.config.outputs),
        parameters.join("\n")
    )
}

fn tensor(name: &str, data_type: &str, dims: &[i64], optional: bool) -> String {
    let dims = dims.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
    let optional = if optional { " optional: true" } else { "" };
    format!(
        "  {{ name: {} data_type: {data_type} dims: [ {dims} ]{optional} }}",
        quoted(name)
    )
}

/// `TYPE_FP32` for `FP32`, and Triton's `TYPE_STRING` for `BYTES`.
fn config_type(datatype: &str) -> String {
    match datatype {
        "BYTES" => "TYPE_STRING".to_string(),
        other => format!("TYPE_{other}"),
    }
}

/// A text-format string literal.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use nereid_crds::{EnsembleStep, InferenceModelSpec, ModelEnsembleSpec, ModelSource};

    use super::*;
    use crate::context::Gateway;

    fn model(name: &str, uri: &str) -> InferenceModel {
        let mut m = InferenceModel::new(
            name,
            InferenceModelSpec {
                source: ModelSource {
                    uri: uri.into(),
                    credentials_secret: Some("s3".into()),
                    ..ModelSource::default()
                },
                ..InferenceModelSpec::default()
            },
        );
        m.metadata.namespace = Some("ml".into());
        m
    }

    fn member_config() -> MemberConfig {
        MemberConfig {
            max_batch_size: 8,
            inputs: vec![TensorConfig {
                name: "X".into(),
                data_type: "TYPE_FP32".into(),
                dims: vec![4],
                optional: false,
            }],
            outputs: vec![TensorConfig {
                name: "Y".into(),
                data_type: "TYPE_FP32".into(),
                dims: vec![4],
                optional: false,
            }],
        }
    }

    fn ensemble(placement: Placement) -> ModelEnsemble {
        let tensor = |name: &str| EnsembleTensor {
            name: name.into(),
            datatype: "FP32".into(),
            dims: vec![4],
        };
        let mut e = ModelEnsemble::new(
            "pipe",
            ModelEnsembleSpec {
                steps: vec![EnsembleStep {
                    name: "only".into(),
                    model: "scale".into(),
                    model_version: None,
                    input_map: BTreeMap::from([("X".into(), "IN".into())]),
                    output_map: BTreeMap::from([("Y".into(), "OUT".into())]),
                }],
                inputs: vec![tensor("IN")],
                outputs: vec![tensor("OUT")],
                placement: Some(placement),
                ..ModelEnsembleSpec::default()
            },
        );
        e.metadata.namespace = Some("ml".into());
        e.metadata.uid = Some("uid-e".into());
        e
    }

    #[test]
    fn remote_placement_writes_the_ensemble_and_a_remote_model_per_member() {
        let member = model("scale", "s3://models/scale");
        let config = member_config();
        let members = [Member {
            model: &member,
            config: &config,
        }];
        let (map, repository) = build(&ensemble(Placement::Remote), &members, &OperatorConfig::default());
        let data = map.data.unwrap();
        assert_eq!(data.keys().collect::<Vec<_>>(), ["pipe.pbtxt", "scale.pbtxt"]);
        let ensemble_config = &data["pipe.pbtxt"];
        assert!(
            ensemble_config.contains("platform: \"ensemble\"\nmax_batch_size: 8\n"),
            "{ensemble_config}"
        );
        assert!(
            ensemble_config.contains(
                r#"{ model_name: "scale" model_version: -1 input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" } }"#
            ),
            "{ensemble_config}"
        );
        assert!(ensemble_config.contains(r#"{ name: "IN" data_type: TYPE_FP32 dims: [ 4 ] }"#));
        let remote = &data["scale.pbtxt"];
        assert!(remote.contains("backend: \"remote\"\nmax_batch_size: 8\n"), "{remote}");
        assert!(
            remote.contains(
                r#"parameters { key: "endpoint" value: { string_value: "scale.ml.svc.cluster.local:8001" } }"#
            ),
            "{remote}"
        );
        assert!(
            remote.contains(r#"{ key: "connections" value: { string_value: "4" } }"#),
            "{remote}"
        );
        assert_eq!(
            repository,
            Repository {
                fetched: vec![],
                written: true,
                patches: vec![],
                served: None,
            }
        );
        assert_eq!(map.metadata.name.as_deref(), Some("pipe-config"));
        assert_eq!(map.metadata.owner_references.unwrap()[0].kind, "ModelEnsemble");
    }

    #[test]
    fn through_a_gateway_the_remote_models_call_it_with_the_namespace() {
        let member = model("scale", "s3://models/scale");
        let config = member_config();
        let members = [Member {
            model: &member,
            config: &config,
        }];
        let operator = OperatorConfig {
            gateway: Some(Gateway {
                http: "http://gw.nereid.svc.cluster.local:8000".into(),
                grpc: "gw.nereid.svc.cluster.local:8001".into(),
                namespaces: None,
            }),
            ..OperatorConfig::default()
        };
        let (map, _) = build(&ensemble(Placement::Remote), &members, &operator);
        let remote = &map.data.unwrap()["scale.pbtxt"];
        assert!(
            remote.contains(r#"string_value: "gw.nereid.svc.cluster.local:8001""#),
            "{remote}"
        );
        assert!(
            remote.contains(r#"{ key: "namespace" value: { string_value: "ml" } }"#),
            "{remote}"
        );
        assert!(!remote.contains("connections"), "{remote}");
    }

    #[test]
    fn colocated_placement_fetches_every_member_into_the_pod() {
        let member = model("scale", "pvc://claim/scale");
        let config = member_config();
        let members = [Member {
            model: &member,
            config: &config,
        }];
        let (map, repository) = build(&ensemble(Placement::Colocated), &members, &OperatorConfig::default());
        let data = map.data.unwrap();
        assert_eq!(data.keys().collect::<Vec<_>>(), ["pipe.pbtxt", "scale.json"]);
        assert_eq!(data["scale.json"], "{}");
        assert_eq!(repository.fetched.len(), 1);
        let fetched = &repository.fetched[0];
        assert_eq!(
            (fetched.model.as_str(), fetched.container.as_str()),
            ("scale", "model-fetch-0")
        );
        assert_eq!(fetched.source.uri, "pvc://claim/scale");
        assert_eq!(repository.patches, [("scale".to_string(), "scale.json".to_string())]);
    }

    #[test]
    fn strings_are_quoted_for_the_text_format() {
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
        assert_eq!(config_type("BYTES"), "TYPE_STRING");
    }
}
