//! KEDA's External Scaler service over real gRPC: a client generated from
//! the same protocol KEDA speaks calls the operator's service on loopback,
//! with the scraper's board holding known figures; in plaintext, and over
//! TLS and mutual TLS with the certificates of `testdata/keda`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt;
use hyper_util::rt::TokioIo;
use nereid_operator::autoscaling::figures::{Figures, ModelKey};
use nereid_operator::autoscaling::scraper::Board;
use nereid_operator::external_scaler::scope::Scope;
use nereid_operator::external_scaler::{Scaler, TlsFiles, Transport, serve_on};
use nereid_proto::keda::external_scaler_client::ExternalScalerClient;
use nereid_proto::keda::{GetMetricsRequest, ScaledObjectRef};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

fn key(model: &str) -> ModelKey {
    ModelKey {
        namespace: "ml".into(),
        model: model.into(),
    }
}

/// The models the operator serves: those with figures, and `sleeping`
/// (scaled to zero: served, but no pod to scrape).
fn served() -> Scope {
    let models: BTreeSet<ModelKey> = ["busy", "idle", "silent", "sleeping", "waking"]
        .into_iter()
        .map(key)
        .collect();
    Scope::new(Some(vec!["ml".to_string()]), Arc::new(models))
}

/// The service on an ephemeral loopback port with `transport`; its address.
async fn start(board: Arc<Board>, transport: Transport) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let scaler = Scaler::new(board, Duration::from_millis(20), served());
    // Never cancelled: the runtime's end stops the service.
    serve_on(listener, transport, scaler, &CancellationToken::new()).unwrap();
    address
}

/// The service in plaintext on an ephemeral loopback port, and a client for it.
async fn serve(board: Arc<Board>) -> ExternalScalerClient<Channel> {
    let address = start(board, Transport::Plaintext).await;
    ExternalScalerClient::connect(format!("http://{address}"))
        .await
        .unwrap()
}

fn scaled_object(name: &str, metadata: &[(&str, &str)]) -> ScaledObjectRef {
    ScaledObjectRef {
        name: name.into(),
        namespace: "ml".into(),
        scaler_metadata: metadata
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<HashMap<_, _>>(),
    }
}

fn board() -> Arc<Board> {
    let board = Arc::new(Board::default());
    board.publish(BTreeMap::from([
        (
            key("busy"),
            Figures {
                ready_pods: 2,
                scraped_pods: 2,
                queue_time_us: 1500.5,
                pending: 6.0,
                inference_rate: 120.0,
                gpu_percent: None,
                requests: 0.0,
                ..Figures::default()
            },
        ),
        (
            // Woken from zero: its pod is starting, nothing is served yet.
            key("waking"),
            Figures {
                starting_pods: 1,
                ..Figures::default()
            },
        ),
        (
            key("idle"),
            Figures {
                ready_pods: 1,
                scraped_pods: 1,
                ..Figures::default()
            },
        ),
        (
            key("silent"),
            Figures {
                ready_pods: 2,
                scraped_pods: 0,
                ..Figures::default()
            },
        ),
    ]));
    board
}

