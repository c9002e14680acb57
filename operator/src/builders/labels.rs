//! The labels, selector and metadata every object of a served resource (an
//! InferenceModel, a ModelEnsemble) shares.
//!
//! The selector is deliberately a small, stable subset of the labels: a
//! Deployment's selector is immutable, so it must never grow with new labels.
//! The same selector, as a string, is `status.selector` (what the scale
//! subresource hands an HPA) and the label query the controller lists pods with.

use std::collections::BTreeMap;

use super::Served;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use kube::ResourceExt;

pub const NAME: &str = "app.kubernetes.io/name";
pub const INSTANCE: &str = "app.kubernetes.io/instance";
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The model a serving pod belongs to; the Pod watch maps pods back with it.
pub const MODEL: &str = "serving.nereid.dev/model";

/// `app.kubernetes.io/name` of every serving pod.
pub const SERVER_APP: &str = "nereid-server";
/// `app.kubernetes.io/managed-by` of everything the operator creates; the
/// watches of owned objects filter on it.
pub const MANAGER: &str = "nereid-operator";

/// `managed-by=nereid-operator`, the label query of the operator's watches.
pub fn managed_selector() -> String {
    format!("{MANAGED_BY}={MANAGER}")
}

/// Labels of every object built for `model`, and of its pods.
pub fn labels<S: Served>(model: &S) -> BTreeMap<String, String> {
    let name = model.name_any();
    BTreeMap::from([
        (NAME.to_string(), SERVER_APP.to_string()),
        (INSTANCE.to_string(), name.clone()),
        (MANAGED_BY.to_string(), MANAGER.to_string()),
        (MODEL.to_string(), name),
    ])
}

/// The labels that select `model`'s serving pods.
pub fn selector<S: Served>(model: &S) -> BTreeMap<String, String> {
    BTreeMap::from([
        (NAME.to_string(), SERVER_APP.to_string()),
        (MODEL.to_string(), model.name_any()),
    ])
}

/// The selector as a `LabelSelector` (Deployment, PDB, topology spread).
pub fn label_selector<S: Served>(model: &S) -> LabelSelector {
    LabelSelector {
        match_labels: Some(selector(model)),
        ..LabelSelector::default()
    }
}

/// The selector as `k=v,k=v` (sorted by key), for `status.selector` and list calls.
pub fn selector_string<S: Served>(model: &S) -> String {
    selector(model)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The owner reference that makes `model` the controller of an object, so
/// deleting the model deletes it (and nothing else may adopt it).
///
/// Empty for a model without a uid, which only hand-built test objects lack.
pub fn owner_references<S: Served>(model: &S) -> Vec<OwnerReference> {
    model
        .controller_owner_ref(&())
        .map(|owner| OwnerReference {
            block_owner_deletion: Some(true),
            ..owner
        })
        .into_iter()
        .collect()
}

/// Metadata of an object named `name` in `model`'s namespace, labelled and owned.
pub fn object_meta<S: Served>(model: &S, name: String) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: model.namespace(),
        labels: Some(labels(model)),
        owner_references: Some(owner_references(model)),
        ..ObjectMeta::default()
    }
}

#[cfg(test)]
mod tests {
    use nereid_crds::InferenceModel;

    use super::*;

    fn model() -> InferenceModel {
        let mut model = InferenceModel::new("resnet", Default::default());
        model.metadata.namespace = Some("ml".into());
        model.metadata.uid = Some("uid-1".into());
        model
    }

    #[test]
    fn selector_is_a_subset_of_the_labels() {
        let labels = labels(&model());
        for (k, v) in selector(&model()) {
            assert_eq!(labels.get(&k), Some(&v), "{k}");
        }
        assert_eq!(labels[MANAGED_BY], "nereid-operator");
        assert_eq!(labels[INSTANCE], "resnet");
    }

    #[test]
    fn selector_string_is_sorted_key_value_pairs() {
        assert_eq!(
            selector_string(&model()),
            "app.kubernetes.io/name=nereid-server,serving.nereid.dev/model=resnet"
        );
    }

    #[test]
    fn owner_reference_is_a_blocking_controller_reference() {
        let refs = owner_references(&model());
        assert_eq!(refs.len(), 1);
        let owner = &refs[0];
        assert_eq!(owner.api_version, "serving.nereid.dev/v1alpha1");
        assert_eq!(owner.kind, "InferenceModel");
        assert_eq!(owner.name, "resnet");
        assert_eq!(owner.uid, "uid-1");
        assert_eq!(owner.controller, Some(true));
        assert_eq!(owner.block_owner_deletion, Some(true));
    }

    #[test]
    fn object_meta_is_namespaced_labelled_and_owned() {
        let meta = object_meta(&model(), "resnet-config".into());
        assert_eq!(meta.name.as_deref(), Some("resnet-config"));
        assert_eq!(meta.namespace.as_deref(), Some("ml"));
        assert_eq!(meta.labels, Some(labels(&model())));
        assert_eq!(meta.owner_references.unwrap().len(), 1);
    }
}
