//! The Deployment of `nereid-server` pods that serve one InferenceModel (or
//! one ModelEnsemble: the same pods, their model folder filled from its
//! [`Repository`] instead).
//!
//! How the model reaches the server: every pod has an emptyDir `models` at
//! `/models`, and an init container `model-fetch` (same image) copies
//! `spec.source.uri` into `/models/<model>/` before the server starts, so
//! the model is served under the InferenceModel's own name whatever its
//! folder is called at the source. It gets the URI and the credentials
//! Secret as environment; only it does: the server reads `/models` and never
//! object storage, so the serving container (and any sidecar) holds no
//! storage credentials:
//!
//! - `s3://`, `gs://`, `as://`: `nereid-fetch` downloads the folder, with the
//!   same object-storage code as the server and the Secret's credentials;
//! - `pvc://claim/path`: the claim is mounted read-only at `/source` (the
//!   path as its subPath) and `nereid-fetch --from /source` copies it in;
//! - `http(s)://`: not supported yet; it exits with a clear message, so the
//!   pod shows the failure (and the status says so) instead of serving an
//!   empty folder.
//!
//! Every init step is `nereid-fetch` itself (`server/src/command/fetch.rs`),
//! never a shell script: the image is `FROM scratch` and has no shell.
//!
//! The config override (the ConfigMap's `config.json`) is mounted read-only
//! at `/etc/nereid/config`; the server merges it over the repository's
//! `config.pbtxt` at every load (`--model-config-patch`), and its hash rolls
//! the pods when it changes. With `--exit-on-error`, a model that fails to
//! load stops the server, so the container's termination message (taken from
//! its log) carries the server's own reason into the status.
//!
//! Everything else is shaped for serving: readiness on the model's own ready
//! endpoint (a pod whose load failed is never sent traffic), a startup probe
//! with room for big models, zero-unavailable rolling updates, and a drain
//! (preStop pause, then `--exit-timeout-secs`) that fits in the grace period.
//!
//! And for the restricted Pod Security Standard: non-root (the image's user
//! 65532), no privilege escalation, no capabilities, a read-only root file
//! system (an emptyDir at /tmp), the runtime's default seccomp profile. The
//! server runs in model control mode `none`: it loads the one model at start
//! and the repository API cannot unload it, unless `spec.server.repositoryApi`
//! turns the API on behind a header whose value comes from a Secret. That
//! value reaches the server as an environment variable (a `secretKeyRef`),
//! and the server's arguments name only the variable
//! (`--http-restricted-api-from-env`), so the key is neither in the pod spec
//! nor in the process's command line, which every process of the node may read.

use nereid_proto::contract::fetch_progress;
use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EmptyDirVolumeSource, EnvFromSource, EnvVar,
    EnvVarSource, HTTPGetAction, Lifecycle, LifecycleHandler, PersistentVolumeClaimVolumeSource, PodSecurityContext,
    PodSpec, PodTemplateSpec, Probe, ResourceRequirements, SeccompProfile, SecretEnvSource, SecretVolumeSource,
    SecurityContext, SleepAction, TCPSocketAction, Toleration, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;
use nereid_crds::{InferenceModel, ModelSource};

use super::service::{self, Ports};
use super::{Served, config_map, labels};
use crate::context::OperatorConfig;

/// Pod template annotation holding the ConfigMap's hash: a config change
/// changes the template, which rolls the pods.
pub const CONFIG_HASH_ANNOTATION: &str = "serving.nereid.dev/config-hash";
/// The extended resource GPUs are requested as unless `spec.resources.gpuResource` says otherwise.
pub const DEFAULT_GPU_RESOURCE: &str = "nvidia.com/gpu";
/// The taint GPU nodes commonly carry (the NVIDIA GPU operator's), tolerated
/// automatically when GPUs are requested and the user gave no toleration for it.
pub const GPU_TAINT: &str = "nvidia.com/gpu";

pub const SERVER_CONTAINER: &str = "nereid-server";
pub const FETCH_CONTAINER: &str = "model-fetch";
/// The init container that writes the ConfigMap's model folders (ensembles).
pub const WRITE_CONTAINER: &str = "model-configs";

