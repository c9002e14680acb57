//! The builders, field by field: every part of an InferenceModel's spec
//! lands where the serving pods, the Service and the budget need it.

mod support;

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{
    Container, EnvVar, PodSpec, Probe, SecretKeySelector, Toleration, TopologySpreadConstraint,
};
use k8s_openapi::api::networking::v1::{NetworkPolicyIngressRule, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use nereid_crds::{
    Autoscaling, AutoscalingMetric, InferenceModel, InferenceModelSpec, ModelConfigOverride, ModelNetworkPolicy,
    ModelResources, RepositoryApi, Scheduling, ServerPorts, ServerSpec, ServerTls,
};
use nereid_operator::builders::deployment::{CONFIG_HASH_ANNOTATION, FETCH_CONTAINER, SERVER_CONTAINER};
use nereid_operator::builders::{self, labels};
use support::{config, model, model_with, spec};

fn deployment_of(model: &InferenceModel) -> Deployment {
    builders::desired(model, &config()).deployment
}

/// The pod template's metadata: its labels and annotations.
fn pod_meta(d: &Deployment) -> ObjectMeta {
    d.spec.template.metadata.clone().unwrap()
}

fn pod_spec(d: &Deployment) -> &PodSpec {
    d.spec.template.spec.as_ref().unwrap()
}

fn server(d: &Deployment) -> &Container {
    pod_spec(d)
        .containers
        .iter()
        .find(|c| c.name == SERVER_CONTAINER)
        .unwrap()
}

fn fetch(d: &Deployment) -> &Container {
    pod_spec(d)
        .init_containers
        .iter()
        .flatten()
        .find(|c| c.name == FETCH_CONTAINER)
        .unwrap()
}

fn with_gpus(gpu: u32, gpu_resource: Option<&str>) -> InferenceModel {
    model_with(InferenceModelSpec {
        resources: Some(ModelResources {
            cpu: Some(Quantity("4".into())),
            memory: Some(Quantity("16Gi".into())),
            gpu: Some(gpu),
            gpu_resource: gpu_resource.map(str::to_string),
        }),
        ..spec()
    })
}

fn probe_path(probe: &Option<Probe>) -> String {
    let get = probe.as_ref().unwrap().http_get.as_ref().unwrap();
    assert_eq!(get.port, IntOrString::String("http".into()));
    get.path.clone().unwrap()
}

fn gpu_toleration() -> Toleration {
    Toleration {
        key: Some("nvidia.com/gpu".into()),
        operator: Some("Exists".into()),
        effect: Some("NoSchedule".into()),
        ..Toleration::default()
    }
}

#[test]
fn gpus_become_a_limit_and_a_toleration() {
    let d = deployment_of(&with_gpus(2, None));
    let resources = server(&d).resources.clone().unwrap();
    let limits = resources.limits.unwrap();
    assert_eq!(limits["nvidia.com/gpu"], Quantity("2".into()));
    assert_eq!(limits["cpu"], Quantity("4".into()));
    assert_eq!(limits["memory"], Quantity("16Gi".into()));
    let requests = resources.requests.unwrap();
    assert_eq!(requests["cpu"], Quantity("4".into()));
    assert_eq!(requests["memory"], Quantity("16Gi".into()));
    assert!(
        !requests.contains_key("nvidia.com/gpu"),
        "extended resources are set as limits"
    );
    assert_eq!(pod_spec(&d).tolerations, Some(vec![gpu_toleration()]));
}

#[test]
fn a_mig_profile_is_requested_by_its_resource_name() {
    let d = deployment_of(&with_gpus(1, Some("nvidia.com/mig-1g.10gb")));
    let limits = server(&d).resources.clone().unwrap().limits.unwrap();
    assert_eq!(limits["nvidia.com/mig-1g.10gb"], Quantity("1".into()));
    assert!(!limits.contains_key("nvidia.com/gpu"));
    assert_eq!(pod_spec(&d).tolerations, Some(vec![gpu_toleration()]));
}

#[test]
fn no_gpus_means_no_gpu_limit_and_no_toleration() {
    let d = deployment_of(&with_gpus(0, None));
    let limits = server(&d).resources.clone().unwrap().limits.unwrap();
    assert!(!limits.contains_key("nvidia.com/gpu"));
    assert_eq!(pod_spec(&d).tolerations, None);
    let d = deployment_of(&model());
    assert_eq!(server(&d).resources.clone().unwrap().limits, None);
}

#[test]
fn a_user_gpu_toleration_is_not_duplicated_and_others_are_kept() {
    let user = vec![
        Toleration {
            key: Some("nvidia.com/gpu".into()),
            operator: Some("Equal".into()),
            value: Some("a100".into()),
            effect: Some("NoSchedule".into()),
            ..Toleration::default()
        },
        Toleration {
            key: Some("dedicated".into()),
            operator: Some("Exists".into()),
            ..Toleration::default()
        },
    ];
    let mut m = with_gpus(1, None);
    m.spec.scheduling = Some(Scheduling {
        tolerations: Some(user.clone()),
        ..Scheduling::default()
    });
    assert_eq!(pod_spec(&deployment_of(&m)).tolerations, Some(user));

    let only_other = vec![Toleration {
        key: Some("dedicated".into()),
        operator: Some("Exists".into()),
        ..Toleration::default()
    }];
    m.spec.scheduling = Some(Scheduling {
        tolerations: Some(only_other.clone()),
        ..Scheduling::default()
    });
    let mut expected = only_other;
    expected.push(gpu_toleration());
    assert_eq!(pod_spec(&deployment_of(&m)).tolerations, Some(expected));
}

#[test]
fn probes_check_liveness_the_model_and_a_long_startup() {
    let d = deployment_of(&model());
    let c = server(&d);
    assert_eq!(probe_path(&c.liveness_probe), "/v2/health/live");
    assert_eq!(probe_path(&c.readiness_probe), "/v2/models/resnet/ready");
    assert_eq!(probe_path(&c.startup_probe), "/v2/health/ready");
    let startup = c.startup_probe.clone().unwrap();
    let budget = startup.period_seconds.unwrap() * startup.failure_threshold.unwrap();
    assert!(
        budget >= 900,
        "a big model gets at least 15 minutes to load, got {budget}s"
    );
    let deadline = d.spec.progress_deadline_seconds.unwrap();
    assert!(deadline > budget, "a slow load is not a failed rollout");

    // Probed every second: a pod takes requests as soon as its model is
    // loaded (a model woken from zero has requests waiting).
    assert_eq!(startup.period_seconds, Some(1));
}

#[test]
fn draining_fits_in_the_grace_period() {
    let d = deployment_of(&model());
    let c = server(&d);
    let pre_stop = c.lifecycle.clone().unwrap().pre_stop.unwrap();
    let sleep = pre_stop.sleep.unwrap().seconds;
    assert_eq!(sleep, 5);
    let args = c.args.clone().unwrap();
    let exit = args.iter().position(|a| a == "--exit-timeout-secs").unwrap();
    let exit: i64 = args[exit + 1].parse().unwrap();
    assert_eq!(exit, 30);
    let grace = pod_spec(&d).termination_grace_period_seconds.unwrap();
    assert_eq!(grace, 40);
    assert!(grace > sleep + exit);
}

#[test]
fn the_server_loads_exactly_this_model_from_the_fetched_folder() {
    let mut m = model();
    m.spec.server = Some(ServerSpec {
        args: vec!["--http-max-input-size".into(), "1048576".into()],
        ..ServerSpec::default()
    });
    let d = deployment_of(&m);
    let c = server(&d);
    assert_eq!(c.command, Some(vec!["nereid-server".to_string()]));
    let args = c.args.clone().unwrap();
    // Mode none: the folder holds this one model, and the repository API
    // can neither load nor unload anything.
    let expected_prefix = [
        "--model-repository",
        "/models",
        "--model-control-mode",
        "none",
        "--http-port",
        "8000",
        "--grpc-port",
        "8001",
        "--metrics-port",
        "8002",
    ];
    assert_eq!(&args[..expected_prefix.len()], expected_prefix);
    let patch = args
        .iter()
        .position(|a| a == "--model-config-patch")
        .expect("the config patch is passed");
    assert_eq!(args[patch + 1], "resnet=/etc/nereid/config/config.json");
    assert!(args.iter().any(|a| a == "--exit-on-error"));
    assert_eq!(
        &args[args.len() - 2..],
        ["--http-max-input-size", "1048576"],
        "user args come last"
    );
}

#[test]
fn every_init_step_is_nereid_fetch_with_no_shell() {
    // The image is FROM scratch: a shell in a command would fail in every
    // real cluster (the process nodes of the e2e suite refuse it too).
    let mut m = model();
    let d = deployment_of(&m);
    let commands: Vec<&Vec<String>> = pod_spec(&d)
        .init_containers
        .iter()
        .flatten()
        .chain(&pod_spec(&d).containers)
        .filter_map(|c| c.command.as_ref())
        .collect();
    assert!(!commands.is_empty());
    for command in &commands {
        assert!(
            ["nereid-server", "nereid-fetch"].contains(&command[0].as_str()),
            "{command:?}"
        );
    }
    // The URI by reference, expanded once by the kubelet; the model's own folder.
    assert_eq!(
        fetch(&d).command.as_ref().unwrap(),
        &[
            "nereid-fetch",
            "$(NEREID_SOURCE_URI)",
            "/models/resnet",
            "--progress-port",
            "8009"
        ]
    );
    // A claim is copied from where it is mounted.
    m.spec.source.uri = "pvc://weights/resnet".into();
    let d = deployment_of(&m);
    assert_eq!(
        fetch(&d).command.as_ref().unwrap(),
        &[
            "nereid-fetch",
            "$(NEREID_SOURCE_URI)",
            "/models/resnet",
            "--from",
            "/source"
        ]
    );
}

#[test]
fn the_repository_api_is_on_only_behind_the_secrets_header() {
    let mut m = model();
    m.spec.server = Some(ServerSpec {
        repository_api: Some(RepositoryApi {
            key_secret: SecretKeySelector {
                name: "admin".into(),
                key: "key".into(),
                optional: None,
            },
            header: None,
        }),
        ..ServerSpec::default()
    });
    let d = deployment_of(&m);
    let c = server(&d);
    let args = c.args.clone().unwrap();
    let mode = args.iter().position(|a| a == "--model-control-mode").unwrap();
    assert_eq!(args[mode + 1], "explicit");
    let load = args.iter().position(|a| a == "--load-model").unwrap();
    assert_eq!(args[load + 1], "resnet");
    // The arguments name the variable that holds the key: the key itself
    // (a `$(VAR)` the kubelet would expand) is never on the command line.
    let restriction = "model-repository:nereid-repository-key=NEREID_REPOSITORY_API_KEY";
    assert!(
        args.contains(&format!("--http-restricted-api-from-env={restriction}")),
        "{args:?}"
    );
    assert!(
        args.contains(&format!("--grpc-restricted-protocol-from-env={restriction}")),
        "{args:?}"
    );
    assert!(
        !args.iter().any(|a| a.contains("$(")),
        "nothing for the kubelet to expand: {args:?}"
    );
    assert!(
        !args
            .iter()
            .any(|a| a.starts_with("--http-restricted-api=") || a.starts_with("--grpc-restricted-protocol=")),
        "{args:?}"
    );
    // The pod spec names the Secret; the value never appears in it.
    let key = c
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NEREID_REPOSITORY_API_KEY")
        .unwrap();
    assert_eq!(key.value, None);
    let from = key.value_from.as_ref().unwrap().secret_key_ref.as_ref().unwrap();
    assert_eq!((from.name.as_str(), from.key.as_str()), ("admin", "key"));
}

#[test]
fn every_container_meets_the_restricted_pod_security_standard() {
    let d = deployment_of(&model());
    let pod = pod_spec(&d);
    let pod_context = pod.security_context.as_ref().unwrap();
    assert_eq!(pod_context.run_as_non_root, Some(true));
    assert_eq!(pod_context.run_as_user, Some(65532));
    assert_eq!(pod_context.seccomp_profile.as_ref().unwrap().type_, "RuntimeDefault");
    for c in [server(&d), fetch(&d)] {
        let context = c.security_context.as_ref().unwrap();
        assert_eq!(context.allow_privilege_escalation, Some(false), "{}", c.name);
        assert_eq!(context.read_only_root_filesystem, Some(true), "{}", c.name);
        assert_eq!(
            context.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()]),
            "{}",
            c.name
        );
        let tmp = c.volume_mounts.iter().flatten().find(|m| m.mount_path == "/tmp");
        assert!(tmp.is_some(), "{} has a writable /tmp", c.name);
    }
}

