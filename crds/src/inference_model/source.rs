//! Where a model comes from: storage URI, credentials and version policy.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The model repository entry to serve.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSource {
    /// URI of the model folder in Triton's repository layout (`config.pbtxt`
    /// and numbered version folders). Schemes: `s3://bucket/path`,
    /// `gs://bucket/path`, `as://account/container/path`, `https://` or
    /// `http://` (an archive), `pvc://claim/path` (a PersistentVolumeClaim
    /// in the same namespace).
    #[schemars(length(min = 1, max = 2048))] // validate.rs: MAX_URI_LEN
    #[x_kube(validation = crate::rules::URI_SCHEME.cel())]
    pub uri: String,
    /// Name of a Secret in the same namespace whose keys become environment
    /// variables of the server (e.g. AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    /// GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_ACCOUNT_KEY).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_secret: Option<String>,
    /// Which versions to load, as Triton's version_policy. Default: the latest one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<VersionPolicy>,
}

/// Which model versions to serve; set at most one field.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = crate::rules::VERSION_ONE_OF.cel())]
pub struct VersionPolicy {
    /// Serve the N highest-numbered versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(extend("format" = "int64"), range(min = 1, max = u32::MAX))]
    pub latest: Option<u32>,
    /// Serve every version in the repository (when true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub all: Option<bool>,
    /// Serve exactly these versions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub specific: Option<Vec<i64>>,
}