pub const MODELS_VOLUME: &str = "models";
pub const MODELS_PATH: &str = "/models";
pub const CONFIG_VOLUME: &str = "model-config";
pub const CONFIG_PATH: &str = "/etc/nereid/config";
pub const SOURCE_VOLUME: &str = "model-source";
pub const SOURCE_PATH: &str = "/source";
/// Scratch space: the root file system is read-only.
pub const TMP_VOLUME: &str = "tmp";
pub const TMP_PATH: &str = "/tmp";
pub const TLS_VOLUME: &str = "tls";
pub const TLS_PATH: &str = "/etc/nereid/tls";

/// The image's non-root user and group (the Dockerfile's `USER 65532`).
pub const RUN_AS: i64 = 65532;
/// The header the repository API requires unless `repositoryApi.header` says otherwise.
pub const DEFAULT_REPOSITORY_HEADER: &str = "nereid-repository-key";
/// The server's environment variable holding that header's value (from the Secret).
pub const REPOSITORY_KEY_ENV: &str = "NEREID_REPOSITORY_API_KEY";
/// nereid-server's flags that restrict API groups (HTTP) and protocols
/// (gRPC) to a header whose value is read from the environment variable the
/// flag names: `<groups>:<header>=<VARIABLE>`.
pub const HTTP_RESTRICTED_FROM_ENV_FLAG: &str = "--http-restricted-api-from-env";
pub const GRPC_RESTRICTED_FROM_ENV_FLAG: &str = "--grpc-restricted-protocol-from-env";

/// Seconds the server drains in-flight requests after SIGTERM (`--exit-timeout-secs`).
pub const EXIT_TIMEOUT_SECS: i64 = 30;
/// Seconds the preStop hook waits before SIGTERM, so endpoint removal reaches
/// every proxy before the server stops accepting.
pub const PRE_STOP_SLEEP_SECS: i64 = 5;
/// preStop pause + drain + a little slack.
pub const TERMINATION_GRACE_SECS: i64 = PRE_STOP_SLEEP_SECS + EXIT_TIMEOUT_SECS + 5;
/// Startup probe: every second, up to 900 times: 15 minutes to fetch and
/// load a big model. A pod is ready as soon as its model is loaded, not up
/// to a period later: that wait is every rollout's and scale-up's, and a
/// model woken from zero has requests held through it (Kubernetes' default
/// 10 s period added up to 10 s to every cold start: 12.1 s at p50 in the
/// e2e wake-up, 2.4 s with 1 s). Until the server binds its port, a probe
/// is a refused connection: nothing to the server, little to the kubelet.
pub const STARTUP_PERIOD_SECS: i32 = 1;
pub const STARTUP_FAILURES: i32 = 900;

/// The replicas the Deployment runs: `spec.replicas`, else the autoscaler's
/// minimum, else 1.
///
/// An HPA scales the InferenceModel through its scale subresource (which
/// writes `spec.replicas`), never the Deployment directly, so `spec.replicas`
/// is the one source of truth even under autoscaling and is always applied.
pub fn replicas<S: Served>(model: &S) -> i32 {
    model
        .replicas_field()
        .or_else(|| model.autoscaling().and_then(|a| a.min_replicas))
        .unwrap_or(1)
}

/// The number of GPUs each pod asks for, and as which resource.
pub fn gpus<S: Served>(model: &S) -> (u32, String) {
    let resources = model.resources();
    let count = resources.and_then(|r| r.gpu).unwrap_or(0);
    let resource = resources
        .and_then(|r| r.gpu_resource.clone())
        .unwrap_or_else(|| DEFAULT_GPU_RESOURCE.to_string());
    (count, resource)
}

/// How a pod's `/models` folder is filled before the server starts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Repository {
    /// Model folders fetched from storage, one init container each.
    pub fetched: Vec<Fetched>,
    /// Whether the ConfigMap's `<model>.pbtxt` keys are model folders of
    /// their own (an ensemble's config, remote members' configs), written
    /// into `/models` by an init container.
    pub written: bool,
    /// Config patches the server merges over a model's `config.pbtxt` at
    /// load: (model, ConfigMap key).
    pub patches: Vec<(String, String)>,
    /// The model the pods serve, when it is not named like the resource
    /// that runs them: a canary's pods serve their InferenceModel's model.
    pub served: Option<String>,
}