#[test]
fn tls_mounts_the_secret_and_serves_both_ports_with_it() {
    let mut m = model();
    m.spec.server = Some(ServerSpec {
        tls: Some(ServerTls {
            secret_name: "serving-cert".into(),
            mutual: false,
        }),
        ..ServerSpec::default()
    });
    let d = deployment_of(&m);
    let c = server(&d);
    let args = c.args.clone().unwrap();
    for flag in [
        "--http-use-ssl",
        "--http-server-cert=/etc/nereid/tls/tls.crt",
        "--grpc-use-ssl",
        "--grpc-server-key=/etc/nereid/tls/tls.key",
    ] {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    assert!(!args.iter().any(|a| a.contains("mutual")));
    let volume = pod_spec(&d).volumes.iter().flatten().find(|v| v.name == "tls").unwrap();
    assert_eq!(
        volume.secret.as_ref().unwrap().secret_name.as_deref(),
        Some("serving-cert")
    );
    let readiness = c.readiness_probe.as_ref().unwrap().http_get.as_ref().unwrap();
    assert_eq!(readiness.scheme.as_deref(), Some("HTTPS"));

    m.spec.server.as_mut().unwrap().tls.as_mut().unwrap().mutual = true;
    let d = deployment_of(&m);
    let c = server(&d);
    let args = c.args.clone().unwrap();
    assert!(args.iter().any(|a| a == "--grpc-root-cert=/etc/nereid/tls/ca.crt"));
    // The kubelet cannot present a client certificate: the probes check the port.
    assert!(c.readiness_probe.as_ref().unwrap().tcp_socket.is_some());
}

#[test]
fn a_network_policy_admits_only_the_named_peers() {
    assert!(builders::desired(&model(), &config()).network_policy.is_none());
    let mut m = model();
    m.spec.network_policy = Some(ModelNetworkPolicy::default());
    let policy = builders::desired(&m, &config()).network_policy.unwrap();
    let spec = policy.spec.unwrap();
    assert_eq!(spec.pod_selector, Some(labels::label_selector(&m)));
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    let rules = spec.ingress.unwrap();
    let ports = |r: &NetworkPolicyIngressRule| -> Vec<IntOrString> {
        r.ports.iter().flatten().filter_map(|p| p.port.clone()).collect()
    };
    assert_eq!(ports(&rules[0]), vec![IntOrString::Int(8000), IntOrString::Int(8001)]);
    assert_eq!(ports(&rules[1]), vec![IntOrString::Int(8002), IntOrString::Int(8009)]);
    // Empty: the model's own namespace, for both rules.
    let own_namespace = NetworkPolicyPeer {
        pod_selector: Some(Default::default()),
        ..NetworkPolicyPeer::default()
    };
    assert_eq!(rules[0].from, Some(vec![own_namespace.clone()]));
    assert_eq!(rules[1].from, Some(vec![own_namespace]));

    let gateway = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("name".to_string(), "nereid-system".to_string())])),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    };
    let monitoring = NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([("name".to_string(), "monitoring".to_string())])),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    };
    m.spec.network_policy = Some(ModelNetworkPolicy {
        from: vec![gateway.clone()],
        metrics_from: vec![monitoring.clone()],
    });
    let rules = builders::desired(&m, &config())
        .network_policy
        .unwrap()
        .spec
        .unwrap()
        .ingress
        .unwrap();
    assert_eq!(rules[0].from, Some(vec![gateway]));
    assert_eq!(rules[1].from, Some(vec![monitoring]));
}

