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

/// On `Autoscaling.minReplicas`. An HPA cannot scale to zero without a feature gate.
pub const MIN_REPLICAS: Check = Check::new("self >= 1", "spec.autoscaling.minReplicas must be >= 1");

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
