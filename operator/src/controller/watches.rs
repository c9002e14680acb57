//! Which InferenceModels an event on another object concerns.
//!
//! Owned objects map back through their owner reference (kube's `owns`);
//! this is the relation that is not ownership.

use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use nereid_crds::InferenceModel;

use crate::builders::{canary, labels};

/// The model a serving pod belongs to, by its `serving.nereid.dev/model`
/// label, or the model a canary's pod is the canary of.
pub fn model_of_pod(pod: &Pod) -> Option<ObjectRef<InferenceModel>> {
    let labels = pod.labels();
    let model = labels.get(canary::CANARY_OF).or_else(|| labels.get(labels::MODEL))?;
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
        pod.labels_mut().insert(canary::CANARY_OF.into(), "two".into());
        assert_eq!(model_of_pod(&pod), Some(ObjectRef::new("two").within("a")));
    }
}