#[test]
fn the_image_is_the_operators_default_unless_the_spec_names_one() {
    let d = deployment_of(&model());
    assert_eq!(server(&d).image.as_deref(), Some("ghcr.io/nereid/nereid:test"));
    assert_eq!(fetch(&d).image.as_deref(), Some("ghcr.io/nereid/nereid:test"));
    let mut m = model();
    m.spec.server = Some(ServerSpec {
        image: Some("registry.local/nereid:dev".into()),
        ..ServerSpec::default()
    });
    let d = deployment_of(&m);
    assert_eq!(server(&d).image.as_deref(), Some("registry.local/nereid:dev"));
    assert_eq!(fetch(&d).image.as_deref(), Some("registry.local/nereid:dev"));
}

#[test]
fn the_credentials_secret_reaches_the_fetch_container_only() {
    let mut m = model();
    m.spec.source.credentials_secret = Some("s3-creds".into());
    let env = EnvVar {
        name: "AWS_REGION".into(),
        value: Some("eu-west-1".into()),
        ..EnvVar::default()
    };
    m.spec.server = Some(ServerSpec {
        env: vec![env.clone()],
        sidecars: vec![Container {
            name: "log-shipper".into(),
            ..Container::default()
        }],
        ..ServerSpec::default()
    });
    let d = deployment_of(&m);
    let from = fetch(&d).env_from.clone().unwrap();
    assert_eq!(from.len(), 1);
    let secret = from[0].secret_ref.clone().unwrap();
    assert_eq!(secret.name, "s3-creds");
    assert_eq!(secret.optional, Some(false));
    // The server reads /models, never object storage: no credentials there,
    // nor in any other long-running container of the pod.
    for c in &pod_spec(&d).containers {
        assert_eq!(c.env_from, None, "{} gets no storage credentials", c.name);
        let from_secret = c.env.iter().flatten().any(|e| {
            e.value_from
                .as_ref()
                .is_some_and(|v| v.secret_key_ref.as_ref().is_some_and(|r| r.name == "s3-creds"))
        });
        assert!(!from_secret, "{} reads nothing of s3-creds", c.name);
    }
    assert_eq!(server(&d).env, Some(vec![env]));
    let fetch_env: BTreeMap<_, _> = fetch(&d)
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value.unwrap()))
        .collect();
    assert_eq!(fetch_env["NEREID_SOURCE_URI"], "s3://models/resnet");
    assert_eq!(fetch_env["NEREID_MODEL_NAME"], "resnet");

    let d = deployment_of(&model());
    assert_eq!(server(&d).env_from, None);
    assert_eq!(server(&d).env, None);
}

