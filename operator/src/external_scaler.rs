//! KEDA's External Scaler gRPC service, for clusters that run KEDA: a
//! ScaledObject with an `external` trigger pointing at the operator scales
//! an InferenceModel on the same figures the external metrics API serves
//! ([`crate::autoscaling`]), including down to zero replicas.
//!
//! The trigger's metadata names the model and the metric:
//!
//! ```yaml
//! triggers:
//!   - type: external
//!     metricType: Value          # AverageValue for pendingRequests, inferenceRate
//!     metadata:
//!       scalerAddress: nereid-operator-keda.nereid-system:9090
//!       model: resnet            # default: the ScaledObject's name
//!       metric: queueTimeMicros  # default; or the external metric name
//!       target: "500"
//!     authenticationRef:         # with TLS: caCert, and tlsClientCert and
//!       kind: ClusterTriggerAuthentication   # tlsClientKey for mutual TLS
//!       name: nereid-keda-scaler
//! ```
//!
//! `IsActive` is true while the model has work (requests pending or
//! inferences in the window) or a pod on its way up. KEDA scales a model
//! with `minReplicaCount: 0` to zero once it has said false for the
//! ScaledObject's `cooldownPeriod` (the model's `scaleToZeroAfter`). From
//! zero, nereid-gateway wakes the model: it holds the model's requests and
//! sets one replica through the scale subresource; the pod that starts
//! makes IsActive true at the next scrape, so KEDA keeps it, and its
//! requests keep it true from then on.
//!
//! Who is answered ([`scope`]): only triggers naming a namespace the
//! operator watches (else PERMISSION_DENIED) and a model it serves there
//! (else NOT_FOUND). How ([`tls`]): over TLS, with mutual TLS when a client
//! CA is given so that only KEDA (holding a certificate that CA signed) can
//! call; plaintext only when explicitly asked for
//! (`--keda-scaler-plaintext`), since then anyone who reaches the port reads
//! the figures of every model in scope.

pub mod scope;
pub mod tls;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::Stream;
use nereid_crds::AutoscalingMetric;
use nereid_crds::validate::parse_quantity;
use nereid_proto::keda::external_scaler_server::{ExternalScaler, ExternalScalerServer};
use nereid_proto::keda::{
    GetMetricSpecResponse, GetMetricsRequest, GetMetricsResponse, IsActiveResponse, MetricSpec, MetricValue,
    ScaledObjectRef,
};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use self::scope::Scope;
use crate::autoscaling::figures::Figures;
use crate::autoscaling::scraper::Board;

/// Where and how the service is served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServeSettings {
    pub address: SocketAddr,
    pub transport: Transport,
}

/// The service's transport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Transport {
    /// TLS with these files.
    Tls(TlsFiles),
    /// No TLS, asked for explicitly: anyone who reaches the port may call.
    Plaintext,
}

/// The service's certificate and key, and for mutual TLS the CA its
/// clients' certificates must be signed by (all PEM files).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

/// Binds `settings.address` and serves `scaler` until `stop`.
pub async fn start(
    settings: ServeSettings,
    scaler: Scaler,
    stop: &CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let listener = TcpListener::bind(settings.address).await.with_context(|| {
        format!(
            "cannot listen on {} for KEDA's External Scaler service",
            settings.address
        )
    })?;
    serve_on(listener, settings.transport, scaler, stop)
}

/// Serves `scaler` on `listener` with `transport` until `stop`.
pub fn serve_on(
    listener: TcpListener,
    transport: Transport,
    scaler: Scaler,
    stop: &CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let address = listener.local_addr()?;
    let service = scaler.into_service();
    match transport {
        Transport::Tls(files) => {
            let mutual = files.client_ca.is_some();
            let config = tls::load(files, stop).context("KEDA's External Scaler service's certificate")?;
            tracing::info!(%address, mutual, "serving KEDA's External Scaler protocol over TLS");
            Ok(tokio::spawn(tls::serve(listener, config, service, stop.clone())))
        }
        Transport::Plaintext => {
            tracing::warn!(
                %address,
                "serving KEDA's External Scaler protocol without TLS (--keda-scaler-plaintext): \
                 anyone who reaches this port reads the figures of the models in scope"
            );
            let shutdown = stop.clone().cancelled_owned();
            Ok(tokio::spawn(async move {
                let served = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(TcpListenerStream::new(listener), shutdown)
                    .await;
                if let Err(error) = served {
                    tracing::error!(%error, "KEDA's External Scaler service stopped");
                }
            }))
        }
    }
}

/// The service over the scraper's board.
pub struct Scaler {
    board: Arc<Board>,
    /// How often `StreamIsActive` looks again (the scrape interval).
    poll: Duration,
    /// Which namespaces and models it answers for.
    scope: Scope,
}

impl Scaler {
    pub fn new(board: Arc<Board>, poll: Duration, scope: Scope) -> Self {
        Scaler { board, poll, scope }
    }

    pub fn into_service(self) -> ExternalScalerServer<Scaler> {
        ExternalScalerServer::new(self)
    }

    /// The trigger of `scaled`, when it is well formed and in scope.
    fn trigger(&self, scaled: &ScaledObjectRef) -> Result<Trigger, Status> {
        let trigger = Trigger::of(scaled)?;
        self.scope.admit(&trigger.namespace, &trigger.model)?;
        Ok(trigger)
    }
}

/// What a trigger asks about.
#[derive(Debug, PartialEq)]
struct Trigger {
    namespace: String,
    model: String,
    metric: AutoscalingMetric,
}