/// One model folder fetched from storage.
#[derive(Clone, Debug, PartialEq)]
pub struct Fetched {
    /// The folder's name under `/models`, which is the model's name.
    pub model: String,
    pub source: ModelSource,
    /// Its init container.
    pub container: String,
    /// The volume of its claim, for a `pvc://` source.
    pub volume: String,
    /// Its config patch's ConfigMap key.
    pub config_key: String,
}

impl Repository {
    /// An InferenceModel's: its one model, fetched from `spec.source`,
    /// with `spec.config` as its patch.
    pub fn of_model(model: &InferenceModel) -> Self {
        Self::of_source(model.name_any(), &model.spec.source)
    }

    /// One model named `name`, fetched from `source`, with the ConfigMap's
    /// config as its patch.
    pub fn of_source(name: String, source: &ModelSource) -> Self {
        Repository {
            fetched: vec![Fetched {
                model: name.clone(),
                source: source.clone(),
                container: FETCH_CONTAINER.into(),
                volume: SOURCE_VOLUME.into(),
                config_key: config_map::CONFIG_KEY.into(),
            }],
            written: false,
            patches: vec![(name, config_map::CONFIG_KEY.into())],
            served: None,
        }
    }
}

/// The Deployment, named like the model. `config_hash` is the ConfigMap's hash.
pub fn deployment<S: Served>(
    model: &S,
    repository: &Repository,
    config: &OperatorConfig,
    config_hash: &str,
) -> Deployment {
    Deployment {
        metadata: labels::object_meta(model, model.name_any()),
        spec: DeploymentSpec {
            replicas: Some(replicas(model)),
            selector: labels::label_selector(model),
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                // A new pod must be ready (model loaded) before an old one goes.
                rolling_update: Some(RollingUpdateDeployment {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            // Past the startup probe's whole budget, so a slow load is not a failed rollout.
            progress_deadline_seconds: Some(STARTUP_PERIOD_SECS * STARTUP_FAILURES + 300),
            revision_history_limit: Some(5),
            template: pod_template(model, repository, config, config_hash),
            ..DeploymentSpec::default()
        },
        ..Deployment::default()
    }
}

fn pod_template<S: Served>(
    model: &S,
    repository: &Repository,
    config: &OperatorConfig,
    config_hash: &str,
) -> PodTemplateSpec {
    let ports = service::ports(model);
    let annotations = BTreeMap::from([
        (CONFIG_HASH_ANNOTATION.to_string(), config_hash.to_string()),
        ("prometheus.io/scrape".to_string(), "true".to_string()),
        ("prometheus.io/port".to_string(), ports.metrics.to_string()),
        ("prometheus.io/path".to_string(), "/metrics".to_string()),
    ]);
    let image = model
        .server()
        .and_then(|s| s.image.clone())
        .unwrap_or_else(|| config.server_image.clone());
    let mut containers = vec![server_container(model, repository, &image, ports)];
    if let Some(server) = model.server() {
        containers.extend(server.sidecars.iter().cloned());
    }
    let scheduling = model.scheduling().cloned().unwrap_or_default();
    let mut init_containers = Vec::with_capacity(repository.fetched.len() + 1);
    if repository.written {
        init_containers.push(write_container(&image));
    }
    init_containers.extend(repository.fetched.iter().map(|f| fetch_container(f, &image)));
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(labels::labels(model)),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            init_containers: Some(init_containers),
            containers,
            volumes: Some(volumes(model, repository)),
            termination_grace_period_seconds: Some(TERMINATION_GRACE_SECS),
            // Serving pods never talk to the Kubernetes API.
            automount_service_account_token: Some(false),
            security_context: Some(PodSecurityContext {
                run_as_non_root: Some(true),
                run_as_user: Some(RUN_AS),
                run_as_group: Some(RUN_AS),
                fs_group: Some(RUN_AS),
                seccomp_profile: Some(SeccompProfile {
                    type_: "RuntimeDefault".into(),
                    ..SeccompProfile::default()
                }),
                ..PodSecurityContext::default()
            }),
            node_selector: scheduling.node_selector,
            tolerations: tolerations(model, scheduling.tolerations),
            affinity: scheduling.affinity,
            priority_class_name: scheduling.priority_class_name,
            runtime_class_name: scheduling.runtime_class_name,
            topology_spread_constraints: scheduling.topology_spread_constraints.map(|constraints| {
                constraints
                    .into_iter()
                    .map(|mut c| {
                        c.label_selector.get_or_insert_with(|| labels::label_selector(model));
                        c
                    })
                    .collect()
            }),
            ..PodSpec::default()
        }),
    }
}

