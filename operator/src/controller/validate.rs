//! The validate stage: the spec rules (shared with the CRD's CEL rules, in
//! `nereid_crds::validate`) plus what only the operator cares about.
//!
//! CEL rejects most bad specs at admission; this catches the rest, and the
//! same rules on clusters or paths where admission did not run (an object
//! stored before a rule existed).

use kube::ResourceExt;
use nereid_crds::InferenceModel;

/// Every problem with `model`, or `Ok`.
pub fn validate(model: &InferenceModel) -> Result<(), Vec<String>> {
    let mut problems = nereid_crds::validate::validate(&model.spec).err().unwrap_or_default();
    problems.extend(name_problem(&model.name_any()));
    if problems.is_empty() { Ok(()) } else { Err(problems) }
}

/// The Service is named like the model, and Service names (like label
/// values) must be DNS-1035 labels: at most 63 characters, lower-case
/// letters, digits and '-', starting with a letter and not ending with '-'.
/// InferenceModel names only need to be DNS subdomains, which allow more.
fn name_problem(name: &str) -> Option<String> {
    let valid = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && !name.ends_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    (!valid).then(|| {
        format!(
            "metadata.name '{name}' must be a DNS-1035 label (at most 63 characters of a-z, 0-9 and '-', \
             starting with a letter), because the model's Service is named after it"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_compatible_names_pass() {
        assert_eq!(name_problem("resnet-50"), None);
        assert_eq!(name_problem(&"a".repeat(63)), None);
    }

    #[test]
    fn names_a_service_cannot_have_are_reported() {
        for name in ["50-resnet", "res.net", "Resnet", "resnet-", &"a".repeat(64)] {
            assert!(name_problem(name).is_some(), "{name}");
        }
    }
}
