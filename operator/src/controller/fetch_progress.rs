//! Asks a pod that is downloading its model how far it is: its init
//! container's `nereid-fetch` serves that while it runs
//! ([`nereid_proto::contract::fetch_progress`]). Best effort, like the
//! loaded versions: a pod that does not answer in time changes nothing.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nereid_proto::contract::fetch_progress;

use crate::builders::deployment::FETCH_CONTAINER;
use crate::status::fetch::FetchProgress;

/// How long the question may take.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The first pod (not going away) whose fetch container is running, by
/// name and IP.
pub fn fetching_pod(pods: &[Pod]) -> Option<(&str, &str)> {
    pods.iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .find_map(|pod| {
            let status = pod.status.as_ref()?;
            let running =
                status.init_container_statuses.iter().flatten().any(|c| {
                    c.name.starts_with(FETCH_CONTAINER) && c.state.as_ref().is_some_and(|s| s.running.is_some())
                });
            running.then_some(())?;
            Some((pod.metadata.name.as_deref()?, status.pod_ip.as_deref()?))
        })
}

/// How far the first fetching pod is; `None` when no pod fetches or none answers.
pub async fn query(pods: &[Pod]) -> Option<FetchProgress> {
    let (name, ip) = fetching_pod(pods)?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let url = format!("http://{host}:{}{}", fetch_progress::PORT, fetch_progress::PATH);
    let client = crate::pod_http::client(TIMEOUT).ok()?;
    let response = client.get(&url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    FetchProgress::from_json(name, &response.json().await.ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ContainerState, ContainerStateRunning, ContainerStatus, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, fetching: bool) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            status: Some(PodStatus {
                pod_ip: Some("10.244.0.7".into()),
                init_container_statuses: Some(vec![ContainerStatus {
                    name: FETCH_CONTAINER.into(),
                    state: Some(ContainerState {
                        running: fetching.then(ContainerStateRunning::default),
                        ..ContainerState::default()
                    }),
                    ..ContainerStatus::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn finds_the_pod_whose_fetch_runs() {
        assert_eq!(
            fetching_pod(&[pod("a", false), pod("b", true)]),
            Some(("b", "10.244.0.7"))
        );
        assert_eq!(fetching_pod(&[pod("a", false)]), None);
    }
}
