//! The validation rules of both resources, each written once: its CEL
//! expression (embedded in the CRD as `x-kubernetes-validations`, enforced at
//! admission) and its message (also used by [`mod@crate::validate`], so a cluster
//! without CEL and the operator's status report the same words).
//!
//! A rule's `self` is the field (or struct) it is attached to; the attachment
//! point is named in each doc comment. Strings and lists that rules read carry
//! a `maxLength` / `maxItems` in the schema so that the API server's CEL cost
//! estimate stays within budget.

use kube::core::{Message, Rule};

/// One CEL rule and its message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Check {
    /// The CEL expression; `self` is the value it is attached to.
    pub rule: &'static str,
    /// What the user reads when it fails; names the field.
    pub message: &'static str,
    /// A CEL expression for a message that names the offending value, where
    /// the fixed message alone would leave the user searching; the API
    /// server falls back to `message` if it fails.
    pub message_expression: Option<&'static str>,
}

impl Check {
    /// A rule whose failure reads `message`.
    const fn new(rule: &'static str, message: &'static str) -> Self {
        Check {
            rule,
            message,
            message_expression: None,
        }
    }

    /// The rule as kube-derive embeds it into the schema.
    pub fn cel(&self) -> Rule {
        match self.message_expression {
            Some(expression) => Rule::new(self.rule).message(Message::Expression(expression.into())),
            None => Rule::new(self.rule).message(self.message),
        }
    }
}

/// URI schemes `spec.source.uri` may use, in the order the message lists them.
pub const URI_SCHEMES: [&str; 6] = ["s3://", "gs://", "as://", "https://", "http://", "pvc://"];

/// `InferenceModelSpec.replicas`, checked in Rust only. Not embedded in the
/// CRD: the scale subresource makes the API server itself refuse a negative
/// `spec.replicas` ("should be a non-negative integer"), and a rule of ours
/// beside it made `kubectl apply` print the same problem twice.
pub const REPLICAS: Check = Check::new("self >= 0", "spec.replicas must be >= 0");

/// `ModelEnsembleSpec.replicas`, checked in Rust only (as [`REPLICAS`]).
pub const ENSEMBLE_REPLICAS: Check = REPLICAS;

/// On `ModelSource.uri`: a known scheme followed by a bucket, host or claim.
pub const URI_SCHEME: Check = Check::new(
    "self.matches('^(s3|gs|as|https?|pvc)://[^/]+')",
    "spec.source.uri must start with s3://, gs://, as://, https://, http:// or pvc:// \
              followed by a bucket, host or claim name",
);

/// On `VersionPolicy`.
pub const VERSION_ONE_OF: Check = Check::new(
    "(has(self.latest) ? 1 : 0) + (has(self.all) ? 1 : 0) + (has(self.specific) ? 1 : 0) <= 1",
    "spec.source.version may set at most one of latest, all and specific",
);

/// On `Autoscaling.minReplicas`. 0 is scale to zero: the HPA (which cannot
/// scale to zero without a feature gate) keeps 1..max, the operator the step
/// to 0.
pub const MIN_REPLICAS: Check = Check::new(
    "self >= 0",
    "spec.autoscaling.minReplicas must be >= 0 (0 scales the model to zero when idle)",
);

/// On `ModelEnsembleSpec.autoscaling`: only an InferenceModel is woken by
/// nereid-gateway, so only it may sleep.
pub const ENSEMBLE_MIN_REPLICAS: Check = Check::new(
    "!has(self.minReplicas) || self.minReplicas >= 1",
    "spec.autoscaling.minReplicas must be >= 1 for a ModelEnsemble (scale to zero is for InferenceModels)",
);

/// On `Autoscaling.scaleToZeroAfter`. The regex is Go's duration syntax
/// ("5m", "1h30m", "1.5s") as CEL's `duration()` reads it, checked first
/// so that a malformed value gets this message, not an evaluation error.
pub const SCALE_TO_ZERO_AFTER: Check = Check::new(
    concat!(
        "self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$')",
        " && duration(self) >= duration('1s')"
    ),
    "spec.autoscaling.scaleToZeroAfter must be a duration of at least 1s, such as \"5m\" or \"90s\"",
);