fn server_container<S: Served>(model: &S, repository: &Repository, image: &str, ports: Ports) -> Container {
    let name = repository.served.clone().unwrap_or_else(|| model.name_any());
    let server = model.server().cloned().unwrap_or_default();
    let mut args = vec!["--model-repository".to_string(), MODELS_PATH.to_string()];
    let mut env = server.env.clone();
    match &server.repository_api {
        // The folder holds this one model: mode `none` loads it, and the
        // repository API can neither load nor unload anything.
        None => args.extend(["--model-control-mode".to_string(), "none".to_string()]),
        Some(api) => {
            let header = api.header.as_deref().unwrap_or(DEFAULT_REPOSITORY_HEADER);
            // The pod spec holds a reference to the Secret, never its value,
            // and the arguments only the variable's name: a `$(VAR)` the
            // kubelet expanded would put the key on the command line, which
            // any process on the node can read in /proc.
            let restriction = format!("model-repository:{header}={REPOSITORY_KEY_ENV}");
            args.extend([
                "--model-control-mode".to_string(),
                "explicit".to_string(),
                "--load-model".to_string(),
                name.clone(),
                format!("{HTTP_RESTRICTED_FROM_ENV_FLAG}={restriction}"),
                format!("{GRPC_RESTRICTED_FROM_ENV_FLAG}={restriction}"),
            ]);
            env.push(EnvVar {
                name: REPOSITORY_KEY_ENV.into(),
                value_from: Some(EnvVarSource {
                    secret_key_ref: Some(api.key_secret.clone()),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            });
        }
    }
    if let Some(tls) = &server.tls {
        for port in ["http", "grpc"] {
            args.extend([
                format!("--{port}-use-ssl"),
                format!("--{port}-server-cert={TLS_PATH}/tls.crt"),
                format!("--{port}-server-key={TLS_PATH}/tls.key"),
            ]);
            if tls.mutual {
                args.extend([
                    format!("--{port}-use-ssl-mutual"),
                    format!("--{port}-root-cert={TLS_PATH}/ca.crt"),
                ]);
            }
        }
    }
    args.extend([
        "--http-port".to_string(),
        ports.http.to_string(),
        "--grpc-port".to_string(),
        ports.grpc.to_string(),
        "--metrics-port".to_string(),
        ports.metrics.to_string(),
        "--exit-timeout-secs".to_string(),
        EXIT_TIMEOUT_SECS.to_string(),
    ]);
    // spec.config, merged by the server over the repository's config.pbtxt.
    for (patched, key) in &repository.patches {
        args.extend([
            "--model-config-patch".to_string(),
            format!("{patched}={CONFIG_PATH}/{key}"),
        ]);
    }
    // A model that fails to load stops the container, so the pod (and the
    // status, through the termination message) carries the server's reason.
    args.push("--exit-on-error".to_string());
    args.extend(server.args.iter().cloned());
    let tls = server.tls.as_ref();
    // The kubelet's HTTPS probes do not verify the certificate, but cannot
    // present a client certificate either: with mutual TLS the probes can
    // only check that the port accepts connections.
    let probe_action = |path: String| match tls {
        Some(tls) if tls.mutual => Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::String(service::HTTP.into()),
                ..TCPSocketAction::default()
            }),
            ..Probe::default()
        },
        _ => Probe {
            http_get: Some(HTTPGetAction {
                path: Some(path),
                port: IntOrString::String(service::HTTP.into()),
                scheme: tls.map(|_| "HTTPS".to_string()),
                ..HTTPGetAction::default()
            }),
            ..Probe::default()
        },
    };
    let port = |name: &str, number: i32| ContainerPort {
        name: Some(name.to_string()),
        container_port: number,
        protocol: Some("TCP".into()),
        ..ContainerPort::default()
    };
    Container {
        name: SERVER_CONTAINER.into(),
        image: Some(image.to_string()),
        command: Some(vec!["nereid-server".into()]),
        args: Some(args),
        env: (!env.is_empty()).then_some(env),
        // No storage credentials: the init containers fetched the models.
        env_from: None,
        ports: Some(vec![
            port(service::HTTP, ports.http),
            port(service::GRPC, ports.grpc),
            port(service::METRICS, ports.metrics),
        ]),
        resources: Some(resources(model)),
        liveness_probe: Some(Probe {
            period_seconds: Some(10),
            timeout_seconds: Some(5),
            failure_threshold: Some(3),
            ..probe_action("/v2/health/live".into())
        }),
        // The model's own endpoint: a pod whose load failed gets no traffic.
        readiness_probe: Some(Probe {
            period_seconds: Some(5),
            timeout_seconds: Some(3),
            failure_threshold: Some(3),
            ..probe_action(format!("/v2/models/{name}/ready"))
        }),
        // The server binds its ports only after loading, so this covers the load.
        startup_probe: Some(Probe {
            period_seconds: Some(STARTUP_PERIOD_SECS),
            // The period: a probe never overlaps the next.
            timeout_seconds: Some(STARTUP_PERIOD_SECS),
            failure_threshold: Some(STARTUP_FAILURES),
            ..probe_action("/v2/health/ready".into())
        }),
        // The kubelet's own sleep action: no shell or `sleep` binary needed in the image.
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction {
                    seconds: PRE_STOP_SLEEP_SECS,
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        // A crash's last log lines become the termination message the status reports.
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some({
            let mut mounts = vec![
                mount(MODELS_VOLUME, MODELS_PATH, false),
                mount(CONFIG_VOLUME, CONFIG_PATH, true),
                mount(TMP_VOLUME, TMP_PATH, false),
            ];
            if tls.is_some() {
                mounts.push(mount(TLS_VOLUME, TLS_PATH, true));
            }
            mounts
        }),
        security_context: Some(restricted()),
        ..Container::default()
    }
}

