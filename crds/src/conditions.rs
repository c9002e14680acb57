//! Condition types and reasons written into the status of Nereid's resources.
//!
//! The operator sets these on `status.conditions` (standard
//! `metav1.Condition`s). Types say *what* is being reported; reasons say *why*,
//! and are stable strings that alerts and `kubectl wait` can match on.

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

/// Reasons (`condition.reason`), CamelCase as Kubernetes requires.
pub mod reason {
    /// A serving container cannot pull its image.
    pub const IMAGE_PULL_BACK_OFF: &str = "ImagePullBackOff";
    /// A serving container keeps crashing.
    pub const CRASH_LOOP_BACK_OFF: &str = "CrashLoopBackOff";
    /// The server could not load the model (bad URI, bad config override, ...).
    pub const LOAD_FAILED: &str = "LoadFailed";
    /// The scheduler cannot place the serving pods.
    pub const UNSCHEDULABLE: &str = "Unschedulable";
    /// The scheduler cannot place the pods because no node has enough GPUs.
    pub const INSUFFICIENT_GPU: &str = "InsufficientGPU";
    /// The Secret named in `spec.source.credentialsSecret` does not exist.
    pub const MISSING_SECRET: &str = "MissingSecret";
    /// The PersistentVolumeClaim of a `pvc://` source does not exist.
    pub const MISSING_PVC: &str = "MissingPVC";
    /// The spec failed validation.
    pub const INVALID_SPEC: &str = "InvalidSpec";
    /// Everything is up and serving.
    pub const AVAILABLE: &str = "Available";
    /// New pods are being rolled out.
    pub const ROLLING_OUT: &str = "RollingOut";
}
