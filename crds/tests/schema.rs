//! The shape of the generated CRDs: names, subresources, printer columns and
//! the CEL rules, read back from the YAML the way the API server reads it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use serde_json::Value;

fn parsed() -> Vec<CustomResourceDefinition> {
    serde_saphyr::from_multiple(&nereid_crds::crd_yaml()).expect("crd_yaml() parses back")
}

/// The openAPIV3Schema of the CRD's only version, as JSON.
fn schema(crd: &CustomResourceDefinition) -> Value {
    let version = &crd.spec.versions[0];
    serde_json::to_value(version.schema.as_ref().unwrap().open_api_v3_schema.as_ref().unwrap()).unwrap()
}

/// The schema at a dotted path of property names (`[]` steps into list items).
fn at<'a>(schema: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(schema, |s, key| match key {
        "[]" => &s["items"],
        _ => &s["properties"][key],
    })
}

/// The CEL rules attached at a schema node.
fn rules(node: &Value) -> Vec<String> {
    node["x-kubernetes-validations"]
        .as_array()
        .map(|rules| rules.iter().map(|r| r["rule"].as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn has_rule(schema: &Value, path: &str, rule: nereid_crds::rules::Check) {
    let node = at(schema, path);
    assert!(
        rules(node).contains(&rule.rule.to_string()),
        "{path} lacks {:?}; has {:?}",
        rule.rule,
        rules(node)
    );
    let messages = node["x-kubernetes-validations"].as_array().unwrap();
    let said = |r: &&Value| match rule.message_expression {
        Some(expression) => r["messageExpression"] == expression,
        None => r["message"] == rule.message,
    };
    assert!(messages.iter().any(|r| said(&r)), "{path}: message of {:?}", rule.rule);
}

/// No rule of ours at `path`: the API server's own check covers it.
fn has_no_rule(schema: &Value, path: &str) {
    assert_eq!(rules(at(schema, path)), Vec::<String>::new(), "{path}");
}

#[test]
fn yaml_round_trips_to_the_same_crds() {
    assert_eq!(parsed(), nereid_crds::crds());
    let text = nereid_crds::crd_yaml();
    assert!(text.starts_with(nereid_crds::YAML_HEADER));
    assert_eq!(text, nereid_crds::crd_yaml(), "generation is deterministic");
}

#[test]
fn inference_model_names_and_subresources() {
    let crd = &parsed()[0];
    assert_eq!(crd.metadata.name.as_deref(), Some("inferencemodels.serving.nereid.dev"));
    assert_eq!(crd.spec.scope, "Namespaced");
    let names = &crd.spec.names;
    assert_eq!(names.kind, "InferenceModel");
    assert_eq!(
        names.short_names.as_deref(),
        Some(&["nmodel".to_string(), "nmodels".to_string()][..])
    );
    assert_eq!(names.categories.as_deref(), Some(&["nereid".to_string()][..]));

    let version = &crd.spec.versions[0];
    assert_eq!(version.name, "v1alpha1");
    let subresources = version.subresources.as_ref().unwrap();
    assert!(subresources.status.is_some());
    let scale = subresources.scale.as_ref().unwrap();
    assert_eq!(scale.spec_replicas_path, ".spec.replicas");
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(scale.label_selector_path.as_deref(), Some(".status.selector"));

    let columns: Vec<_> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c.name.as_str(),
                c.type_.as_str(),
                c.json_path.as_str(),
                c.priority.unwrap_or(0),
            )
        })
        .collect();
    assert_eq!(
        columns,
        [
            ("Ready", "string", ".status.ready", 0),
            ("Reason", "string", ".status.reason", 0),
            ("URL", "string", ".status.url", 0),
            ("Age", "date", ".metadata.creationTimestamp", 0),
            // -o wide.
            ("gRPC", "string", ".status.endpoints.grpc", 1),
            ("GPUs", "integer", ".spec.resources.gpu", 1),
            ("Min", "integer", ".spec.autoscaling.minReplicas", 1),
            ("Max", "integer", ".spec.autoscaling.maxReplicas", 1),
            ("Current", "integer", ".status.replicas", 1),
            ("Model URI", "string", ".spec.source.uri", 1),
        ]
    );
}