#[test]
fn ports_are_named_and_follow_the_spec() {
    let d = deployment_of(&model());
    let ports: Vec<_> = server(&d)
        .ports
        .clone()
        .unwrap()
        .into_iter()
        .map(|p| (p.name.unwrap(), p.container_port))
        .collect();
    assert_eq!(
        ports,
        [
            ("http".to_string(), 8000),
            ("grpc".to_string(), 8001),
            ("metrics".to_string(), 8002)
        ]
    );

    let mut m = model();
    m.spec.server = Some(ServerSpec {
        ports: Some(ServerPorts {
            http: Some(9000),
            grpc: Some(9001),
            metrics: Some(9002),
        }),
        ..ServerSpec::default()
    });
    let desired = builders::desired(&m, &config());
    let args = server(&desired.deployment).args.clone().unwrap();
    assert!(args.windows(2).any(|w| w == ["--http-port", "9000"]));
    assert!(args.windows(2).any(|w| w == ["--grpc-port", "9001"]));
    let annotations = pod_meta(&desired.deployment).annotations.unwrap();
    assert_eq!(annotations["prometheus.io/port"], "9002");
    let service_ports: Vec<_> = desired
        .service
        .spec
        .unwrap()
        .ports
        .unwrap()
        .into_iter()
        .map(|p| (p.port, p.target_port.unwrap()))
        .collect();
    assert_eq!(
        service_ports,
        [
            (9000, IntOrString::String("http".into())),
            (9001, IntOrString::String("grpc".into())),
            (9002, IntOrString::String("metrics".into()))
        ]
    );
}

