//! KEDA's External Scaler service over real gRPC: a client generated from
//! the same protocol KEDA speaks calls the operator's service on loopback,
//! with the scraper's board holding known figures.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use nereid_operator::autoscaling::figures::{Figures, ModelKey};
use nereid_operator::autoscaling::scraper::Board;
use nereid_operator::external_scaler::Scaler;
use nereid_proto::keda::external_scaler_client::ExternalScalerClient;
use nereid_proto::keda::{GetMetricsRequest, ScaledObjectRef};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::Code;
use tonic::transport::Channel;

fn key(model: &str) -> ModelKey {
    ModelKey {
        namespace: "ml".into(),
        model: model.into(),
    }
}

/// The service on an ephemeral loopback port, and a client for it.
async fn serve(board: Arc<Board>) -> ExternalScalerClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Scaler::new(board, Duration::from_millis(20)).into_service())
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
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
    assert!(!client.is_active(active("absent")).await.unwrap().into_inner().result);

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
    let (status, _) = code(client.get_metrics(metrics("absent", "queueTimeMicros")).await);
    assert_eq!(status, Code::NotFound);
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
