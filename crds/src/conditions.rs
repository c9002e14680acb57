//! Condition types and reasons written into the status of Nereid's resources.
//!
//! The operator sets these on `status.conditions` (standard
//! `metav1.Condition`s). Types say *what* is being reported; reasons say *why*,
//! and are stable strings that alerts and `kubectl wait` can match on. Every
//! reason the operator writes, for either kind, is here and nowhere else.

/// The resource serves traffic: every wanted replica is ready and has the model loaded.
pub const READY: &str = "Ready";
/// The serving pods report the model (and its wanted versions) as loaded.
pub const MODEL_LOADED: &str = "ModelLoaded";
/// A rollout or scale change is in progress.
pub const PROGRESSING: &str = "Progressing";
/// Something is wrong that needs attention (crash loop, failed load, unschedulable pods).
pub const DEGRADED: &str = "Degraded";
/// The spec passed validation (used where the cluster does not enforce CEL rules).
pub const VALID: &str = "Valid";
/// Every member InferenceModel of a ModelEnsemble is ready.
pub const MEMBERS_READY: &str = "MembersReady";
/// InferenceModel with `spec.canary`: every wanted canary pod is ready.
pub const CANARY_READY: &str = "CanaryReady";
/// InferenceModel with `spec.autoscaling.minReplicas: 0`: it has been
/// scaled to zero (True, since `lastTransitionTime`) or is awake (False).
pub const SCALED_TO_ZERO: &str = "ScaledToZero";

/// Reasons, CamelCase as Kubernetes requires: of conditions
/// (`condition.reason`, both kinds), of `status.autoscaling.reason`, and of
/// the one Event that is not a condition's reason ([`RECOVERED`]). A
/// serving container's rarer waiting reasons (`RunContainerError`, ...)
/// are passed on as the kubelet wrote them.
pub mod reason {
    // Problems, on Ready False and Degraded True (worst first, as the pods
    // are diagnosed), for InferenceModels and ensembles alike.

    /// The scheduler cannot place the pods because no node has enough GPUs.
    pub const INSUFFICIENT_GPU: &str = "InsufficientGPU";
    /// The scheduler cannot place the serving pods.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// The Secret named in `spec.source.credentialsSecret` does not exist.
    pub const MISSING_SECRET: &str = "MissingSecret";
    /// A serving container cannot pull its image.
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    /// A serving container keeps crashing.
    pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
    /// The server could not load the model (bad URI, bad config override, ...);
    /// also ModelLoaded False.
    pub const LOAD_FAILED: &str = "LoadFailed";
    /// The PersistentVolumeClaim of a `pvc://` source does not exist.
    pub const MISSING_PVC: &str = "MissingPVC";
    /// The spec failed validation; also an ensemble's Valid False.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Progressing False, Degraded True: the Deployment gave up on the rollout.
    pub const PROGRESS_DEADLINE_EXCEEDED: &str = "ProgressDeadlineExceeded";

    // Ready.

    /// Ready True: everything is up and serving.
    pub const AVAILABLE: &str = "Available";
    /// Ready False, Progressing True: new pods are being rolled out.
    pub const ROLLING_OUT: &str = "RollingOut";
    /// Ready False: `spec.replicas` is 0; also ScaledToZero True.
    pub const SCALED_TO_ZERO: &str = "ScaledToZero";
    /// ScaledToZero False: the model has replicas.
    pub const AWAKE: &str = "Awake";

    // ModelLoaded (InferenceModel).

    /// ModelLoaded True.
    pub const LOADED: &str = "Loaded";
    /// ModelLoaded False with no failure seen (yet).
    pub const LOADING: &str = "Loading";
    /// ModelLoaded False while a pod downloads the model (the message says
    /// how far: "fetching 1.5 GiB of 2.5 GiB, 60 %").
    pub const FETCHING: &str = "Fetching";

    // Progressing and Degraded.

    /// Progressing False: every replica runs the latest spec.
    pub const ROLLOUT_COMPLETE: &str = "RolloutComplete";
    /// Degraded False.
    pub const AS_EXPECTED: &str = "AsExpected";

    // ModelEnsemble: Valid, MembersReady, and Progressing before deploying.

    /// Valid True.
    pub const VALID_DAG: &str = "ValidDAG";
    /// Valid False: an InferenceModel of the same name holds the name the
    /// ensemble's Service and pods need.
    pub const NAME_TAKEN: &str = "NameTaken";
    /// Valid False: a step's tensors do not match what its member serves.
    pub const MEMBER_TENSOR_MISMATCH: &str = "MemberTensorMismatch";
    /// MembersReady True.
    pub const ALL_MEMBERS_READY: &str = "AllMembersReady";
    /// MembersReady False (and Ready, Degraded): a step names an
    /// InferenceModel that does not exist.
    pub const MEMBER_MISSING: &str = "MemberMissing";
    /// MembersReady False: a member exists but is not Ready.
    pub const MEMBER_NOT_READY: &str = "MemberNotReady";
    /// MembersReady False: a member is Ready but no pod of it told its config.
    pub const MEMBER_UNREACHABLE: &str = "MemberUnreachable";
    /// Progressing True: nothing is deployed until the members are ready.
    pub const WAITING_FOR_MEMBERS: &str = "WaitingForMembers";

    // `status.autoscaling.reason` (otherwise the HPA's own condition reasons).

    /// Another HPA already targets the model or its Deployment; the operator made none.
    pub const FOREIGN_AUTOSCALER: &str = "ForeignAutoscaler";
    /// The model has ready pods but none answered the last scrape.
    pub const NO_POD_METRICS: &str = "NoPodMetrics";

    // Events (otherwise named by the reason of the condition that changed).

    /// The Event of a recovery: Degraded turned from True to False.
    pub const RECOVERED: &str = "Recovered";
    /// The Event of a wake-up: ScaledToZero turned from True to False.
    pub const ACTIVATED: &str = "Activated";
}
