//! The `remote` backend: a model whose execution is a KServe v2 gRPC call
//! to another server (another nereid-server, a Triton, or nereid-gateway),
//! so that an ensemble's step can run in another pod and scale on its own.
//!
//! ```text
//! backend: "remote"
//! parameters { key: "endpoint"      value { string_value: "mlp.ml.svc:8001" } }  # required
//! parameters { key: "model_name"    value { string_value: "mlp" } }      # default: this model's name
//! parameters { key: "model_version" value { string_value: "2" } }        # default: the remote's latest
//! parameters { key: "timeout_ms"    value { string_value: "30000" } }    # default 60000
//! parameters { key: "namespace"     value { string_value: "ml" } }       # nereid-gateway's nereid-namespace
//! parameters { key: "connections"   value { string_value: "4" } }        # default 1
//! ```
//!
//! Unlike the other backends it has no instance threads: a call is I/O, so
//! it is awaited on the runtime, as many at once as arrive, over pooled
//! HTTP/2 connections (tonic channels, which reconnect by themselves; calls
//! take them in turn). One is enough behind a router that balances each
//! request (nereid-gateway); a Kubernetes Service balances connections, so
//! behind one, several spread the calls over its pods. Inputs
//! and outputs travel as raw contents, without a copy. A request's deadline
//! (its `timeout` parameter, bounded by `timeout_ms`) becomes the call's
//! `grpc-timeout`; its trace context goes along as `traceparent`; its
//! parameters go as they came. A call that never reached the server (the
//! connection was refused, the server refused the stream or was going away,
//! or it said it was not serving) is sent once more; one that did is never
//! repeated. The remote's error comes back with its kind and its words.
//!
//! When the config lists no inputs or outputs, they are completed at load
//! from the remote model's own config (its `ModelConfig`), so a remote
//! step needs nothing but its endpoint.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nereid_proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient;
use nereid_proto::inference::infer_parameter::ParameterChoice;
use nereid_proto::inference::{InferParameter, ModelConfig, ModelConfigRequest, ModelInferRequest};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use futures::future::BoxFuture;
use nereid_core::backend::{Backend, InstanceSpec, ModelInstance};
use nereid_core::error::{Error, ErrorKind, Result};
use nereid_core::model_config::autocomplete::ModelSignature;
use nereid_core::model_config::parameter;
use nereid_core::parameter::{Parameter, Parameters};
use nereid_core::response::Produced;
use nereid_core::scheduler::{Ran, Runner};
use nereid_core::wire as convert;

/// `backend: "remote"`: what the binary plugs into the core's registry.
pub struct RemoteBackend;

impl Backend for RemoteBackend {
    /// A remote model has no file here.
    fn signature(&self, _: &ModelConfig, _: &std::path::Path) -> Result<Option<ModelSignature>> {
        Ok(None)
    }

    fn create_instance(&self, spec: InstanceSpec<'_>) -> Result<Box<dyn ModelInstance>> {
        Err(Error::internal(format!(
            "remote model '{}' has no instances to create",
            spec.config.name
        )))
    }

    /// It streams when the remote does.
    fn decoupled(&self) -> bool {
        true
    }

    fn complete_config(&self, config: &mut ModelConfig, _: &Path) -> Result<()> {
        complete_from_remote(config)
    }

    fn runner(&self, config: &ModelConfig) -> Result<Option<Arc<dyn Runner>>> {
        Ok(Some(Arc::new(RemoteModel::new(config)?)))
    }
}

impl Runner for RemoteModel {
    fn run<'a>(&'a self, ran: &'a Ran<'a>) -> BoxFuture<'a, Result<()>> {
        Box::pin(RemoteModel::run(self, ran))
    }
}

/// The largest message either way; the same default as the server's own
/// `--grpc-max-message-size`.
const MAX_MESSAGE: usize = 128 * 1024 * 1024;
/// How long a call may take unless the config says otherwise.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// How long connecting may take before a call fails (and may be retried).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Sends of one request: the first, and one more when it never arrived.
const ATTEMPTS: usize = 2;

