//! Kubernetes Events on condition transitions, so `kubectl describe` and
//! event-based alerting see *when* a model became ready, started crash
//! looping or failed to load, not only the current state.
//!
//! One Event per condition whose status or reason changed; a changed message
//! alone is not a transition (it would flood the event stream).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};
use nereid_crds::conditions::{DEGRADED, reason};
use nereid_crds::{InferenceModel, InferenceModelStatus};

use crate::status::conditions::reason as local;

/// Events' notes are limited to 1 kB.
const MAX_NOTE: usize = 1000;

/// The Events that the change from `previous` to `current` deserves.
pub fn transitions(previous: Option<&InferenceModelStatus>, current: &InferenceModelStatus) -> Vec<Event> {
    let before: &[Condition] = previous.map(|s| s.conditions.as_slice()).unwrap_or_default();
    current
        .conditions
        .iter()
        .filter(|c| {
            !before
                .iter()
                .any(|b| b.type_ == c.type_ && b.status == c.status && b.reason == c.reason)
        })
        .map(|c| {
            let mut note = format!("{} is {}: {}", c.type_, c.status, c.message);
            if note.len() > MAX_NOTE {
                let mut end = MAX_NOTE;
                while !note.is_char_boundary(end) {
                    end -= 1;
                }
                note.truncate(end);
            }
            Event {
                type_: if is_problem(c) {
                    EventType::Warning
                } else {
                    EventType::Normal
                },
                reason: c.reason.clone(),
                note: Some(note),
                action: c.type_.clone(),
                secondary: None,
            }
        })
        .collect()
}

/// Whether a condition reports something a human should look at.
fn is_problem(condition: &Condition) -> bool {
    if condition.type_ == DEGRADED {
        return condition.status == "True";
    }
    condition.status == "False"
        && !matches!(
            condition.reason.as_str(),
            reason::AVAILABLE
                | reason::ROLLING_OUT
                | local::LOADING
                | local::LOADED
                | local::SCALED_TO_ZERO
                | local::ROLLOUT_COMPLETE
                | local::AS_EXPECTED
        )
}

/// Publishes the transitions' Events about `model`; failures are logged only.
pub async fn publish(
    recorder: &Recorder,
    model: &InferenceModel,
    previous: Option<&InferenceModelStatus>,
    current: &InferenceModelStatus,
) {
    let reference = model.object_ref(&());
    for event in transitions(previous, current) {
        if let Err(error) = recorder.publish(&event, &reference).await {
            tracing::warn!(reason = %event.reason, %error, "failed to publish an event");
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use nereid_crds::conditions::READY;

    use super::*;

    fn status(conditions: &[(&str, &str, &str, &str)]) -> InferenceModelStatus {
        InferenceModelStatus {
            conditions: conditions
                .iter()
                .map(|(type_, status, reason, message)| Condition {
                    type_: type_.to_string(),
                    status: status.to_string(),
                    reason: reason.to_string(),
                    message: message.to_string(),
                    observed_generation: Some(1),
                    last_transition_time: Time(Timestamp::UNIX_EPOCH),
                })
                .collect(),
            ..InferenceModelStatus::default()
        }
    }

    #[test]
    fn every_condition_of_a_first_status_is_a_transition() {
        let current = status(&[
            (READY, "False", "RollingOut", "0/1"),
            (DEGRADED, "False", "AsExpected", ""),
        ]);
        let events = transitions(None, &current);
        assert_eq!(events.len(), 2);
        assert!(events.iter().all(|e| e.type_ == EventType::Normal));
    }

    #[test]
    fn a_message_change_is_not_a_transition_but_a_reason_change_is() {
        let before = status(&[(READY, "False", "RollingOut", "0/1")]);
        assert!(transitions(Some(&before), &status(&[(READY, "False", "RollingOut", "0/2")])).is_empty());
        let events = transitions(Some(&before), &status(&[(READY, "False", "CrashLoopBackOff", "pod x")]));
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].type_, EventType::Warning);
        assert_eq!(events[0].reason, "CrashLoopBackOff");
        assert_eq!(events[0].action, READY);
        assert_eq!(events[0].note.as_deref(), Some("Ready is False: pod x"));
    }

    #[test]
    fn degraded_true_warns_and_recovery_is_normal() {
        let bad = status(&[(DEGRADED, "True", "LoadFailed", "x")]);
        assert_eq!(transitions(None, &bad)[0].type_, EventType::Warning);
        let good = status(&[(DEGRADED, "False", "AsExpected", "")]);
        assert_eq!(transitions(Some(&bad), &good)[0].type_, EventType::Normal);
    }
}
