//! Kubernetes Events on the transitions a human cares about, so `kubectl
//! describe` and event-based alerting see *when* a model became ready,
//! started crash looping or failed to load, not only the current state.
//!
//! Three conditions make Events: Ready, when it turns True (or turns
//! False for a reason that is no problem, such as a scale-up rolling out,
//! or a scale to zero), Degraded, when a problem appears, changes, or goes
//! away, and ScaledToZero when it turns False: the model woke up
//! ([`ACTIVATED`]; its scale to zero is Ready's Event). A problem
//! makes Ready False too, with the same reason: that Event is Degraded's, not
//! told twice. Progressing and ModelLoaded only echo those two (the
//! Deployment controller already reports its rollout), and a changed
//! message alone is not a transition (it would flood the event stream). So a
//! healthy create makes one Event: Ready.
//!
//! The same rules serve every kind with these conditions (InferenceModel,
//! ModelEnsemble).

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::runtime::events::{Event, EventType, Recorder};
use nereid_crds::conditions::reason::{self, ACTIVATED, RECOVERED};
use nereid_crds::conditions::{DEGRADED, READY, SCALED_TO_ZERO};

/// Events' notes are limited to 1 kB.
const MAX_NOTE: usize = 1000;

/// The Events that the change from `previous` to `current` conditions deserves.
pub fn transitions(previous: &[Condition], current: &[Condition]) -> Vec<Event> {
    let before = |type_: &str| previous.iter().find(|c| c.type_ == type_);
    let mut events = Vec::new();
    if let Some(ready) = current.iter().find(|c| c.type_ == READY) {
        let was = before(READY);
        let was_true = was.is_some_and(|c| c.status == "True");
        match ready.status.as_str() {
            "True" if !was_true => events.push(event(EventType::Normal, &ready.reason, ready)),
            "False" if was_true && !is_problem(ready) => events.push(event(EventType::Normal, &ready.reason, ready)),
            _ => {}
        }
    }
    if let Some(degraded) = current.iter().find(|c| c.type_ == DEGRADED) {
        let was = before(DEGRADED).filter(|c| c.status == "True");
        match (degraded.status.as_str(), was) {
            ("True", Some(w)) if w.reason == degraded.reason => {}
            ("True", _) => events.push(event(EventType::Warning, &degraded.reason, degraded)),
            ("False", Some(w)) => {
                let mut recovered = event(EventType::Normal, RECOVERED, degraded);
                recovered.note = Some(clip(format!(
                    "Degraded is False: {} is gone; {}",
                    w.reason,
                    message_of(degraded)
                )));
                events.push(recovered);
            }
            _ => {}
        }
    }
    if let Some(awake) = current
        .iter()
        .find(|c| c.type_ == SCALED_TO_ZERO && c.status == "False")
        && before(SCALED_TO_ZERO).is_some_and(|c| c.status == "True")
    {
        events.push(event(EventType::Normal, ACTIVATED, awake));
    }
    events
}

fn event(type_: EventType, reason: &str, condition: &Condition) -> Event {
    Event {
        type_,
        reason: reason.to_string(),
        note: Some(clip(format!(
            "{} is {}: {}",
            condition.type_,
            condition.status,
            message_of(condition)
        ))),
        action: condition.type_.clone(),
        secondary: None,
    }
}

/// A condition's message, or its reason when it has none: never an empty note.
fn message_of(condition: &Condition) -> &str {
    match condition.message.trim() {
        "" => &condition.reason,
        message => message,
    }
}

fn clip(mut note: String) -> String {
    if note.len() > MAX_NOTE {
        let mut end = MAX_NOTE;
        while !note.is_char_boundary(end) {
            end -= 1;
        }
        note.truncate(end);
    }
    note
}

/// Whether a False Ready condition reports something a human should look at.
fn is_problem(condition: &Condition) -> bool {
    !matches!(
        condition.reason.as_str(),
        reason::AVAILABLE | reason::ROLLING_OUT | reason::LOADING | reason::SCALED_TO_ZERO
    )
}