/// Where and what a remote model calls.
#[derive(Debug, Clone, PartialEq)]
pub struct RemoteSettings {
    /// `http://host:port`.
    pub endpoint: String,
    pub model_name: String,
    /// "" for the remote's latest version.
    pub model_version: String,
    pub timeout: Duration,
    /// For nereid-gateway: the namespace of the model it routes to.
    pub namespace: Option<String>,
    /// HTTP/2 connections to keep, taken in turn.
    pub connections: usize,
}

impl RemoteSettings {
    /// The settings in `config`'s parameters.
    pub fn from_config(config: &ModelConfig) -> Result<Self> {
        let Some(endpoint) = parameter(config, "endpoint") else {
            return Err(Error::invalid(format!(
                "remote model '{}' needs the parameter 'endpoint' (host:port of a KServe v2 gRPC server)",
                config.name
            )));
        };
        let endpoint = if endpoint.contains("://") {
            endpoint.to_string()
        } else {
            format!("http://{endpoint}")
        };
        if !endpoint.starts_with("http://") {
            return Err(Error::invalid(format!(
                "remote model '{}': endpoint '{endpoint}' must be host:port or http://host:port (TLS is not supported yet)",
                config.name
            )));
        }
        let timeout = match parameter(config, "timeout_ms") {
            None => DEFAULT_TIMEOUT,
            Some(ms) => match ms.parse::<u64>() {
                Ok(ms) if ms > 0 => Duration::from_millis(ms),
                _ => {
                    return Err(Error::invalid(format!(
                        "remote model '{}': parameter 'timeout_ms' must be a positive number of milliseconds, got '{ms}'",
                        config.name
                    )));
                }
            },
        };
        let connections = match parameter(config, "connections") {
            None => 1,
            Some(n) => match n.parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => n,
                _ => {
                    return Err(Error::invalid(format!(
                        "remote model '{}': parameter 'connections' must be a number from 1 to 64, got '{n}'",
                        config.name
                    )));
                }
            },
        };
        Ok(RemoteSettings {
            connections,
            endpoint,
            model_name: parameter(config, "model_name").unwrap_or(&config.name).to_string(),
            model_version: parameter(config, "model_version").unwrap_or_default().to_string(),
            timeout,
            namespace: parameter(config, "namespace").map(str::to_string),
        })
    }

    fn describe(&self) -> String {
        format!("remote model '{}' at {}", self.model_name, self.endpoint)
    }

    fn channel(&self) -> Result<Channel> {
        let endpoint = Endpoint::from_shared(self.endpoint.clone())
            .map_err(|e| Error::invalid(format!("{}: not a valid endpoint: {e}", self.describe())))?
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_while_idle(true);
        Ok(endpoint.connect_lazy())
    }
}

/// A loaded remote model: its settings, the output names it asks for, and
/// the connection.
#[derive(Debug)]
pub struct RemoteModel {
    settings: RemoteSettings,
    /// The remote model answers over a stream, with any number of responses.
    decoupled: bool,
    outputs: Vec<String>,
    clients: Vec<GrpcInferenceServiceClient<Channel>>,
    next: AtomicUsize,
}

