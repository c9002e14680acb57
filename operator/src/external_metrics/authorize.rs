//! May this user read this metric? Asked of the API server with a
//! SubjectAccessReview, as Kubernetes' own aggregated servers do (the
//! operator's account holds `system:auth-delegator` for it): the answer is
//! the cluster's RBAC, not a rule of the operator's own.

use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::Api;
use kube::api::PostParams;

use super::requestheader::User;

/// The API group the operator serves.
pub const GROUP: &str = "external.metrics.k8s.io";
pub const VERSION: &str = "v1beta1";

/// The verdict on one request.
#[derive(Debug, PartialEq)]
pub enum Decision {
    Allowed,
    /// Refused, with the authorizer's reason when it gave one.
    Denied(String),
}

/// Asks whether `user` may `verb` the metric `resource` in `namespace`
/// (reading a metric with a label selector is a `list`, as the HPA
/// controller's role grants it).
pub async fn review(
    client: &kube::Client,
    user: &User,
    verb: &str,
    namespace: Option<&str>,
    resource: &str,
) -> Result<Decision, kube::Error> {
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.name.clone()),
            groups: Some(user.groups.clone()),
            extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(GROUP.into()),
                version: Some(VERSION.into()),
                resource: Some(resource.into()),
                namespace: namespace.map(str::to_string),
                verb: Some(verb.into()),
                ..ResourceAttributes::default()
            }),
            ..SubjectAccessReviewSpec::default()
        },
        ..SubjectAccessReview::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let status = answer.status.unwrap_or_default();
    Ok(if status.allowed && !status.denied.unwrap_or(false) {
        Decision::Allowed
    } else {
        Decision::Denied(status.reason.unwrap_or_default())
    })
}