/// On `Autoscaling.activationTimeout`; the bound is
/// [`crate::MAX_ACTIVATION_TIMEOUT`].
pub const ACTIVATION_TIMEOUT: Check = Check::new(
    concat!(
        "self.matches('^([0-9]+([.][0-9]+)?(ns|us|ms|s|m|h))+$')",
        " && duration(self) >= duration('1s') && duration(self) <= duration('10m')"
    ),
    "spec.autoscaling.activationTimeout must be a duration from 1s to 10m, such as \"60s\"",
);

/// On `Autoscaling`: the scale-to-zero settings mean nothing above zero.
pub const ZERO_ONLY_FIELDS: Check = Check::new(
    "(!has(self.scaleToZeroAfter) && !has(self.activationTimeout)) || \
     (has(self.minReplicas) && self.minReplicas == 0)",
    "spec.autoscaling.scaleToZeroAfter and spec.autoscaling.activationTimeout apply only with minReplicas: 0",
);

/// On `InferenceModelSpec`: a canary's pods would go on serving alone while
/// the model sleeps, and its split would have nothing to split.
pub const CANARY_NOT_ASLEEP: Check = Check::new(
    "!has(self.canary) || !has(self.autoscaling) || !has(self.autoscaling.minReplicas) || \
     self.autoscaling.minReplicas >= 1",
    "spec.canary cannot be combined with spec.autoscaling.minReplicas 0 (a model that scales to zero has no canary)",
);

/// On `InferenceModelSpec`: a KIND_GPU instance group needs a GPU in the
/// pod, or the server in it sees none and the model never loads.
pub const GPU_KIND_NEEDS_GPU: Check = Check::new(
    "!has(self.config) || !has(self.config.instanceGroup) || \
     !self.config.instanceGroup.exists(g, has(g.kind) && g.kind == 'KIND_GPU') || \
     (has(self.resources) && has(self.resources.gpu) && self.resources.gpu >= 1)",
    "spec.config.instanceGroup asks for KIND_GPU, so spec.resources.gpu must be at least 1",
);

/// The most instance groups a model's config may list.
pub const MAX_INSTANCE_GROUPS: usize = 16;

/// On `Autoscaling.maxReplicas`.
pub const MAX_REPLICAS: Check = Check::new("self >= 1", "spec.autoscaling.maxReplicas must be >= 1");

/// On `Autoscaling`.
pub const MIN_LE_MAX: Check = Check::new(
    "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
    "spec.autoscaling.minReplicas must be <= spec.autoscaling.maxReplicas",
);

/// On `Autoscaling.target`.
pub const TARGET_QUANTITY: Check = Check::new(
    "isQuantity(self) && quantity(self).isGreaterThan(quantity('0'))",
    "spec.autoscaling.target must be a positive quantity such as \"500\" or \"2k\"",
);

/// On `ModelEnsembleSpec.steps`.
pub const STEPS_NOT_EMPTY: Check = Check::new("self.size() >= 1", "spec.steps must list at least one step");

/// On `ModelEnsembleSpec.steps`; the message names the first repeated name.
pub const STEP_NAMES_UNIQUE: Check = Check {
    message_expression: Some(
        // Over the names, not the steps: the cost estimate of a list of
        // whole steps (with their unbounded maps) exceeds the CRD's budget.
        "'spec.steps must have unique names: \"' + \
         self.map(s, s.name).filter(n, self.filter(t, t.name == n).size() > 1)[0] + '\" appears more than once'",
    ),
    ..Check::new(
        "self.all(s, self.exists_one(t, t.name == s.name))",
        "spec.steps must have unique names",
    )
};

/// Tensor data types (KServe v2 names), the enum of `EnsembleTensor.datatype`.
pub const DATATYPES: [&str; 14] = [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64", "BF16",
    "BYTES",
];