#[test]
fn the_service_speaks_h2c_on_grpc_and_selects_the_pods() {
    let m = model();
    let service = builders::desired(&m, &config()).service;
    assert_eq!(service.metadata.name.as_deref(), Some("resnet"));
    let spec = service.spec.unwrap();
    assert_eq!(spec.selector, Some(labels::selector(&m)));
    let ports = spec.ports.unwrap();
    let grpc = ports.iter().find(|p| p.name.as_deref() == Some("grpc")).unwrap();
    assert_eq!(grpc.port, 8001);
    assert_eq!(grpc.app_protocol.as_deref(), Some("kubernetes.io/h2c"));
    let http = ports.iter().find(|p| p.name.as_deref() == Some("http")).unwrap();
    assert_eq!((http.port, http.app_protocol.as_deref()), (8000, None));
    let metrics = ports.iter().find(|p| p.name.as_deref() == Some("metrics")).unwrap();
    assert_eq!(metrics.port, 8002);
}

#[test]
fn the_budget_allows_one_pod_down_and_selects_the_pods() {
    let m = model();
    let pdb = builders::desired(&m, &config()).pdb;
    let spec = pdb.spec.unwrap();
    assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)));
    assert_eq!(spec.min_available, None);
    assert_eq!(spec.selector.unwrap().match_labels, Some(labels::selector(&m)));
}

