//! Which InferenceModels an event on another object concerns.
//!
//! Owned objects map back through their owner reference (kube's `owns`);
//! this is the relation that is not ownership.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use nereid_crds::InferenceModel;

use crate::builders::labels;

/// The model a serving pod belongs to, by its `serving.nereid.dev/model` label.
pub fn model_of_pod(pod: &Pod) -> Option<ObjectRef<InferenceModel>> {
    let model = pod.labels().get(labels::MODEL)?;
    let namespace = pod.namespace()?;
    Some(ObjectRef::new(model).within(&namespace))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_maps_to_its_model_by_label() {
        let mut pod = Pod::default();
        pod.metadata.namespace = Some("a".into());
        assert_eq!(model_of_pod(&pod), None);
        pod.metadata.labels = Some([(labels::MODEL.to_string(), "one".to_string())].into());
        assert_eq!(model_of_pod(&pod), Some(ObjectRef::new("one").within("a")));
    }
}