#[test]
fn inference_model_cel_rules() {
    use nereid_crds::rules::*;
    let s = schema(&parsed()[0]);
    has_no_rule(&s, "spec.replicas");
    has_rule(&s, "spec.source.uri", URI_SCHEME);
    has_rule(&s, "spec.source.version", VERSION_ONE_OF);
    has_rule(&s, "spec.autoscaling", MIN_LE_MAX);
    has_rule(&s, "spec.autoscaling.minReplicas", MIN_REPLICAS);
    has_rule(&s, "spec.autoscaling.maxReplicas", MAX_REPLICAS);
    has_rule(&s, "spec.autoscaling.target", TARGET_QUANTITY);
    has_rule(&s, "spec", GPU_KIND_NEEDS_GPU);
    // Strings and lists read by rules are bounded, so the CEL cost estimate fits.
    assert_eq!(at(&s, "spec.source.uri")["maxLength"], 2048);
    assert_eq!(at(&s, "spec.config.instanceGroup")["maxItems"], 16);
    assert_eq!(at(&s, "spec.autoscaling.target")["maxLength"], 64);
    // The GPU count cannot be negative (schema minimum).
    assert_eq!(at(&s, "spec.resources.gpu")["minimum"].as_f64(), Some(0.0));
}

#[test]
fn inference_model_enums_and_status() {
    let s = schema(&parsed()[0]);
    let metric = at(&s, "spec.autoscaling.metric");
    assert_eq!(
        metric["enum"],
        serde_json::json!(["queueTimeMicros", "pendingRequests", "inferenceRate", "gpuUtilization"])
    );
    let kind = at(&s, "spec.config.instanceGroup.[].kind");
    assert_eq!(kind["enum"], serde_json::json!(["KIND_CPU", "KIND_GPU", "KIND_AUTO"]));
    for field in [
        "replicas",
        "readyReplicas",
        "selector",
        "conditions",
        "lastFailure",
        "endpoints",
    ] {
        assert!(
            at(&s, "status").get("properties").unwrap().get(field).is_some(),
            "status.{field}"
        );
    }
}

#[test]
fn no_formats_the_api_server_warns_about() {
    // Kubernetes >= 1.34 warns about unrecognized formats such as uint32.
    let text = nereid_crds::crd_yaml();
    for format in ["uint8", "uint16", "uint32", "uint64", "uint"] {
        assert!(
            !text.contains(&format!("format: {format}\n")),
            "format {format} in the CRD"
        );
    }
}

#[test]
fn every_field_has_a_description() {
    /// Our own properties (k8s-openapi's types document themselves).
    fn walk(path: &str, node: &Value, missing: &mut Vec<String>) {
        if let Some(properties) = node["properties"].as_object() {
            for (name, property) in properties {
                let here = format!("{path}.{name}");
                if property.get("description").is_none() && name != "metadata" {
                    missing.push(here.clone());
                }
                walk(&here, property, missing);
            }
        }
        if node.get("items").is_some() {
            walk(&format!("{path}[]"), &node["items"], missing);
        }
    }
    for crd in parsed() {
        let mut missing = Vec::new();
        walk(&crd.spec.names.kind, &schema(&crd), &mut missing);
        assert!(missing.is_empty(), "fields without a description: {missing:?}");
    }
}

#[test]
fn model_ensemble_shape_and_rules() {
    use nereid_crds::rules::*;
    let crd = &parsed()[1];
    assert_eq!(crd.metadata.name.as_deref(), Some("modelensembles.serving.nereid.dev"));
    assert_eq!(
        crd.spec.names.short_names.as_deref(),
        Some(&["nensemble".to_string()][..])
    );
    assert_eq!(crd.spec.names.categories.as_deref(), Some(&["nereid".to_string()][..]));
    let version = &crd.spec.versions[0];
    let scale = version.subresources.as_ref().unwrap().scale.as_ref().unwrap();
    assert_eq!(scale.status_replicas_path, ".status.replicas");
    assert_eq!(scale.label_selector_path.as_deref(), Some(".status.selector"));
    let columns: Vec<_> = version
        .additional_printer_columns
        .as_ref()
        .unwrap()
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    assert_eq!(columns, ["Ready", "Placement", "Members", "Reason", "URL", "Age"]);

    let s = schema(crd);
    has_rule(&s, "spec.steps", STEPS_NOT_EMPTY);
    has_rule(&s, "spec.steps", STEP_NAMES_UNIQUE);
    has_no_rule(&s, "spec.replicas");
    has_rule(&s, "spec.autoscaling", MIN_LE_MAX);
    assert_eq!(at(&s, "spec.steps")["maxItems"], 64);
    assert_eq!(at(&s, "spec.steps.[].name")["maxLength"], 63);
    let placement = at(&s, "spec.placement");
    assert_eq!(placement["enum"], serde_json::json!(["remote", "colocated"]));
    assert_eq!(placement["default"], "remote");
    assert_eq!(
        at(&s, "spec.inputs.[].datatype")["enum"].as_array().unwrap().len(),
        DATATYPES.len()
    );
}
