//! The scrape loop: every interval, list the serving pods, read every ready
//! one's /metrics in parallel (one shared HTTP client, a bounded time per
//! pod), and publish each model's figures on the [`Board`].
//!
//! Every operator replica scrapes, standbys included: the external metrics
//! API's Service sends the API server to any of them.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;

use super::exposition::{self, Sample};
use super::figures::{Figures, Histories, ModelKey, PodScrape};
use crate::builders::deployment::SERVER_CONTAINER;
use crate::builders::labels;
use crate::metrics::Metrics;

/// Pods scraped at once; more wait for a free slot.
const PARALLEL: usize = 64;
/// A /metrics body larger than this is not a serving pod's.
const MAX_BODY: usize = 4 << 20;

/// How often and how patiently to scrape, and over what window to average.
#[derive(Clone, Copy, Debug)]
pub struct ScrapeSettings {
    pub interval: Duration,
    pub timeout: Duration,
    pub window: Duration,
}

/// The latest figures of every model, shared by the scraper (which writes
/// them once a round) and their readers (the metrics APIs, the status).
#[derive(Debug, Default)]
pub struct Board {
    figures: RwLock<Arc<BTreeMap<ModelKey, Figures>>>,
}

impl Board {
    /// The figures of one model, if it has serving pods.
    pub fn get(&self, namespace: &str, model: &str) -> Option<Figures> {
        let key = ModelKey {
            namespace: namespace.to_string(),
            model: model.to_string(),
        };
        self.snapshot().get(&key).cloned()
    }