impl RemoteModel {
    /// Connects lazily: nothing is dialled until the first request (or the
    /// load's config completion, which dialled already).
    pub fn new(config: &ModelConfig) -> Result<Self> {
        let settings = RemoteSettings::from_config(config)?;
        let clients = (0..settings.connections)
            .map(|_| {
                Ok(GrpcInferenceServiceClient::new(settings.channel()?)
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE))
            })
            .collect::<Result<_>>()?;
        Ok(RemoteModel {
            decoupled: config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled),
            outputs: config.output.iter().map(|o| o.name.clone()).collect(),
            settings,
            clients,
            next: AtomicUsize::new(0),
        })
    }

    /// The next connection, in turn.
    fn client(&self) -> GrpcInferenceServiceClient<Channel> {
        let at = self.next.fetch_add(1, Ordering::Relaxed) % self.clients.len();
        self.clients[at].clone()
    }

    /// Runs a request on the remote: one call and its answer, or, when
    /// the remote model is decoupled, a ModelStreamInfer stream whose
    /// responses are passed on as they come.
    pub async fn run(&self, ran: &Ran<'_>) -> Result<()> {
        if self.decoupled {
            return self.stream(ran).await;
        }
        let answer = self.infer(ran).await?;
        ran.responder.send(Ok(answer)).await;
        Ok(())
    }

    /// Sends one request and returns the remote's answer.
    async fn infer(&self, ran: &Ran<'_>) -> Result<Produced> {
        let timeout = deadline(&ran.parameters, self.settings.timeout)?;
        let mut attempt = 1;
        loop {
            let mut request = tonic::Request::new(self.message(ran));
            request.set_timeout(timeout);
            self.add_metadata(&mut request, ran);
            match self.client().model_infer(request).await {
                Ok(answer) => {
                    return convert::incoming_response(answer.into_inner())
                        .map_err(|e| Error::new(e.kind(), format!("{}: {}", self.settings.describe(), e.message())));
                }
                Err(status) if attempt < ATTEMPTS && never_reached(&status) => {
                    tracing::debug!(remote = %self.settings.endpoint, error = %status, "not sent; sending again");
                    attempt += 1;
                }
                Err(status) => return Err(self.error(&status)),
            }
        }
    }

    /// A decoupled remote's responses, over a stream of one request. The
    /// request asks for Triton's empty final response, so the end is told
    /// even after a last response that carried data; the call's deadline
    /// bounds the whole stream. Not sent twice: a stream may have run.
    async fn stream(&self, ran: &Ran<'_>) -> Result<()> {
        let timeout = deadline(&ran.parameters, self.settings.timeout)?;
        let mut message = self.message(ran);
        message.parameters.insert(
            convert::EMPTY_FINAL.to_string(),
            InferParameter {
                parameter_choice: Some(ParameterChoice::BoolParam(true)),
            },
        );
        let mut request = tonic::Request::new(futures::stream::iter([message]));
        request.set_timeout(timeout);
        self.add_metadata(&mut request, ran);
        let mut responses = self
            .client()
            .model_stream_infer(request)
            .await
            .map_err(|status| self.error(&status))?
            .into_inner();
        loop {
            let Some(message) = responses.message().await.map_err(|status| self.error(&status))? else {
                // The remote ended the stream without the final flag.
                return Err(Error::unavailable(format!(
                    "{}: the stream ended before the final response",
                    self.settings.describe()
                )));
            };
            if !message.error_message.is_empty() {
                return Err(Error::new(
                    ErrorKind::Internal,
                    format!("{}: {}", self.settings.describe(), message.error_message),
                ));
            }
            let Some(response) = message.infer_response else {
                continue;
            };
            let last = convert::is_final(&response);
            if !(last && response.outputs.is_empty()) {
                let answer = convert::incoming_response(response)
                    .map_err(|e| Error::new(e.kind(), format!("{}: {}", self.settings.describe(), e.message())))?;
                if !ran.responder.send(Ok(answer)).await {
                    // The client went away; dropping the call cancels it there.
                    return Ok(());
                }
            }
            if last {
                return Ok(());
            }
        }
    }

    /// The request to send: raw contents, every output asked for by name.
    fn message(&self, ran: &Ran<'_>) -> ModelInferRequest {
        convert::outgoing_request(
            &self.settings.model_name,
            &self.settings.model_version,
            &ran.id,
            ran.inputs.clone(),
            &self.outputs,
            &ran.parameters,
        )
    }

    fn add_metadata<T>(&self, request: &mut tonic::Request<T>, ran: &Ran<'_>) {
        let metadata = request.metadata_mut();
        let traceparent = ran.trace.as_ref().map(|t| t.traceparent());
        let context = traceparent.iter().map(|value| ("traceparent", value.as_str())).chain(
            ran.trace_parent
                .iter()
                .filter(|(name, _)| traceparent.is_none() || name != "traceparent")
                .map(|(name, value)| (name.as_str(), value.as_str())),
        );
        for (name, value) in context {
            if let (Ok(key), Ok(value)) = (tonic::metadata::MetadataKey::from_bytes(name.as_bytes()), value.parse()) {
                metadata.insert(key, value);
            }
        }
        if let Some(namespace) = &self.settings.namespace
            && let Ok(value) = namespace.parse()
        {
            metadata.insert(nereid_proto::contract::NAMESPACE_HEADER, value);
        }
    }

    /// The remote's error, with its kind and its message.
    fn error(&self, status: &Status) -> Error {
        let kind = match status.code() {
            Code::InvalidArgument | Code::OutOfRange | Code::FailedPrecondition => ErrorKind::InvalidArgument,
            Code::NotFound => ErrorKind::NotFound,
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => ErrorKind::Unavailable,
            Code::Unimplemented => ErrorKind::Unsupported,
            Code::ResourceExhausted => ErrorKind::ResourceExhausted,
            Code::PermissionDenied | Code::Unauthenticated => ErrorKind::PermissionDenied,
            Code::AlreadyExists => ErrorKind::AlreadyExists,
            _ => ErrorKind::Internal,
        };
        let said = match status.code() {
            Code::DeadlineExceeded => "no answer within the request's deadline".to_string(),
            _ => status.message().to_string(),
        };
        Error::new(kind, format!("{}: {said}", self.settings.describe()))
    }
}