/// Publishes `events` (the transitions' Events) about the object
/// `reference` names; failures are logged only.
pub async fn publish(recorder: &Recorder, reference: &ObjectReference, events: Vec<Event>) {
    for event in events {
        if let Err(error) = recorder.publish(&event, reference).await {
            tracing::warn!(reason = %event.reason, %error, "failed to publish an event");
        }
    }
}
#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;
    use nereid_crds::conditions::{MODEL_LOADED, PROGRESSING};

    use super::*;

    fn conditions(list: &[(&str, &str, &str, &str)]) -> Vec<Condition> {
        list.iter()
            .map(|(type_, status, reason, message)| Condition {
                type_: type_.to_string(),
                status: status.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
                observed_generation: Some(1),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
            })
            .collect()
    }

    /// (type, reason, note) of each Event.
    fn told(previous: &[Condition], current: &[Condition]) -> Vec<(EventType, String, String)> {
        transitions(previous, current)
            .into_iter()
            .map(|e| (e.type_, e.reason, e.note.unwrap_or_default()))
            .collect()
    }

    fn rolling_out() -> Vec<Condition> {
        conditions(&[
            (READY, "False", "RollingOut", "0/1 replicas ready"),
            (MODEL_LOADED, "False", "Loading", "no pod has the model loaded yet"),
            (PROGRESSING, "True", "RollingOut", "0/1 replicas updated"),
            (DEGRADED, "False", "AsExpected", "no problem seen"),
        ])
    }

    fn available() -> Vec<Condition> {
        conditions(&[
            (READY, "True", "Available", "1/1 replicas ready"),
            (MODEL_LOADED, "True", "Loaded", "loaded on 1 ready pods"),
            (
                PROGRESSING,
                "False",
                "RolloutComplete",
                "every replica runs the latest spec",
            ),
            (DEGRADED, "False", "AsExpected", "no problem seen"),
        ])
    }

    fn crash_looping() -> Vec<Condition> {
        conditions(&[
            (READY, "False", "CrashLoopBackOff", "0/1 replicas ready; pod a crashed"),
            (DEGRADED, "True", "CrashLoopBackOff", "pod a crashed"),
        ])
    }

    #[test]
    fn a_healthy_create_tells_one_event_when_it_becomes_ready() {
        assert!(told(&[], &rolling_out()).is_empty(), "rolling out is no news");
        assert_eq!(
            told(&rolling_out(), &available()),
            [(
                EventType::Normal,
                "Available".to_string(),
                "Ready is True: 1/1 replicas ready".to_string()
            )]
        );
        assert!(told(&available(), &available()).is_empty());
    }

    #[test]
    fn a_problem_is_told_once_by_degraded_and_its_end_by_a_recovery() {
        assert_eq!(
            told(&rolling_out(), &crash_looping()),
            [(
                EventType::Warning,
                "CrashLoopBackOff".to_string(),
                "Degraded is True: pod a crashed".to_string()
            )]
        );
        // Another message, the same problem: nothing new.
        let mut worse = crash_looping();
        worse[1].message = "pod a crashed again".into();
        assert!(told(&crash_looping(), &worse).is_empty());
        // Another problem: told.
        let pull = conditions(&[
            (READY, "False", "ImagePullBackOff", "0/1; no image"),
            (DEGRADED, "True", "ImagePullBackOff", "no image"),
        ]);
        assert_eq!(told(&crash_looping(), &pull)[0].1, "ImagePullBackOff");
        // Fixed and serving: the recovery and the readiness.
        let events = told(&crash_looping(), &available());
        assert_eq!(
            events,
            [
                (
                    EventType::Normal,
                    "Available".to_string(),
                    "Ready is True: 1/1 replicas ready".to_string()
                ),
                (
                    EventType::Normal,
                    RECOVERED.to_string(),
                    "Degraded is False: CrashLoopBackOff is gone; no problem seen".to_string()
                ),
            ]
        );
    }

    #[test]
    fn losing_readiness_without_a_problem_is_normal_news() {
        let scaling = conditions(&[
            (READY, "False", "RollingOut", "1/2 replicas ready"),
            (DEGRADED, "False", "AsExpected", "no problem seen"),
        ]);
        assert_eq!(
            told(&available(), &scaling),
            [(
                EventType::Normal,
                "RollingOut".to_string(),
                "Ready is False: 1/2 replicas ready".to_string()
            )]
        );
    }

    #[test]
    fn a_scale_to_zero_and_a_wake_up_are_each_told_once() {
        let asleep = conditions(&[
            (
                READY,
                "False",
                "ScaledToZero",
                "spec.replicas is 0: scaled to zero after 5m",
            ),
            (DEGRADED, "False", "AsExpected", "no problem seen"),
            (
                SCALED_TO_ZERO,
                "True",
                "ScaledToZero",
                "spec.replicas is 0: scaled to zero after 5m",
            ),
        ]);
        let mut awake = available();
        awake.extend(conditions(&[(SCALED_TO_ZERO, "False", "Awake", "1 replicas wanted")]));
        let told_asleep = told(&awake, &asleep);
        assert_eq!(told_asleep.len(), 1, "{told_asleep:?}");
        assert_eq!(told_asleep[0].1, "ScaledToZero");
        let waking = {
            let mut c = rolling_out();
            c.extend(conditions(&[(SCALED_TO_ZERO, "False", "Awake", "1 replicas wanted")]));
            c
        };
        assert_eq!(
            told(&asleep, &waking),
            [(
                EventType::Normal,
                ACTIVATED.to_string(),
                "ScaledToZero is False: 1 replicas wanted".to_string()
            )]
        );
        assert!(told(&waking, &awake).iter().all(|(_, reason, _)| reason != ACTIVATED));
    }

    #[test]
    fn no_note_is_ever_empty() {
        let bare = conditions(&[(READY, "True", "Available", ""), (DEGRADED, "True", "LoadFailed", " ")]);
        for (_, _, note) in told(&[], &bare) {
            assert!(!note.trim_end().ends_with(':'), "{note:?}");
        }
        assert_eq!(told(&[], &bare)[0].2, "Ready is True: Available");
    }
}