    /// Every model's figures from the latest round.
    pub fn snapshot(&self) -> Arc<BTreeMap<ModelKey, Figures>> {
        self.figures.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn publish(&self, figures: BTreeMap<ModelKey, Figures>) {
        *self.figures.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(figures);
    }
}

/// Scrapes until `stop` is cancelled. `namespaces` scopes the pod lists as
/// the controller's watches are scoped (`None`: the whole cluster).
pub async fn run(
    client: kube::Client,
    namespaces: Option<Vec<String>>,
    settings: ScrapeSettings,
    board: Arc<Board>,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    let http = match crate::pod_http::client(settings.timeout) {
        Ok(http) => http,
        Err(error) => {
            tracing::error!(%error, "cannot build the HTTP client that scrapes the serving pods");
            return;
        }
    };
    let apis: Vec<Api<Pod>> = match &namespaces {
        None => vec![Api::all(client)],
        Some(namespaces) => namespaces.iter().map(|n| Api::namespaced(client.clone(), n)).collect(),
    };
    let mut histories = Histories::new(settings.window);
    let mut ticks = tokio::time::interval(settings.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        let started = Instant::now();
        let pods = match list_serving_pods(&apis).await {
            Ok(pods) => pods,
            Err(error) => {
                // Keep the last figures rather than publish an empty board.
                tracing::warn!(%error, "cannot list the serving pods to scrape");
                continue;
            }
        };
        // Owned futures: a stream of borrowing ones is not `Send` enough for a spawned task.
        let jobs = pods.into_iter().map(|pod| {
            let http = http.clone();
            async move { scrape(&http, &pod).await }
        });
        let scrapes: Vec<PodScrape> = futures::stream::iter(jobs).buffer_unordered(PARALLEL).collect().await;
        for scrape in scrapes.iter().filter(|s| s.ready) {
            metrics.pod_scraped(&scrape.model.namespace, &scrape.model.model, scrape.sample.is_some());
        }
        let figures = histories.round(Instant::now(), &scrapes);
        metrics.set_model_figures(&figures);
        board.publish(figures);
        metrics.scrape_round(started.elapsed().as_secs_f64());
    }
}

async fn list_serving_pods(apis: &[Api<Pod>]) -> Result<Vec<Pod>, kube::Error> {
    let selector = format!("{}={},{}", labels::NAME, labels::SERVER_APP, labels::managed_selector());
    // resourceVersion=0: from the API server's watch cache, as a reflector would.
    let params = ListParams::default().labels(&selector).match_any();
    let mut pods = Vec::new();
    for api in apis {
        pods.extend(api.list(&params).await?.items);
    }
    Ok(pods)
}

/// Scrapes one pod if it is ready; a pod that is not, or whose model or
/// address cannot be told, comes back without a sample.
async fn scrape(http: &reqwest::Client, pod: &Pod) -> PodScrape {
    let model = ModelKey {
        namespace: pod.namespace().unwrap_or_default(),
        model: pod.labels().get(labels::MODEL).cloned().unwrap_or_default(),
    };
    let uid = pod.uid().unwrap_or_default();
    let Some(url) = metrics_url(pod) else {
        return PodScrape {
            model,
            uid,
            ready: false,
            starting: pod.metadata.deletion_timestamp.is_none(),
            sample: None,
        };
    };
    let sample = match fetch(http, &url).await {
        Ok(sample) => Some(sample),
        Err(error) => {
            tracing::debug!(pod = %pod.name_any(), %url, %error, "scrape failed; pod left out of this round");
            None
        }
    };
    PodScrape {
        model,
        uid,
        ready: true,
        starting: false,
        sample,
    }
}

/// `http://<pod IP>:<metrics port>/metrics` of a ready pod that is not
/// being deleted; `None` for any other.
fn metrics_url(pod: &Pod) -> Option<String> {
    if pod.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let status = pod.status.as_ref()?;
    let ready = status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True");
    let ip: std::net::IpAddr = status.pod_ip.as_deref()?.parse().ok()?;
    let port = pod
        .spec
        .as_ref()?
        .containers
        .iter()
        .find(|c| c.name == SERVER_CONTAINER)?
        .ports
        .iter()
        .flatten()
        .find(|p| p.name.as_deref() == Some("metrics"))?
        .container_port;
    ready.then(|| format!("http://{}/metrics", std::net::SocketAddr::new(ip, port as u16)))
}

#[derive(Debug, thiserror::Error)]
enum ScrapeError {
    #[error(transparent)]
    Http(#[from] reqwest::Error),
    #[error("answered HTTP {0}")]
    Status(reqwest::StatusCode),
    #[error("the body is over {MAX_BODY} bytes")]
    TooLarge,
    #[error("the body is not UTF-8")]
    NotText,
    #[error(transparent)]
    Parse(#[from] exposition::ParseError),
}

async fn fetch(http: &reqwest::Client, url: &str) -> Result<Sample, ScrapeError> {
    let mut response = http.get(url).send().await?;
    if !response.status().is_success() {
        return Err(ScrapeError::Status(response.status()));
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(ScrapeError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    let text = std::str::from_utf8(&body).map_err(|_| ScrapeError::NotText)?;
    Ok(exposition::parse(text)?)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodCondition, PodSpec, PodStatus};

    use super::*;

    fn pod(ready: &str, ip: Option<&str>) -> Pod {
        Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: SERVER_CONTAINER.into(),
                    ports: Some(vec![
                        ContainerPort {
                            name: Some("http".into()),
                            container_port: 8000,
                            ..ContainerPort::default()
                        },
                        ContainerPort {
                            name: Some("metrics".into()),
                            container_port: 8002,
                            ..ContainerPort::default()
                        },
                    ]),
                    ..Container::default()
                }],
                ..PodSpec::default()
            }),
            status: Some(PodStatus {
                pod_ip: ip.map(str::to_string),
                conditions: Some(vec![PodCondition {
                    type_: "Ready".into(),
                    status: ready.into(),
                    ..PodCondition::default()
                }]),
                ..PodStatus::default()
            }),
            ..Pod::default()
        }
    }

    /// A one-connection HTTP server on loopback that answers `response`
    /// verbatim, or never answers when it is `None`.
    async fn server(response: Option<String>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            match response {
                Some(response) => stream.write_all(response.as_bytes()).await.unwrap(),
                None => tokio::time::sleep(Duration::from_secs(30)).await,
            }
        });
        format!("http://{address}/metrics")
    }

    /// The client the scraper uses, with a short timeout.
    fn client() -> reqwest::Client {
        crate::pod_http::client(Duration::from_millis(300)).unwrap()
    }

    #[tokio::test]
    async fn a_server_is_read_and_anything_else_is_an_error() {
        let body = "nv_inference_count{model=\"m\",version=\"1\"} 7\n";
        let ok = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
        let sample = fetch(&client(), &server(Some(ok)).await).await.unwrap();
        assert_eq!(sample.inferences, 7.0);

        let garbage = "HTTP/1.1 200 OK\r\ncontent-length: 14\r\n\r\n<html>no</html".to_string();
        let error = fetch(&client(), &server(Some(garbage)).await).await.unwrap_err();
        assert!(matches!(error, ScrapeError::Parse(_)), "{error}");

        let refused = "HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\n\r\n".to_string();
        let error = fetch(&client(), &server(Some(refused)).await).await.unwrap_err();
        assert!(matches!(error, ScrapeError::Status(_)), "{error}");

        // A pod that never answers: the client's timeout ends the wait.
        let error = fetch(&client(), &server(None).await).await.unwrap_err();
        assert!(matches!(error, ScrapeError::Http(_)), "{error}");
    }

    #[tokio::test]
    async fn a_redirect_is_not_followed() {
        // Where a pod would send the scraper: it must never be asked.
        let elsewhere = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = format!("http://{}/metrics", elsewhere.local_addr().unwrap());
        let redirect = format!("HTTP/1.1 302 Found\r\nlocation: {target}\r\ncontent-length: 0\r\n\r\n");
        let error = fetch(&client(), &server(Some(redirect)).await).await.unwrap_err();
        assert!(
            matches!(error, ScrapeError::Status(status) if status == reqwest::StatusCode::FOUND),
            "{error}"
        );
        let asked = tokio::time::timeout(Duration::from_millis(200), elsewhere.accept()).await;
        assert!(asked.is_err(), "the redirect's target was called");
    }

    #[test]
    fn only_ready_pods_with_an_address_are_scraped_on_their_metrics_port() {
        assert_eq!(
            metrics_url(&pod("True", Some("10.244.0.7"))).as_deref(),
            Some("http://10.244.0.7:8002/metrics")
        );
        assert_eq!(
            metrics_url(&pod("True", Some("fd00::7"))).as_deref(),
            Some("http://[fd00::7]:8002/metrics")
        );
        assert_eq!(metrics_url(&pod("False", Some("10.244.0.7"))), None);
        assert_eq!(metrics_url(&pod("True", None)), None);
        let mut leaving = pod("True", Some("10.244.0.7"));
        leaving.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        assert_eq!(metrics_url(&leaving), None);
    }
}
