//! Which InferenceModels an event on another object concerns.
//!
//! Owned objects map back through their owner reference (kube's `owns`);
//! these are the two relations that are not ownership.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use nereid_crds::InferenceModel;

use crate::builders::labels;

/// The models in `secret`'s namespace whose `spec.source.credentialsSecret`
/// names it (so creating a missing Secret fixes them at once).
pub fn models_naming_secret(models: &[Arc<InferenceModel>], secret: &Secret) -> Vec<ObjectRef<InferenceModel>> {
    let namespace = secret.namespace();
    let name = secret.name_any();
    models
        .iter()
        .filter(|m| m.namespace() == namespace && m.spec.source.credentials_secret.as_deref() == Some(name.as_str()))
        .map(|m| ObjectRef::from_obj(m.as_ref()))
        .collect()
}

/// The model a serving pod belongs to, by its `serving.nereid.dev/model` label.
pub fn model_of_pod(pod: &Pod) -> Option<ObjectRef<InferenceModel>> {
    let model = pod.labels().get(labels::MODEL)?;
    let namespace = pod.namespace()?;
    Some(ObjectRef::new(model).within(&namespace))
}

#[cfg(test)]
mod tests {
    use nereid_crds::{InferenceModelSpec, ModelSource};

    use super::*;

    fn model(namespace: &str, name: &str, secret: Option<&str>) -> Arc<InferenceModel> {
        let mut m = InferenceModel::new(
            name,
            InferenceModelSpec {
                source: ModelSource {
                    uri: "s3://b/m".into(),
                    credentials_secret: secret.map(str::to_string),
                    ..ModelSource::default()
                },
                ..InferenceModelSpec::default()
            },
        );
        m.metadata.namespace = Some(namespace.into());
        Arc::new(m)
    }

    #[test]
    fn a_secret_maps_to_the_models_of_its_namespace_that_name_it() {
        let models = [
            model("a", "one", Some("creds")),
            model("a", "two", Some("other")),
            model("b", "three", Some("creds")),
            model("a", "four", None),
        ];
        let mut secret = Secret::default();
        secret.metadata.name = Some("creds".into());
        secret.metadata.namespace = Some("a".into());
        let refs = models_naming_secret(&models, &secret);
        assert_eq!(refs, vec![ObjectRef::new("one").within("a")]);
    }

    #[test]
    fn a_pod_maps_to_its_model_by_label() {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("a".into());
        assert_eq!(model_of_pod(&pod), None);
        pod.metadata.labels = Some([(labels::MODEL.to_string(), "one".to_string())].into());
        assert_eq!(model_of_pod(&pod), Some(ObjectRef::new("one").within("a")));
    }
}
