//! Unit tests of `validate` and `validate_ensemble`.

use std::collections::BTreeMap;

use crate::rules;
use crate::*;

fn model() -> InferenceModelSpec {
    InferenceModelSpec {
        source: ModelSource {
            uri: "s3://bucket/models/mlp".into(),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn autoscaling(min: Option<i32>, max: i32, target: &str) -> Autoscaling {
    Autoscaling {
        min_replicas: min,
        max_replicas: max,
        target: target.into(),
        ..Default::default()
    }
}

fn errors(spec: &InferenceModelSpec) -> Vec<String> {
    validate(spec).expect_err("spec should be invalid")
}

#[test]
fn a_minimal_model_is_valid() {
    assert_eq!(validate(&model()), Ok(()));
}

#[test]
fn replicas_must_not_be_negative() {
    let mut spec = model();
    spec.replicas = Some(0);
    assert_eq!(validate(&spec), Ok(()));
    spec.replicas = Some(-1);
    assert_eq!(errors(&spec), [rules::REPLICAS.message]);
}

#[test]
fn known_uri_schemes_pass_and_others_fail() {
    for uri in [
        "s3://b/p",
        "gs://b/p",
        "as://account/container/p",
        "https://example.com/m.tar.gz",
        "http://example.com/m.tar.gz",
        "pvc://claim/path",
        "pvc://claim",
    ] {
        let mut spec = model();
        spec.source.uri = uri.into();
        assert_eq!(validate(&spec), Ok(()), "{uri}");
    }
    for uri in [
        "",
        "ftp://host/p",
        "s3://",
        "s3:///p",
        "/models/mlp",
        "S3://b/p",
        "file:///m",
    ] {
        let mut spec = model();
        spec.source.uri = uri.into();
        let errors = errors(&spec);
        assert!(errors[0].starts_with(rules::URI_SCHEME.message), "{uri}: {errors:?}");
    }
    let mut spec = model();
    spec.source.uri = format!("s3://b/{}", "x".repeat(2048));
    assert!(errors(&spec)[0].contains("at most 2048"));
}

#[test]
fn version_policy_sets_at_most_one_field() {
    let mut spec = model();
    spec.source.version = Some(VersionPolicy {
        latest: Some(2),
        ..Default::default()
    });
    assert_eq!(validate(&spec), Ok(()));
    spec.source.version = Some(VersionPolicy {
        latest: Some(1),
        specific: Some(vec![1, 3]),
        ..Default::default()
    });
    assert_eq!(errors(&spec), [rules::VERSION_ONE_OF.message]);
    spec.source.version = Some(VersionPolicy {
        latest: Some(0),
        ..Default::default()
    });
    assert_eq!(errors(&spec), ["spec.source.version.latest must be >= 1"]);
}

#[test]
fn autoscaling_bounds() {
    let mut spec = model();
    spec.autoscaling = Some(autoscaling(Some(1), 3, "500"));
    assert_eq!(validate(&spec), Ok(()));
    spec.autoscaling = Some(autoscaling(None, 1, "2k"));
    assert_eq!(validate(&spec), Ok(()));

    spec.autoscaling = Some(autoscaling(Some(5), 2, "500"));
    assert_eq!(errors(&spec), [rules::MIN_LE_MAX.message]);
    spec.autoscaling = Some(autoscaling(None, 0, "500"));
    assert_eq!(errors(&spec), [rules::MAX_REPLICAS.message]);
    spec.autoscaling = Some(autoscaling(Some(-1), 2, "500"));
    assert_eq!(errors(&spec), [rules::MIN_REPLICAS.message]);
}

#[test]
fn scale_to_zero_settings_need_min_replicas_zero_and_sane_durations() {
    let mut spec = model();
    let mut asleep = autoscaling(Some(0), 2, "500");
    spec.autoscaling = Some(asleep.clone());
    assert_eq!(validate(&spec), Ok(()));
    assert_eq!(asleep.scale_to_zero_after(), DEFAULT_SCALE_TO_ZERO_AFTER);
    assert_eq!(asleep.activation_timeout(), DEFAULT_ACTIVATION_TIMEOUT);
    asleep.scale_to_zero_after = Some("90s".into());
    asleep.activation_timeout = Some("2m".into());
    spec.autoscaling = Some(asleep.clone());
    assert_eq!(validate(&spec), Ok(()));
    assert_eq!(asleep.scale_to_zero_after(), std::time::Duration::from_secs(90));
    assert_eq!(asleep.activation_timeout(), std::time::Duration::from_secs(120));

    for (after, timeout) in [
        ("0s", "60s"),
        ("5 minutes", "60s"),
        ("5m", "0s"),
        ("5m", "-1s"),
        ("5m", "11m"),
    ] {
        let mut bad = asleep.clone();
        bad.scale_to_zero_after = Some(after.into());
        bad.activation_timeout = Some(timeout.into());
        spec.autoscaling = Some(bad);
        let errors = errors(&spec);
        assert_eq!(errors.len(), 1, "{after} {timeout}: {errors:?}");
        let rule = if after == "5m" {
            rules::ACTIVATION_TIMEOUT
        } else {
            rules::SCALE_TO_ZERO_AFTER
        };
        assert!(errors[0].starts_with(rule.message), "{errors:?}");
    }

    // The settings of sleep on a model that never sleeps.
    let mut awake = asleep.clone();
    awake.min_replicas = Some(1);
    spec.autoscaling = Some(awake);
    assert_eq!(errors(&spec), [rules::ZERO_ONLY_FIELDS.message]);

    // A canary would serve alone while the model sleeps.
    spec.autoscaling = Some(asleep);
    spec.canary = Some(Canary {
        traffic_percent: 10,
        ..Default::default()
    });
    assert_eq!(errors(&spec), [rules::CANARY_NOT_ASLEEP.message]);
}

#[test]
fn a_gpu_instance_group_needs_a_gpu_in_the_pod() {
    let mut spec = model();
    spec.config = Some(ModelConfigOverride {
        instance_group: Some(vec![InstanceGroup {
            count: Some(1),
            kind: Some(InstanceKind::Gpu),
        }]),
        ..Default::default()
    });
    assert_eq!(errors(&spec), [rules::GPU_KIND_NEEDS_GPU.message]);
    spec.resources = Some(ModelResources {
        gpu: Some(1),
        ..Default::default()
    });
    assert_eq!(validate(&spec), Ok(()));
    // KIND_AUTO runs where the pod lets it.
    spec.resources = None;
    spec.config.as_mut().unwrap().instance_group.as_mut().unwrap()[0].kind = Some(InstanceKind::Auto);
    assert_eq!(validate(&spec), Ok(()));
}

#[test]
fn autoscaling_target_is_a_positive_quantity() {
    for bad in ["", "fast", "0", "-5", "1.2.3"] {
        let mut spec = model();
        spec.autoscaling = Some(autoscaling(None, 2, bad));
        let errors = errors(&spec);
        assert!(
            errors[0].starts_with(rules::TARGET_QUANTITY.message),
            "{bad:?}: {errors:?}"
        );
    }
}

#[test]
fn config_and_ports_are_bounded() {
    let mut spec = model();
    spec.config = Some(ModelConfigOverride {
        max_batch_size: Some(-1),
        ..Default::default()
    });
    spec.server = Some(ServerSpec {
        ports: Some(ServerPorts {
            http: Some(0),
            grpc: Some(8001),
            metrics: Some(70000),
        }),
        ..Default::default()
    });
    assert_eq!(
        errors(&spec),
        [
            "spec.config.maxBatchSize must be >= 0",
            "spec.server.ports.http must be between 1 and 65535 (got 0)",
            "spec.server.ports.metrics must be between 1 and 65535 (got 70000)",
        ]
    );
}

#[test]
fn a_canary_percent_outside_0_to_100_and_a_bad_canary_source_are_named() {
    let mut spec = model();
    spec.canary = Some(Canary {
        traffic_percent: 20,
        ..Default::default()
    });
    assert_eq!(validate(&spec), Ok(()));
    spec.canary = Some(Canary {
        traffic_percent: 101,
        replicas: Some(-1),
        source: Some(ModelSource {
            uri: "ftp://bucket/m".into(),
            version: Some(VersionPolicy {
                latest: Some(0),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let found = errors(&spec);
    assert_eq!(found.len(), 4, "{found:?}");
    assert_eq!(
        found[0],
        "spec.canary.trafficPercent must be between 0 and 100 (got 101)"
    );
    assert_eq!(found[1], "spec.canary.replicas must be between 0 and 1000 (got -1)");
    assert!(
        found[2].starts_with("spec.canary.source.uri must start with"),
        "{found:?}"
    );
    assert_eq!(found[3], "spec.canary.source.version.latest must be >= 1");
    spec.canary.as_mut().unwrap().traffic_percent = -5;
    assert!(errors(&spec).iter().any(|e| e.contains("(got -5)")));
}

#[test]
fn every_problem_is_reported_at_once() {
    let mut spec = model();
    spec.replicas = Some(-3);
    spec.source.uri = "ftp://x/y".into();
    spec.autoscaling = Some(autoscaling(Some(4), 2, "500"));
    assert_eq!(errors(&spec).len(), 3);
}

// ---- ensembles ----

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn step(name: &str, inputs: &[(&str, &str)], outputs: &[(&str, &str)]) -> EnsembleStep {
    EnsembleStep {
        name: name.into(),
        model: format!("{name}-model"),
        model_version: None,
        input_map: map(inputs),
        output_map: map(outputs),
    }
}

fn tensor(name: &str) -> EnsembleTensor {
    EnsembleTensor {
        name: name.into(),
        datatype: "FP32".into(),
        dims: vec![-1, 4],
    }
}

/// IN -> a -> mid -> b -> OUT
fn chain() -> ModelEnsembleSpec {
    ModelEnsembleSpec {
        steps: vec![
            step("a", &[("x", "IN")], &[("y", "mid")]),
            step("b", &[("x", "mid")], &[("y", "OUT")]),
        ],
        inputs: vec![tensor("IN")],
        outputs: vec![tensor("OUT")],
        ..Default::default()
    }
}

fn ensemble_errors(spec: &ModelEnsembleSpec) -> Vec<String> {
    validate_ensemble(spec).expect_err("ensemble should be invalid")
}

#[test]
fn a_chain_and_a_diamond_are_valid() {
    assert_eq!(validate_ensemble(&chain()), Ok(()));
    let diamond = ModelEnsembleSpec {
        steps: vec![
            step("join", &[("l", "left"), ("r", "right")], &[("o", "OUT")]),
            step("split", &[("x", "IN")], &[("l", "left"), ("r", "right0")]),
            step("right", &[("x", "right0")], &[("y", "right")]),
        ],
        ..chain()
    };
    assert_eq!(validate_ensemble(&diamond), Ok(()));
}

#[test]
fn steps_must_exist_and_have_unique_names() {
    let empty = ModelEnsembleSpec {
        steps: vec![],
        outputs: vec![],
        ..chain()
    };
    assert_eq!(ensemble_errors(&empty), [rules::STEPS_NOT_EMPTY.message]);

    let mut spec = chain();
    spec.steps[1].name = "a".into();
    let errors = ensemble_errors(&spec);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(
        errors[0],
        format!("{}: \"a\" appears more than once", rules::STEP_NAMES_UNIQUE.message)
    );
}

#[test]
fn a_cycle_is_reported_with_its_steps() {
    // IN -> a; a reads c's output, c reads b's, b reads a's.
    let spec = ModelEnsembleSpec {
        steps: vec![
            step("a", &[("x", "IN"), ("z", "t3")], &[("y", "t1")]),
            step("b", &[("x", "t1")], &[("y", "t2")]),
            step("c", &[("x", "t2")], &[("y", "t3"), ("o", "OUT")]),
        ],
        ..chain()
    };
    let errors = ensemble_errors(&spec);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("cycle") && errors[0].contains(r#"["a", "b", "c"]"#),
        "{errors:?}"
    );
}

#[test]
fn a_step_reading_its_own_output_is_a_cycle() {
    let mut spec = chain();
    spec.steps[1].input_map.insert("loop".into(), "OUT".into());
    assert!(ensemble_errors(&spec)[0].contains("cycle"));
}

#[test]
fn every_tensor_is_produced_exactly_once() {
    let mut spec = chain();
    spec.steps[1].output_map.insert("z".into(), "mid".into());
    let errors = ensemble_errors(&spec);
    assert!(
        errors
            .iter()
            .any(|e| e.contains(r#"tensor "mid" is produced more than once (by step "a" and by step "b")"#)),
        "{errors:?}"
    );

    let mut spec = chain();
    spec.steps[0].output_map.insert("shadow".into(), "IN".into());
    assert!(ensemble_errors(&spec)[0].contains("by an ensemble input and by step \"a\""));
}

#[test]
fn inputs_and_outputs_must_be_produced() {
    let mut spec = chain();
    spec.steps[1].input_map.insert("extra".into(), "nowhere".into());
    let errors = ensemble_errors(&spec);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains(r#"step "b" reads tensor "nowhere""#), "{errors:?}");

    let mut spec = chain();
    spec.outputs.push(tensor("MISSING"));
    assert_eq!(
        ensemble_errors(&spec),
        [r#"ensemble output "MISSING" is not produced by any step"#]
    );

    // Passing an input straight through is not a step's output.
    let mut spec = chain();
    spec.outputs.push(tensor("IN"));
    assert_eq!(
        ensemble_errors(&spec),
        [r#"ensemble output "IN" is not produced by any step"#]
    );
}

#[test]
fn ensemble_datatypes_replicas_and_autoscaling() {
    let mut spec = chain();
    spec.inputs[0].datatype = "FLOAT32".into();
    spec.replicas = Some(-1);
    spec.autoscaling = Some(autoscaling(Some(3), 1, "10"));
    let errors = ensemble_errors(&spec);
    assert_eq!(errors.len(), 3, "{errors:?}");
    assert_eq!(errors[0], rules::ENSEMBLE_REPLICAS.message);
    assert_eq!(errors[1], rules::MIN_LE_MAX.message);
    assert!(errors[2].contains(r#"spec.inputs: tensor "IN" has unknown datatype "FLOAT32""#));

    // Only a model is woken by the gateway: an ensemble never sleeps.
    let mut spec = chain();
    spec.autoscaling = Some(autoscaling(Some(0), 1, "10"));
    assert_eq!(ensemble_errors(&spec), [rules::ENSEMBLE_MIN_REPLICAS.message]);
}

#[test]
fn empty_step_fields_are_reported() {
    let mut spec = chain();
    spec.steps[0].name.clear();
    spec.steps[0].model.clear();
    assert_eq!(
        ensemble_errors(&spec),
        [
            "spec.steps[0].name must not be empty",
            "spec.steps[0].model must name an InferenceModel"
        ]
    );
}
