//! `status.loadedVersions`: which versions the serving pods report ready.
//!
//! Asked of one ready pod directly (its model metadata lists the ready
//! versions), over the pod network the operator already reaches; no extra
//! RBAC. Best effort: when no pod answers in time the previous value stays,
//! since an unanswered probe says nothing about what is loaded.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

/// How long one metadata call may take.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The first ready pod with an IP.
pub fn ready_pod_ip(pods: &[Pod]) -> Option<&str> {
    pods.iter()
        .filter(|pod| pod.metadata.deletion_timestamp.is_none())
        .filter(|pod| {
            pod.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .find_map(|pod| pod.status.as_ref()?.pod_ip.as_deref())
}

/// The `versions` of a KServe v2 model metadata document.
pub fn versions_of(metadata: &serde_json::Value) -> Option<Vec<String>> {
    let versions = metadata.get("versions")?.as_array()?;
    versions.iter().map(|v| v.as_str().map(str::to_string)).collect()
}

/// Asks a ready pod for the model's ready versions.
pub async fn query(pods: &[Pod], model: &str, http_port: i32) -> Option<Vec<String>> {
    versions_of(&ask_a_ready_pod(pods, &format!("/v2/models/{model}"), http_port).await?)
}

/// GETs `path` from one ready pod's HTTP port: its JSON answer, or `None`
/// when no pod is ready or none answers with JSON in time.
pub async fn ask_a_ready_pod(pods: &[Pod], path: &str, http_port: i32) -> Option<serde_json::Value> {
    let ip = ready_pod_ip(pods)?;
    let host = if ip.contains(':') {
        format!("[{ip}]")
    } else {
        ip.to_string()
    };
    let url = format!("http://{host}:{http_port}{path}");
    // Never follows a redirect: the pod's answer is not to be trusted.
    let client = crate::pod_http::client(TIMEOUT).ok()?;
    let response = client.get(&url).send().await.ok()?;
    if !response.status().is_success() {
        return None;
    }
    response.json().await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodCondition, PodStatus};
    use serde_json::json;

    fn pod(ip: Option<&str>, ready: bool) -> Pod {
        Pod {
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_string),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: if ready { "True" } else { "False" }.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn picks_a_ready_pod_and_reads_versions() {
        let pods = [
            pod(Some("127.0.0.11"), false),
            pod(None, true),
            pod(Some("127.0.0.13"), true),
        ];
        assert_eq!(ready_pod_ip(&pods), Some("127.0.0.13"));
        assert_eq!(ready_pod_ip(&pods[..2]), None);
        assert_eq!(
            versions_of(&json!({"versions": ["1", "3"]})),
            Some(vec!["1".into(), "3".into()])
        );
        assert_eq!(versions_of(&json!({"name": "m"})), None);
    }

    #[tokio::test]
    async fn asks_the_pod_over_http() {
        // A stand-in for a serving pod on loopback.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = axum::Router::new().route(
            "/v2/models/resnet",
            axum::routing::get(|| async { axum::Json(json!({"name": "resnet", "versions": ["2"]})) }),
        );
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let pods = [pod(Some("127.0.0.1"), true)];
        assert_eq!(
            query(&pods, "resnet", i32::from(port)).await,
            Some(vec!["2".to_string()])
        );
        assert_eq!(query(&pods, "other", i32::from(port)).await, None);
        server.abort();
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed() {
        // A pod that sends the operator elsewhere (here: to a route that
        // would answer) gets no answer read.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let app = axum::Router::new()
            .route(
                "/v2/models/resnet",
                axum::routing::get(|| async { axum::response::Redirect::temporary("/elsewhere") }),
            )
            .route(
                "/elsewhere",
                axum::routing::get(|| async { axum::Json(json!({"name": "resnet", "versions": ["9"]})) }),
            );
        let server = tokio::spawn(async move { axum::serve(listener, app).await });
        let pods = [pod(Some("127.0.0.1"), true)];
        assert_eq!(query(&pods, "resnet", i32::from(port)).await, None);
        server.abort();
    }
}
