//! Checks a completed config for what every backend relies on.

use std::collections::HashSet;

use nereid_proto::inference::{ModelConfig, model_config::SchedulingChoice, model_instance_group::Kind};

use super::{input_datatype, output_datatype};
use crate::error::{Error, Result};
use crate::tensor::element_count;

pub fn validate(config: &ModelConfig) -> Result<()> {
    check_scheduling(config)?;
    if !config.model_warmup.is_empty() && (config.platform == "ensemble" || config.backend == "remote") {
        // They have no instances to warm; silently skipping would make the
        // user believe readiness waited for a warmup that never ran.
        return Err(Error::invalid(format!(
            "model '{}' has no instances to warm up: model_warmup is for the models that run (an ensemble's steps, a remote model's server)",
            config.name
        )));
    }
    if config.max_batch_size < 0 {
        return Err(Error::invalid(format!(
            "max_batch_size must be >= 0, got {}",
            config.max_batch_size
        )));
    }
    if config.input.is_empty() {
        return Err(Error::invalid("model configuration must contain at least one input"));
    }
    if config.output.is_empty() {
        return Err(Error::invalid("model configuration must contain at least one output"));
    }
    let mut seen = HashSet::new();
    for input in &config.input {
        let what = format!("input '{}'", input.name);
        check_name(&input.name, "input")?;
        if !seen.insert(("input", input.name.as_str())) {
            return Err(Error::invalid(format!("{what} appears more than once")));
        }
        if input_datatype(input).is_none() {
            return Err(Error::invalid(format!("{what} must specify a valid data_type")));
        }
        check_dims(&what, &input.dims)?;
        if let Some(reshape) = &input.reshape {
            check_reshape(&what, &input.dims, &reshape.shape)?;
        }
    }
    for output in &config.output {
        let what = format!("output '{}'", output.name);
        check_name(&output.name, "output")?;
        if !seen.insert(("output", output.name.as_str())) {
            return Err(Error::invalid(format!("{what} appears more than once")));
        }
        if output_datatype(output).is_none() {
            return Err(Error::invalid(format!("{what} must specify a valid data_type")));
        }
        check_dims(&what, &output.dims)?;
        if let Some(reshape) = &output.reshape {
            check_reshape(&what, &output.dims, &reshape.shape)?;
        }
    }
    for group in &config.instance_group {
        if group.count < 0 {
            return Err(Error::invalid(format!(
                "instance_group '{}' count must be >= 1, got {}",
                group.name, group.count
            )));
        }
        if Kind::try_from(group.kind).is_err() {
            return Err(Error::invalid(format!(
                "instance_group '{}' has an unknown kind {}",
                group.name, group.kind
            )));
        }
    }
    Ok(())
}

/// Scheduling that does not fit the model: a choice meant for another kind
/// of model (such a model must not load: served otherwise, it would answer
/// wrongly).
fn check_scheduling(config: &ModelConfig) -> Result<()> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::EnsembleScheduling(_)) if config.platform != "ensemble" => {
            return Err(Error::invalid(
                "ensemble_scheduling belongs to models of platform 'ensemble'",
            ));
        }
        _ if config.platform == "ensemble"
            && !matches!(config.scheduling_choice, Some(SchedulingChoice::EnsembleScheduling(_))) =>
        {
            return Err(Error::invalid(format!(
                "ensemble '{}' needs ensemble_scheduling with its steps",
                config.name
            )));
        }
        Some(SchedulingChoice::DynamicBatching(_) | SchedulingChoice::SequenceBatching(_))
            if config.backend == "remote" =>
        {
            return Err(Error::invalid(format!(
                "remote model '{}' cannot have dynamic_batching or sequence_batching: the remote server schedules its requests",
                config.name
            )));
        }
        Some(
            SchedulingChoice::EnsembleScheduling(_)
            | SchedulingChoice::DynamicBatching(_)
            | SchedulingChoice::SequenceBatching(_),
        )
        | None => {}
    }
    Ok(())
}

fn check_name(name: &str, what: &str) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid(format!(
            "an {what} in the model configuration has no name"
        )));
    }
    Ok(())
}

fn check_dims(what: &str, dims: &[i64]) -> Result<()> {
    if let Some(bad) = dims.iter().find(|&&d| d < -1 || d == 0) {
        return Err(Error::invalid(format!(
            "{what} has an invalid dimension {bad} in {dims:?}: dims must be positive or -1"
        )));
    }
    Ok(())
}

fn check_reshape(what: &str, dims: &[i64], shape: &[i64]) -> Result<()> {
    check_dims(what, shape)?;
    let dynamic = |d: &[i64]| d.contains(&-1);
    if !dynamic(dims) && !dynamic(shape) {
        let a = element_count(dims)?;
        let b = element_count(shape)?;
        if a != b {
            return Err(Error::invalid(format!(
                "{what} reshape {shape:?} has {b} elements but dims {dims:?} have {a}"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model_config::text::parse;

    #[test]
    fn accepts_a_good_config() {
        let config = parse(
            r#"name: "m" max_batch_size: 8
               input [ { name: "A" data_type: TYPE_INT32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] } } ]
               output [ { name: "B" data_type: TYPE_STRING dims: [ -1 ] } ]"#,
        )
        .unwrap();
        validate(&config).unwrap();
    }

    #[test]
    fn rejects_bad_configs_with_the_field_named() {
        let cases = [
            (
                r#"max_batch_size: -1 input [ { name: "A" data_type: TYPE_INT32 dims: [1] } ] output [ { name: "B" data_type: TYPE_INT32 dims: [1] } ]"#,
                "max_batch_size",
            ),
            (
                r#"output [ { name: "B" data_type: TYPE_INT32 dims: [1] } ]"#,
                "at least one input",
            ),
            (
                r#"input [ { name: "A" dims: [1] } ] output [ { name: "B" data_type: TYPE_INT32 dims: [1] } ]"#,
                "input 'A'",
            ),
            (
                r#"input [ { name: "A" data_type: TYPE_INT32 dims: [0] } ] output [ { name: "B" data_type: TYPE_INT32 dims: [1] } ]"#,
                "input 'A'",
            ),
            (
                r#"input [ { name: "A" data_type: TYPE_INT32 dims: [1] }, { name: "A" data_type: TYPE_INT32 dims: [1] } ] output [ { name: "B" data_type: TYPE_INT32 dims: [1] } ]"#,
                "more than once",
            ),
            (
                r#"input [ { name: "A" data_type: TYPE_INT32 dims: [4] reshape: { shape: [3] } } ] output [ { name: "B" data_type: TYPE_INT32 dims: [1] } ]"#,
                "reshape",
            ),
        ];
        for (text, needle) in cases {
            let err = validate(&parse(text).unwrap()).unwrap_err();
            assert!(err.message().contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn a_decoupled_sequence_model_is_a_valid_config() {
        // As in Triton; whether the backend can stream is checked when it is known.
        let io = r#"input [ { name: "A" data_type: TYPE_INT32 dims: [1] } ] output [ { name: "B" data_type: TYPE_INT32 dims: [1] } ]"#;
        let both = format!("{io} sequence_batching {{ }} model_transaction_policy {{ decoupled: true }}");
        validate(&parse(&both).unwrap()).unwrap();
        validate(&parse(&format!("{io} sequence_batching {{ }}")).unwrap()).unwrap();
        validate(&parse(&format!("{io} model_transaction_policy {{ decoupled: true }}")).unwrap()).unwrap();
    }
}