#[test]
fn every_object_is_labelled_namespaced_and_owned_by_the_model() {
    let m = model();
    let desired = builders::desired(&m, &config());
    let metas = [
        &desired.config_map.metadata,
        &desired.deployment.metadata,
        &desired.service.metadata,
        &desired.pdb.metadata,
    ];
    for meta in metas {
        assert_eq!(meta.namespace.as_deref(), Some("ml"));
        assert_eq!(meta.labels, Some(labels::labels(&m)));
        let owners = meta.owner_references.clone().unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(owners[0].kind, "InferenceModel");
        assert_eq!(owners[0].uid, "11111111-2222-3333-4444-555555555555");
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(owners[0].block_owner_deletion, Some(true));
    }
}

#[test]
fn pods_carry_the_labels_the_selector_and_the_scrape_annotations() {
    let m = model();
    let d = deployment_of(&m);
    assert_eq!(d.spec.selector.match_labels, Some(labels::selector(&m)));
    let template = pod_meta(&d);
    let pod_labels = template.labels.unwrap();
    for (k, v) in labels::selector(&m) {
        assert_eq!(pod_labels.get(&k), Some(&v));
    }
    assert_eq!(pod_labels["serving.nereid.dev/model"], "resnet");
    let annotations = template.annotations.unwrap();
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], "8002");
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    assert_eq!(annotations[CONFIG_HASH_ANNOTATION].len(), 16);
}

#[test]
fn a_config_change_changes_the_pod_template_hash() {
    let before = deployment_of(&model());
    let mut m = model();
    m.spec.config = Some(ModelConfigOverride {
        max_batch_size: Some(16),
        ..ModelConfigOverride::default()
    });
    let after = deployment_of(&m);
    let hash = |d: &Deployment| pod_meta(d).annotations.unwrap()[CONFIG_HASH_ANNOTATION].clone();
    assert_ne!(hash(&before), hash(&after));
    assert_eq!(hash(&before), hash(&deployment_of(&model())), "same spec, same hash");
}

#[test]
fn rolling_updates_never_take_a_serving_pod_down_first() {
    let d = deployment_of(&model());
    let strategy = d.spec.strategy.unwrap();
    assert_eq!(strategy.type_.as_deref(), Some("RollingUpdate"));
    let rolling = strategy.rolling_update.unwrap();
    assert_eq!(rolling.max_unavailable, Some(IntOrString::Int(0)));
    assert_eq!(rolling.max_surge, Some(IntOrString::Int(1)));
}

