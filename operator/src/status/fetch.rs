//! A download in progress, as the status shows it: `ModelLoaded` False,
//! reason `Fetching`, "fetching 1.5 GiB of 2.5 GiB, 60 % (pod ...)".
//!
//! Only a pod's own `nereid-fetch` knows how far it is (the server has not
//! started), so the controller asks it
//! ([`crate::controller::fetch_progress`]) and this puts the answer where
//! a user looks, over what the pods alone would say ("no pod has the model
//! loaded yet").

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use nereid_crds::conditions::{MODEL_LOADED, PROGRESSING, reason};
use nereid_proto::contract::fetch_progress;

/// How far one pod's download is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchProgress {
    pub pod: String,
    pub done: u64,
    pub total: u64,
}

impl FetchProgress {
    /// Reads `nereid-fetch`'s JSON document; `None` when it is not one.
    pub fn from_json(pod: &str, document: &serde_json::Value) -> Option<Self> {
        let total = document.get(fetch_progress::BYTES_TOTAL)?.as_u64()?;
        let done = document.get(fetch_progress::BYTES_DONE)?.as_u64()?;
        Some(FetchProgress {
            pod: pod.to_string(),
            done: done.min(total),
            total,
        })
    }

    /// "fetching 1.5 GiB of 2.5 GiB, 60 % (pod p)"; before the folder is
    /// listed, "fetching (pod p)".
    pub fn message(&self) -> String {
        if self.total == 0 {
            return format!("fetching the model (pod {})", self.pod);
        }
        let percent = self.done.saturating_mul(100) / self.total;
        format!(
            "fetching {} of {}, {percent} % (pod {})",
            bytes(self.done),
            bytes(self.total),
            self.pod
        )
    }

    /// Says so in `conditions`: `ModelLoaded` when no pod has the model
    /// (and nothing failed), the message of `Progressing` while a rollout
    /// fetches it for its new pods. The statuses stay as they were, so no
    /// transition time moves.
    pub fn apply(&self, conditions: &mut [Condition]) {
        let message = self.message();
        for condition in conditions {
            match (condition.type_.as_str(), condition.reason.as_str()) {
                (MODEL_LOADED, reason::LOADING) => {
                    condition.reason = reason::FETCHING.to_string();
                    condition.message = message.clone();
                }
                (PROGRESSING, reason::ROLLING_OUT) if condition.status == "True" => {
                    condition.message = format!("{}; {message}", condition.message);
                }
                _ => {}
            }
        }
    }
}

/// Bytes as a person reads them: "812 KiB", "1.2 GiB".
fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut value = n as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[unit])
    } else {
        format!("{value:.0} {}", UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: None,
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        }
    }

    #[test]
    fn reads_the_document_and_says_how_far() {
        let gib = 1u64 << 30;
        let progress = FetchProgress::from_json(
            "p-1",
            &json!({"bytes_total": 2 * gib + gib / 2, "bytes_done": gib + gib / 2}),
        )
        .unwrap();
        assert_eq!(progress.message(), "fetching 1.5 GiB of 2.5 GiB, 60 % (pod p-1)");
        assert_eq!(
            FetchProgress::from_json("p", &json!({"bytes_total": 0, "bytes_done": 0}))
                .unwrap()
                .message(),
            "fetching the model (pod p)"
        );
        assert_eq!(bytes(812 * 1024), "812 KiB");
        assert_eq!(bytes(100), "100 B");
        assert!(FetchProgress::from_json("p", &json!({"bytes_total": "lots"})).is_none());
        assert!(FetchProgress::from_json("p", &json!([])).is_none());
    }

    #[test]
    fn replaces_loading_and_adds_to_a_rollout_but_never_hides_a_failure() {
        let progress = FetchProgress {
            pod: "p".into(),
            done: 45,
            total: 100,
        };
        let mut conditions = vec![
            condition(
                MODEL_LOADED,
                "False",
                reason::LOADING,
                "no pod has the model loaded yet",
            ),
            condition(PROGRESSING, "True", reason::ROLLING_OUT, "1/2 replicas updated"),
        ];
        progress.apply(&mut conditions);
        assert_eq!(
            (conditions[0].reason.as_str(), conditions[0].message.as_str()),
            (reason::FETCHING, "fetching 45 B of 100 B, 45 % (pod p)")
        );
        assert_eq!(conditions[0].status, "False");
        assert_eq!(
            conditions[1].message,
            "1/2 replicas updated; fetching 45 B of 100 B, 45 % (pod p)"
        );

        let mut failed = vec![condition(MODEL_LOADED, "False", reason::LOAD_FAILED, "bad model")];
        progress.apply(&mut failed);
        assert_eq!(failed[0].reason, reason::LOAD_FAILED);
    }
}