#[tokio::test]
async fn metric_spec_and_values_come_from_the_board() {
    let mut client = serve(board()).await;
    let busy = scaled_object("busy", &[("metric", "queueTimeMicros"), ("target", "1k")]);
    let spec = client.get_metric_spec(busy.clone()).await.unwrap().into_inner();
    assert_eq!(spec.metric_specs.len(), 1);
    assert_eq!(spec.metric_specs[0].metric_name, "nereid_queue_time_microseconds");
    assert_eq!(spec.metric_specs[0].target_size_float, 1000.0);
    assert_eq!(spec.metric_specs[0].target_size, 1000);

    let values = client
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(busy),
            metric_name: "s0-nereid_queue_time_microseconds".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(values.metric_values.len(), 1);
    let value = &values.metric_values[0];
    assert_eq!(value.metric_name, "s0-nereid_queue_time_microseconds");
    assert_eq!(value.metric_value_float, 1500.5);
    assert_eq!(value.metric_value, 1501);

    // The external metric name works as well as the CRD's spelling, and the
    // model defaults to the ScaledObject's name.
    let pending = scaled_object("busy", &[("metric", "nereid_pending_requests"), ("target", "4")]);
    let values = client
        .get_metrics(GetMetricsRequest {
            scaled_object_ref: Some(pending),
            metric_name: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(values.metric_values[0].metric_value_float, 6.0);
    assert_eq!(values.metric_values[0].metric_name, "nereid_pending_requests");
}

#[tokio::test]
async fn activity_follows_the_load() {
    let mut client = serve(board()).await;
    let active = |name: &str| scaled_object("so", &[("model", name), ("target", "1")]);
    assert!(client.is_active(active("busy")).await.unwrap().into_inner().result);
    assert!(!client.is_active(active("idle")).await.unwrap().into_inner().result);
    // Served but scaled to zero: no figures, no work.
    assert!(!client.is_active(active("sleeping")).await.unwrap().into_inner().result);
    // The gateway holds its requests and asked for a replica: keep it.
    assert!(client.is_active(active("waking")).await.unwrap().into_inner().result);

    let board = board();
    let mut client = serve(board.clone()).await;
    let mut stream = client.stream_is_active(active("idle")).await.unwrap().into_inner();
    let first = stream.next().await.unwrap().unwrap();
    assert!(!first.result, "the answer now comes first");
    let mut figures = (*board.snapshot()).clone();
    figures.get_mut(&key("idle")).unwrap().pending = 1.0;
    board.publish(figures);
    let changed = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("a change is pushed")
        .unwrap()
        .unwrap();
    assert!(changed.result);
}

/// The status of a call that must fail.
fn code<T>(result: Result<tonic::Response<T>, tonic::Status>) -> (Code, String) {
    match result {
        Ok(_) => panic!("expected an error"),
        Err(status) => (status.code(), status.message().to_string()),
    }
}

#[tokio::test]
async fn bad_triggers_and_missing_figures_have_the_right_status() {
    let mut client = serve(board()).await;
    let (status, message) = code(
        client
            .get_metric_spec(scaled_object("busy", &[("target", "lots")]))
            .await,
    );
    assert_eq!(status, Code::InvalidArgument);
    assert!(message.contains("metadata.target"), "{message}");
    let (status, message) = code(
        client
            .get_metric_spec(scaled_object("busy", &[("metric", "cpu"), ("target", "1")]))
            .await,
    );
    assert_eq!(status, Code::InvalidArgument);
    assert!(message.contains("\"cpu\""), "{message}");

    let metrics = |name: &str, metric: &str| GetMetricsRequest {
        scaled_object_ref: Some(scaled_object(name, &[("metric", metric), ("target", "1")])),
        metric_name: String::new(),
    };
    let (status, _) = code(client.get_metrics(metrics("sleeping", "queueTimeMicros")).await);
    assert_eq!(status, Code::NotFound, "no serving pods");
    let (status, message) = code(client.get_metrics(metrics("silent", "queueTimeMicros")).await);
    assert_eq!(status, Code::Unavailable);
    assert!(message.contains("0 answered"), "{message}");
    let (status, _) = code(client.get_metrics(metrics("busy", "gpuUtilization")).await);
    assert_eq!(status, Code::Unavailable, "no pod reports a GPU");
    let (status, _) = code(
        client
            .get_metrics(GetMetricsRequest {
                scaled_object_ref: None,
                metric_name: String::new(),
            })
            .await,
    );
    assert_eq!(status, Code::InvalidArgument);
}

/// A trigger in `namespace`.
fn elsewhere(namespace: &str, model: &str) -> ScaledObjectRef {
    ScaledObjectRef {
        namespace: namespace.into(),
        ..scaled_object(model, &[("target", "1")])
    }
}

#[tokio::test]
async fn only_served_models_of_watched_namespaces_are_answered() {
    let mut client = serve(board()).await;
    // "busy" has figures in "ml"; the same name in another namespace is not
    // the operator's to tell about, whatever the board holds.
    for (trigger, wanted) in [
        (elsewhere("team-b", "busy"), Code::PermissionDenied),
        (elsewhere("ml", "absent"), Code::NotFound),
    ] {
        let (status, message) = code(client.is_active(trigger.clone()).await);
        assert_eq!(status, wanted, "IsActive: {message}");
        let (status, _) = code(client.get_metric_spec(trigger.clone()).await);
        assert_eq!(status, wanted, "GetMetricSpec");
        let (status, message) = code(
            client
                .get_metrics(GetMetricsRequest {
                    scaled_object_ref: Some(trigger.clone()),
                    metric_name: String::new(),
                })
                .await,
        );
        assert_eq!(status, wanted, "GetMetrics");
        assert!(!message.contains("ready pods"), "no figures told: {message}");
        let (status, _) = code(client.stream_is_active(trigger).await);
        assert_eq!(status, wanted, "StreamIsActive");
    }
}

const CA: &[u8] = include_bytes!("testdata/keda/ca.pem");
const CLIENT_CERT: &[u8] = include_bytes!("testdata/keda/client.pem");
const CLIENT_KEY: &[u8] = include_bytes!("testdata/keda/client.key");
const STRANGER_CERT: &[u8] = include_bytes!("testdata/keda/stranger.pem");
const STRANGER_KEY: &[u8] = include_bytes!("testdata/keda/stranger.key");

fn testdata(file: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/testdata/keda")
        .join(file)
}

/// TLS with the test server certificate (for `keda-scaler.test`), mutual
/// when `mutual`.
fn tls(mutual: bool) -> Transport {
    Transport::Tls(TlsFiles {
        cert: testdata("server.pem"),
        key: testdata("server.key"),
        client_ca: mutual.then(|| testdata("ca.pem")),
    })
}

/// A client's TLS configuration: it trusts the test CA and presents `identity`.
fn client_config(identity: Option<(&[u8], &[u8])>) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(CA).unwrap()).unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert).unwrap()],
                PrivateKeyDer::from_pem_slice(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// Dials `address` over TLS for `keda-scaler.test`, as KEDA dials the Service.
#[derive(Clone)]
struct TlsDialer {
    address: SocketAddr,
    config: Arc<rustls::ClientConfig>,
}

impl tonic::codegen::Service<http::Uri> for TlsDialer {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Uri) -> Self::Future {
        let (address, config) = (self.address, self.config.clone());
        Box::pin(async move {
            let tcp = TcpStream::connect(address).await?;
            let name = ServerName::try_from("keda-scaler.test").map_err(|e| std::io::Error::other(e.to_string()))?;
            let tls = tokio_rustls::TlsConnector::from(config).connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// Whether one IsActive call over TLS with `config` is answered.
async fn answered(address: SocketAddr, config: rustls::ClientConfig) -> bool {
    let dialer = TlsDialer {
        address,
        config: Arc::new(config),
    };
    let call = async {
        let channel = Endpoint::from_static("http://keda-scaler.test")
            .connect_with_connector(dialer)
            .await
            .ok()?;
        let mut client = ExternalScalerClient::new(channel);
        let trigger = scaled_object("so", &[("model", "busy"), ("target", "1")]);
        client.is_active(trigger).await.ok().map(|r| r.into_inner().result)
    };
    let answer = tokio::time::timeout(Duration::from_secs(10), call).await.unwrap();
    if let Some(active) = answer {
        assert!(active, "busy is active");
    }
    answer.is_some()
}

#[tokio::test]
async fn over_tls_the_service_answers_and_plaintext_is_refused() {
    let address = start(board(), tls(false)).await;
    assert!(answered(address, client_config(None)).await);
    // A plaintext client gets nothing.
    let plain = async {
        let mut client = ExternalScalerClient::connect(format!("http://{address}")).await.ok()?;
        client.is_active(scaled_object("busy", &[("target", "1")])).await.ok()
    };
    let plain = tokio::time::timeout(Duration::from_secs(10), plain).await.unwrap();
    assert!(plain.is_none(), "a plaintext call was answered");
}

#[tokio::test]
async fn mutual_tls_answers_only_clients_the_ca_signed() {
    let address = start(board(), tls(true)).await;
    assert!(answered(address, client_config(Some((CLIENT_CERT, CLIENT_KEY)))).await);
    assert!(!answered(address, client_config(None)).await, "no client certificate");
    assert!(
        !answered(address, client_config(Some((STRANGER_CERT, STRANGER_KEY)))).await,
        "a certificate another CA signed"
    );
}