impl Trigger {
    fn of(scaled: &ScaledObjectRef) -> Result<Trigger, Status> {
        let metadata = &scaled.scaler_metadata;
        if scaled.namespace.is_empty() {
            return Err(Status::invalid_argument("the ScaledObjectRef has no namespace"));
        }
        let model = metadata
            .get("model")
            .filter(|m| !m.is_empty())
            .unwrap_or(&scaled.name)
            .clone();
        if model.is_empty() {
            return Err(Status::invalid_argument(
                "no model: set metadata.model in the trigger (or name the ScaledObject like the InferenceModel)",
            ));
        }
        let metric = match metadata.get("metric").map(String::as_str) {
            None | Some("") => AutoscalingMetric::QueueTimeMicros,
            Some(name) => metric_named(name).ok_or_else(|| {
                Status::invalid_argument(format!(
                    "metadata.metric {name:?} is not one of queueTimeMicros, pendingRequests, inferenceRate, \
                     gpuUtilization (or their external metric names)"
                ))
            })?,
        };
        Ok(Trigger {
            namespace: scaled.namespace.clone(),
            model,
            metric,
        })
    }

    fn target(scaled: &ScaledObjectRef) -> Result<f64, Status> {
        let target = scaled
            .scaler_metadata
            .get("target")
            .ok_or_else(|| Status::invalid_argument("metadata.target is required (a quantity, e.g. \"500\")"))?;
        parse_quantity(target)
            .filter(|t| *t > 0.0 && t.is_finite())
            .ok_or_else(|| Status::invalid_argument(format!("metadata.target {target:?} is not a positive quantity")))
    }
}

/// `queueTimeMicros` (the CRD's spelling) or `nereid_queue_time_microseconds`.
fn metric_named(name: &str) -> Option<AutoscalingMetric> {
    AutoscalingMetric::from_external_name(name).or_else(|| {
        AutoscalingMetric::ALL
            .into_iter()
            .find(|m| serde_json::to_value(m).ok().as_ref().and_then(|v| v.as_str()) == Some(name))
    })
}

impl Scaler {
    fn figures(&self, trigger: &Trigger) -> Option<Figures> {
        self.board.get(&trigger.namespace, &trigger.model)
    }
}

/// Work is waiting or being done, or a pod is starting to do it (one a
/// wake-up from zero asked for).
fn active(figures: Option<&Figures>) -> bool {
    figures.is_some_and(|f| f.pending > 0.0 || f.inference_rate > 0.0 || f.starting_pods > 0)
}

#[tonic::async_trait]
impl ExternalScaler for Scaler {
    async fn is_active(&self, request: Request<ScaledObjectRef>) -> Result<Response<IsActiveResponse>, Status> {
        let trigger = self.trigger(request.get_ref())?;
        let result = active(self.figures(&trigger).as_ref());
        Ok(Response::new(IsActiveResponse { result }))
    }

    type StreamIsActiveStream = Pin<Box<dyn Stream<Item = Result<IsActiveResponse, Status>> + Send>>;

    /// The answer now, then again whenever it changes; ends when KEDA hangs up.
    async fn stream_is_active(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<Self::StreamIsActiveStream>, Status> {
        let trigger = self.trigger(request.get_ref())?;
        let (board, poll) = (self.board.clone(), self.poll);
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let now = active(board.get(&trigger.namespace, &trigger.model).as_ref());
                if last != Some(now) {
                    if tx.send(Ok(IsActiveResponse { result: now })).await.is_err() {
                        return;
                    }
                    last = Some(now);
                }
                tokio::select! {
                    () = tx.closed() => return,
                    () = tokio::time::sleep(poll) => {}
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn get_metric_spec(
        &self,
        request: Request<ScaledObjectRef>,
    ) -> Result<Response<GetMetricSpecResponse>, Status> {
        let scaled = request.get_ref();
        let trigger = self.trigger(scaled)?;
        let target = Trigger::target(scaled)?;
        Ok(Response::new(GetMetricSpecResponse {
            metric_specs: vec![MetricSpec {
                metric_name: trigger.metric.external_name().into(),
                target_size: target.ceil() as i64,
                target_size_float: target,
            }],
        }))
    }

    async fn get_metrics(&self, request: Request<GetMetricsRequest>) -> Result<Response<GetMetricsResponse>, Status> {
        let request = request.get_ref();
        let scaled = request
            .scaled_object_ref
            .as_ref()
            .ok_or_else(|| Status::invalid_argument("no scaledObjectRef"))?;
        let trigger = self.trigger(scaled)?;
        let figures = self.figures(&trigger).ok_or_else(|| {
            Status::not_found(format!(
                "no serving pods of model {:?} in namespace {:?}",
                trigger.model, trigger.namespace
            ))
        })?;
        let value = figures.value(trigger.metric).ok_or_else(|| {
            Status::unavailable(format!(
                "no {} for model {:?}: {} ready pods, {} answered the last scrape",
                trigger.metric.external_name(),
                trigger.model,
                figures.ready_pods,
                figures.scraped_pods
            ))
        })?;
        // KEDA prefixes the name it was given; answer with the one asked for.
        let metric_name = if request.metric_name.is_empty() {
            trigger.metric.external_name().to_string()
        } else {
            request.metric_name.clone()
        };
        Ok(Response::new(GetMetricsResponse {
            metric_values: vec![MetricValue {
                metric_name,
                metric_value: value.round() as i64,
                metric_value_float: value,
            }],
        }))
    }
}
