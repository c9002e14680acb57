//! Everything a ModelEnsemble turns into, from the same builders as an
//! InferenceModel's objects ([`crate::builders`]): a ConfigMap with its
//! model folders ([`super::repository`]), a Deployment of `nereid-server`
//! pods serving the ensemble, a Service named like it (so nereid-gateway
//! routes it like a model), a PodDisruptionBudget and, with
//! `spec.autoscaling`, an HPA or KEDA ScaledObject over its scale
//! subresource.

use nereid_crds::ModelEnsemble;

use super::repository::{self, Member};
use crate::builders::{
    AutoscalerObject, CanaryState, Desired, config_map, deployment, hpa, pdb, scaled_object, service,
};
use crate::context::{Autoscaler, OperatorConfig};

/// The objects of `ensemble` with its `members` (in step order, each once).
pub fn desired(ensemble: &ModelEnsemble, members: &[Member<'_>], config: &OperatorConfig) -> Desired {
    let (config_map, repository) = repository::build(ensemble, members, config);
    let hash = config_map::config_hash(&config_map);
    Desired {
        deployment: deployment::deployment(ensemble, &repository, config, &hash),
        service: service::service(ensemble),
        pdb: pdb::pdb(ensemble),
        network_policy: None,
        canary: CanaryState::Unsupported,
        autoscaler: match &config.autoscaler {
            Autoscaler::Hpa => AutoscalerObject::Hpa(hpa::hpa(ensemble).map(Box::new)),
            Autoscaler::Keda {
                scaler_address,
                trigger_authentication,
            } => AutoscalerObject::Keda(
                scaled_object::scaled_object(ensemble, scaler_address, trigger_authentication.as_deref()).map(Box::new),
            ),
        },
        config_map,
    }
}