/// The call's deadline: the request's own `timeout` parameter (Triton's,
/// in microseconds) when it is shorter than the model's.
fn deadline(parameters: &Parameters, limit: Duration) -> Result<Duration> {
    match parameters.get("timeout") {
        None => Ok(limit),
        Some(p) => match p.as_i64() {
            Some(us) if us > 0 => Ok(limit.min(Duration::from_micros(us as u64))),
            Some(_) => Ok(limit),
            None if matches!(p, Parameter::Double(_)) => Ok(limit),
            None => Err(Error::invalid(
                "parameter 'timeout' must be an integer number of microseconds",
            )),
        },
    }
}

/// Whether a failed call surely never reached the server, so sending it
/// again cannot run it twice: the server said it was not serving (the
/// `nereid-not-serving` mark), HTTP/2 refused the stream or the server's
/// GOAWAY left it unprocessed, or the connection was never made.
fn never_reached(status: &Status) -> bool {
    if status.metadata().get(nereid_proto::NOT_SERVING_HEADER).is_some() {
        return true;
    }
    let mut next: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(cause) = next {
        if let Some(h2) = cause.downcast_ref::<h2::Error>() {
            return (h2.is_go_away() && h2.is_remote()) || h2.reason() == Some(h2::Reason::REFUSED_STREAM);
        }
        // Refused at connect: no byte of the request left.
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return io.kind() == std::io::ErrorKind::ConnectionRefused;
        }
        next = cause.source();
    }
    false
}

/// Completes `config` from the remote model's own config when it lists no
/// inputs or no outputs: those, `max_batch_size`, and whether it is
/// decoupled (its transaction policy). Reshapes are left
/// out, since the remote applies its own. Blocking (it runs in the load).
pub fn complete_from_remote(config: &mut ModelConfig) -> Result<()> {
    if !config.input.is_empty() && !config.output.is_empty() {
        return Ok(());
    }
    let settings = RemoteSettings::from_config(config)?;
    let remote = fetch_config(&settings)?;
    if config.input.is_empty() {
        config.input = remote.input;
        config.input.iter_mut().for_each(|i| i.reshape = None);
    }
    if config.output.is_empty() {
        config.output = remote.output;
        config.output.iter_mut().for_each(|o| o.reshape = None);
    }
    if config.max_batch_size == 0 {
        config.max_batch_size = remote.max_batch_size;
    }
    // A decoupled remote is called over a stream, and so is this model.
    if config.model_transaction_policy.is_none() {
        config.model_transaction_policy = remote.model_transaction_policy;
    }
    Ok(())
}