#[test]
fn replicas_follow_the_spec_even_under_autoscaling() {
    assert_eq!(deployment_of(&model()).spec.replicas, Some(1));
    let mut m = model();
    m.spec.replicas = Some(3);
    assert_eq!(deployment_of(&m).spec.replicas, Some(3));
    // The HPA scales the InferenceModel (its scale subresource writes
    // spec.replicas), so the operator keeps carrying spec.replicas over.
    m.spec.autoscaling = Some(Autoscaling {
        min_replicas: Some(2),
        max_replicas: 8,
        metric: AutoscalingMetric::QueueTimeMicros,
        target: "500".into(),
        ..Autoscaling::default()
    });
    assert_eq!(deployment_of(&m).spec.replicas, Some(3));
    m.spec.replicas = None;
    assert_eq!(
        deployment_of(&m).spec.replicas,
        Some(2),
        "the autoscaler's minimum until it scales"
    );
}

#[test]
fn scheduling_fields_land_on_the_pod() {
    let mut m = with_gpus(1, None);
    let spread = TopologySpreadConstraint {
        max_skew: 1,
        topology_key: "topology.kubernetes.io/zone".into(),
        when_unsatisfiable: "ScheduleAnyway".into(),
        ..TopologySpreadConstraint::default()
    };
    m.spec.scheduling = Some(Scheduling {
        node_selector: Some(BTreeMap::from([(
            "nvidia.com/gpu.present".to_string(),
            "true".to_string(),
        )])),
        priority_class_name: Some("inference".into()),
        runtime_class_name: Some("nvidia".into()),
        topology_spread_constraints: Some(vec![spread]),
        affinity: Some(Default::default()),
        tolerations: None,
    });
    let d = deployment_of(&m);
    let pod = pod_spec(&d);
    assert_eq!(pod.node_selector.clone().unwrap()["nvidia.com/gpu.present"], "true");
    assert_eq!(pod.priority_class_name.as_deref(), Some("inference"));
    assert_eq!(pod.runtime_class_name.as_deref(), Some("nvidia"));
    assert!(pod.affinity.is_some());
    let spread = &pod.topology_spread_constraints.clone().unwrap()[0];
    assert_eq!(spread.topology_key, "topology.kubernetes.io/zone");
    assert_eq!(
        spread.label_selector.clone().unwrap().match_labels,
        Some(labels::selector(&m)),
        "a constraint without a selector spreads the model's own pods"
    );
    assert_eq!(pod.automount_service_account_token, Some(false));
}

#[test]
fn sidecars_come_after_the_server() {
    let mut m = model();
    m.spec.server = Some(ServerSpec {
        sidecars: vec![Container {
            name: "log-shipper".into(),
            image: Some("fluent-bit".into()),
            ..Container::default()
        }],
        ..ServerSpec::default()
    });
    let d = deployment_of(&m);
    let names: Vec<_> = pod_spec(&d).containers.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["nereid-server", "log-shipper"]);
}

#[test]
fn the_model_is_fetched_into_an_empty_dir_with_the_config_mounted() {
    let d = deployment_of(&model());
    let pod = pod_spec(&d);
    let volumes = pod.volumes.clone().unwrap();
    let models = volumes.iter().find(|v| v.name == "models").unwrap();
    assert!(models.empty_dir.is_some());
    let config = volumes.iter().find(|v| v.name == "model-config").unwrap();
    assert_eq!(config.config_map.clone().unwrap().name, "resnet-config");
    assert!(volumes.iter().all(|v| v.persistent_volume_claim.is_none()));
    for c in [server(&d), fetch(&d)] {
        let mounts = c.volume_mounts.clone().unwrap();
        assert!(
            mounts.iter().any(|m| m.name == "models" && m.mount_path == "/models"),
            "{}",
            c.name
        );
        assert!(
            mounts
                .iter()
                .any(|m| m.name == "model-config" && m.read_only == Some(true))
        );
    }
}

