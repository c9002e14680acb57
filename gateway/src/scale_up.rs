//! The [`Waker`] of a cluster: sets a sleeping InferenceModel's replicas
//! from 0 to 1 through its scale subresource, the one write the gateway's
//! ServiceAccount may make (`update` on `inferencemodels/scale`).
//!
//! The write carries the resourceVersion it read, so it never overwrites a
//! count the HPA, KEDA or a user set meanwhile: a conflict means someone
//! else changed the replicas, and the activation loop looks again.

use futures::future::BoxFuture;
use k8s_openapi::api::autoscaling::v1::{Scale, ScaleSpec};
use kube::api::PostParams;
use kube::{Api, Client};
use nereid_crds::InferenceModel;

use crate::activation::Waker;
use crate::registry::ModelKey;

/// Wakes models through the Kubernetes API.
pub struct ScaleUp {
    client: Client,
}

impl ScaleUp {
    pub fn new(client: Client) -> Self {
        ScaleUp { client }
    }
}

impl Waker for ScaleUp {
    fn wake(&self, model: &ModelKey) -> BoxFuture<'static, Result<bool, String>> {
        let api: Api<InferenceModel> = Api::namespaced(self.client.clone(), &model.namespace);
        let name = model.name.clone();
        Box::pin(async move {
            let scale = api
                .get_scale(&name)
                .await
                .map_err(|e| format!("reading the scale of {name}: {e}"))?;
            if scale.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0) > 0 {
                return Ok(false);
            }
            let awake = Scale {
                metadata: scale.metadata,
                spec: Some(ScaleSpec { replicas: Some(1) }),
                status: None,
            };
            match api.replace_scale(&name, &PostParams::default(), &awake).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
                Err(error) => Err(format!("setting one replica of {name}: {error}")),
            }
        })
    }
}