/// The remote model's config, asked for with the load's own deadline.
fn fetch_config(settings: &RemoteSettings) -> Result<ModelConfig> {
    let what = settings.describe();
    let ask = async {
        let mut client = GrpcInferenceServiceClient::new(settings.channel()?);
        let request = ModelConfigRequest {
            name: settings.model_name.clone(),
            version: settings.model_version.clone(),
        };
        let answer = client
            .model_config(request)
            .await
            .map_err(|s| Error::unavailable(format!("{what}: cannot read its config: {}", s.message())))?;
        answer
            .into_inner()
            .config
            .ok_or_else(|| Error::unavailable(format!("{what}: its config answer was empty")))
    };
    let bounded = async {
        tokio::time::timeout(CONNECT_TIMEOUT * 2, ask)
            .await
            .unwrap_or_else(|_| Err(Error::unavailable(format!("{what}: no config answer within 10 s"))))
    };
    match tokio::runtime::Handle::try_current() {
        Ok(handle) => handle.block_on(bounded),
        Err(_) => Err(Error::internal("loading a remote model needs the async runtime")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_core::model_config::text::parse;
    use nereid_core::parameter::Parameters;

    fn config(parameters: &str) -> ModelConfig {
        parse(&format!(
            r#"name: "mlp" backend: "remote" max_batch_size: 8
               input [ {{ name: "X" data_type: TYPE_FP32 dims: [ 4 ] }} ]
               output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
               {parameters}"#
        ))
        .unwrap()
    }

    fn param(key: &str, value: &str) -> String {
        format!(r#"parameters {{ key: "{key}" value {{ string_value: "{value}" }} }}"#)
    }

    #[test]
    fn settings_come_from_the_parameters() {
        let s = RemoteSettings::from_config(&config(&param("endpoint", "mlp.ml.svc:8001"))).unwrap();
        assert_eq!(s.endpoint, "http://mlp.ml.svc:8001");
        assert_eq!((s.model_name.as_str(), s.model_version.as_str()), ("mlp", ""));
        assert_eq!(s.timeout, DEFAULT_TIMEOUT);
        let all = [
            param("endpoint", "http://gw:8001"),
            param("model_name", "other"),
            param("model_version", "3"),
            param("timeout_ms", "250"),
            param("namespace", "ml"),
            param("connections", "4"),
        ]
        .join(" ");
        let s = RemoteSettings::from_config(&config(&all)).unwrap();
        assert_eq!(s.model_name, "other");
        assert_eq!(s.model_version, "3");
        assert_eq!(s.timeout, Duration::from_millis(250));
        assert_eq!(s.namespace.as_deref(), Some("ml"));
        assert_eq!(s.connections, 4);
    }

    #[test]
    fn bad_settings_name_the_parameter() {
        let e = RemoteSettings::from_config(&config("")).unwrap_err();
        assert!(e.message().contains("needs the parameter 'endpoint'"), "{e}");
        let e = RemoteSettings::from_config(&config(&format!(
            "{} {}",
            param("endpoint", "x:1"),
            param("timeout_ms", "soon")
        )))
        .unwrap_err();
        assert!(e.message().contains("'timeout_ms' must be a positive number"), "{e}");
        let e = RemoteSettings::from_config(&config(&param("endpoint", "https://x:1"))).unwrap_err();
        assert!(e.message().contains("TLS is not supported yet"), "{e}");
    }

    #[test]
    fn the_requests_timeout_shortens_the_deadline() {
        let limit = Duration::from_secs(60);
        let work = |parameters: &Parameters| deadline(parameters, limit);
        assert_eq!(work(&Parameters::new()).unwrap(), limit);
        let short = Parameters::from([("timeout".to_string(), Parameter::Int(5_000))]);
        assert_eq!(work(&short).unwrap(), Duration::from_millis(5));
        let bad = Parameters::from([("timeout".to_string(), Parameter::String("soon".into()))]);
        assert!(work(&bad).is_err());
    }

    #[tokio::test]
    async fn a_refused_connection_never_reached_the_server() {
        // A port nothing listens on: bind, read the port, close.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let model = RemoteModel::new(&config(&param("endpoint", &format!("127.0.0.1:{port}")))).unwrap();
        let mut client = model.client();
        let status = client
            .model_infer(nereid_proto::inference::ModelInferRequest::default())
            .await
            .unwrap_err();
        assert!(never_reached(&status), "{status:?}");
        let error = model.error(&status);
        assert_eq!(error.kind(), ErrorKind::Unavailable);
        assert!(
            error
                .message()
                .starts_with(&format!("remote model 'mlp' at http://127.0.0.1:{port}: "))
        );
        assert!(!never_reached(&Status::internal("boom")));
        let mut not_serving = Status::unavailable("Server not ready");
        not_serving
            .metadata_mut()
            .insert(nereid_proto::NOT_SERVING_HEADER, "1".parse().unwrap());
        assert!(never_reached(&not_serving));
    }
}