/// What the restricted Pod Security Standard asks of every container.
fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

/// The init container that writes the ConfigMap's model folders: each
/// `<model>.pbtxt` key becomes `/models/<model>/config.pbtxt` with an empty
/// version `1` (an ensemble and a remote model have no model file).
fn write_container(image: &str) -> Container {
    Container {
        name: WRITE_CONTAINER.into(),
        image: Some(image.to_string()),
        // The image has no shell: nereid-fetch does the copying.
        command: Some(vec![
            "nereid-fetch".into(),
            "--write-configs".into(),
            CONFIG_PATH.into(),
            MODELS_PATH.into(),
        ]),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(vec![
            mount(MODELS_VOLUME, MODELS_PATH, false),
            mount(CONFIG_VOLUME, CONFIG_PATH, true),
        ]),
        security_context: Some(restricted()),
        ..Container::default()
    }
}

fn fetch_container(fetched: &Fetched, image: &str) -> Container {
    let mut mounts = vec![
        mount(MODELS_VOLUME, MODELS_PATH, false),
        mount(CONFIG_VOLUME, CONFIG_PATH, true),
        mount(TMP_VOLUME, TMP_PATH, false),
    ];
    if let Some((_, path)) = pvc_source(&fetched.source.uri) {
        mounts.push(VolumeMount {
            sub_path: (!path.is_empty()).then(|| path.to_string()),
            ..mount(&fetched.volume, SOURCE_PATH, true)
        });
    }
    let env = |name: &str, value: String| EnvVar {
        name: name.to_string(),
        value: Some(value),
        ..EnvVar::default()
    };
    let secrets: Vec<&str> = fetched.source.credentials_secret.as_deref().into_iter().collect();
    // The image has no shell: nereid-fetch itself tells the sources apart,
    // and refuses one it cannot read with the ones it can. The URI goes by
    // reference: the kubelet expands `$(VAR)` in a command once, so a
    // `$(...)` inside the URI stays text instead of reading the container's
    // environment (its credentials) into an argument and an error message.
    let mut command = vec![
        "nereid-fetch".to_string(),
        "$(NEREID_SOURCE_URI)".to_string(),
        format!("{MODELS_PATH}/{}", fetched.model),
    ];
    match pvc_source(&fetched.source.uri) {
        Some(_) => command.extend(["--from".to_string(), SOURCE_PATH.to_string()]),
        // A download reports how far it is, for the status to show.
        None => command.extend([fetch_progress::FLAG.to_string(), fetch_progress::PORT.to_string()]),
    }
    Container {
        name: fetched.container.clone(),
        image: Some(image.to_string()),
        command: Some(command),
        env: Some(vec![
            env("NEREID_SOURCE_URI", fetched.source.uri.clone()),
            env("NEREID_MODEL_NAME", fetched.model.clone()),
            env("NEREID_MODEL_CONFIG", format!("{CONFIG_PATH}/{}", fetched.config_key)),
        ]),
        env_from: credentials(&secrets),
        termination_message_policy: Some("FallbackToLogsOnError".into()),
        volume_mounts: Some(mounts),
        security_context: Some(restricted()),
        ..Container::default()
    }
}