#[test]
fn a_pvc_source_is_mounted_read_only_at_its_path() {
    let mut m = model();
    m.spec.source.uri = "pvc://model-store/zoo/resnet".into();
    let d = deployment_of(&m);
    let volumes = pod_spec(&d).volumes.clone().unwrap();
    let claim = volumes.iter().find_map(|v| v.persistent_volume_claim.clone()).unwrap();
    assert_eq!(claim.claim_name, "model-store");
    assert_eq!(claim.read_only, Some(true));
    let mount = fetch(&d)
        .volume_mounts
        .clone()
        .unwrap()
        .into_iter()
        .find(|m| m.name == "model-source")
        .unwrap();
    assert_eq!(mount.sub_path.as_deref(), Some("zoo/resnet"));
    assert_eq!(mount.read_only, Some(true));
    assert!(
        server(&d)
            .volume_mounts
            .clone()
            .unwrap()
            .iter()
            .all(|m| m.name != "model-source"),
        "only the fetch step reads the claim"
    );
}

#[test]
fn pvc_uris_parse_into_claim_and_path() {
    use nereid_operator::builders::deployment::pvc_source;
    assert_eq!(pvc_source("pvc://claim/a/b/"), Some(("claim", "a/b")));
    assert_eq!(pvc_source("pvc://claim"), Some(("claim", "")));
    assert_eq!(pvc_source("pvc:///a"), None);
    assert_eq!(pvc_source("s3://bucket/a"), None);
}

/// A canary: its own ConfigMap, Deployment and Service named `resnet-canary`,
/// owned by the model, whose pods serve `resnet` from the canary's source
/// and which the model's own selector never matches.
#[test]
fn a_canary_runs_its_own_pods_that_serve_the_model_under_its_name() {
    let model = model_with(InferenceModelSpec {
        canary: Some(nereid_crds::Canary {
            source: Some(nereid_crds::ModelSource {
                uri: "s3://models/resnet-v2".into(),
                ..Default::default()
            }),
            config: Some(ModelConfigOverride {
                max_batch_size: Some(4),
                ..Default::default()
            }),
            traffic_percent: 20,
            replicas: None,
        }),
        autoscaling: Some(Autoscaling {
            max_replicas: 5,
            target: "100m".into(),
            ..Default::default()
        }),
        ..spec()
    });
    let desired = builders::desired(&model, &config());
    let builders::CanaryState::Present(canary) = desired.canary else {
        panic!("no canary objects");
    };
    for (kind, meta) in [
        ("ConfigMap", &canary.config_map.metadata),
        ("Deployment", &canary.deployment.metadata),
        ("Service", &canary.service.metadata),
    ] {
        let name = meta.name.as_deref().unwrap();
        assert!(name.starts_with("resnet-canary"), "{kind} {name}");
        let owner = &meta.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.name.as_str(), owner.controller),
            ("resnet", Some(true)),
            "{kind}"
        );
    }
    let deployment = &canary.deployment;
    assert_eq!(deployment.spec.replicas, Some(1));
    let pod_labels = pod_meta(deployment).labels.unwrap();
    assert_eq!(pod_labels[labels::MODEL], "resnet-canary");
    assert_eq!(pod_labels[builders::canary::CANARY_OF], "resnet");
    let model_selector = labels::selector(&model);
    assert!(
        !model_selector.iter().all(|(k, v)| pod_labels.get(k) == Some(v)),
        "the model's Service and PDB must not select canary pods"
    );
    // The pods serve `resnet`, fetched from the canary's source.
    assert_eq!(
        probe_path(&server(deployment).readiness_probe),
        "/v2/models/resnet/ready"
    );
    let fetch_args = fetch(deployment).command.clone().unwrap_or_default();
    assert!(fetch_args.iter().any(|a| a == "/models/resnet"), "{fetch_args:?}");
    let uri = fetch(deployment)
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NEREID_SOURCE_URI")
        .and_then(|e| e.value.clone());
    assert_eq!(uri.as_deref(), Some("s3://models/resnet-v2"));
    assert!(
        canary.config_map.data.as_ref().unwrap()["config.json"].contains("\"max_batch_size\": 4"),
        "{:?}",
        canary.config_map.data
    );
    // The spec's revision keeps its own source and no canary label.
    assert!(desired.autoscaler.is_some());
    let stable_labels = pod_meta(&desired.deployment).labels.unwrap();
    assert!(!stable_labels.contains_key(builders::canary::CANARY_OF));

    let without = builders::desired(&model_with(spec()), &config());
    assert!(matches!(without.canary, builders::CanaryState::Absent));
}