/// These credentials Secrets' keys as environment variables.
fn credentials(secrets: &[&str]) -> Option<Vec<EnvFromSource>> {
    (!secrets.is_empty()).then(|| {
        secrets
            .iter()
            .map(|secret| EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: secret.to_string(),
                    optional: Some(false),
                }),
                ..EnvFromSource::default()
            })
            .collect()
    })
}

/// CPU and memory as both request and limit (predictable latency: no
/// overcommit); GPUs as a limit, which Kubernetes also uses as the request.
fn resources<S: Served>(model: &S) -> ResourceRequirements {
    let mut requests = BTreeMap::new();
    let mut limits = BTreeMap::new();
    if let Some(given) = model.resources() {
        for (name, quantity) in [("cpu", &given.cpu), ("memory", &given.memory)] {
            if let Some(quantity) = quantity {
                requests.insert(name.to_string(), quantity.clone());
                limits.insert(name.to_string(), quantity.clone());
            }
        }
    }
    let (count, resource) = gpus(model);
    if count > 0 {
        limits.insert(resource, Quantity(count.to_string()));
    }
    ResourceRequirements {
        requests: (!requests.is_empty()).then_some(requests),
        limits: (!limits.is_empty()).then_some(limits),
        ..ResourceRequirements::default()
    }
}

/// The user's tolerations, plus the GPU taint's when GPUs are requested and
/// the user gave none that covers it.
fn tolerations<S: Served>(model: &S, given: Option<Vec<Toleration>>) -> Option<Vec<Toleration>> {
    let (count, _) = gpus(model);
    let mut tolerations = given.unwrap_or_default();
    let covered = tolerations.iter().any(|t| match t.key.as_deref() {
        Some(key) => key == GPU_TAINT,
        // An empty key with Exists tolerates every taint.
        None => t.operator.as_deref() == Some("Exists"),
    });
    if count > 0 && !covered {
        tolerations.push(Toleration {
            key: Some(GPU_TAINT.into()),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        });
    }
    (!tolerations.is_empty()).then_some(tolerations)
}

fn volumes<S: Served>(model: &S, repository: &Repository) -> Vec<Volume> {
    let mut volumes = vec![
        Volume {
            name: MODELS_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
        Volume {
            name: CONFIG_VOLUME.into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_map::name(model),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: TMP_VOLUME.into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
    ];
    if let Some(tls) = model.server().and_then(|s| s.tls.as_ref()) {
        volumes.push(Volume {
            name: TLS_VOLUME.into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(tls.secret_name.clone()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    for fetched in &repository.fetched {
        if let Some((claim, _)) = pvc_source(&fetched.source.uri) {
            volumes.push(Volume {
                name: fetched.volume.clone(),
                persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                    claim_name: claim.to_string(),
                    read_only: Some(true),
                }),
                ..Volume::default()
            });
        }
    }
    volumes
}

fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.to_string(),
        mount_path: path.to_string(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// `pvc://claim/some/path` into `("claim", "some/path")`; `None` for other schemes.
pub fn pvc_source(uri: &str) -> Option<(&str, &str)> {
    let rest = uri.strip_prefix("pvc://")?;
    let (claim, path) = rest.split_once('/').unwrap_or((rest, ""));
    (!claim.is_empty()).then_some((claim, path.trim_matches('/')))
}
