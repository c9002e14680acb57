//! Setting conditions the way Kubernetes expects: `lastTransitionTime`
//! moves only when a condition's status flips, never on a message change,
//! so a status that did not change compares equal and is not rewritten.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Builds a status's conditions against the previous ones.
pub struct Conditions<'a> {
    previous: &'a [Condition],
    generation: Option<i64>,
    now: &'a Time,
    conditions: Vec<Condition>,
}

impl<'a> Conditions<'a> {
    /// Starts empty; `previous` is only consulted for transition times.
    pub fn new(previous: &'a [Condition], generation: Option<i64>, now: &'a Time) -> Self {
        Conditions {
            previous,
            generation,
            now,
            conditions: Vec::new(),
        }
    }

    /// Starts from `previous` itself, to change only some conditions.
    pub fn keeping(previous: &'a [Condition], generation: Option<i64>, now: &'a Time) -> Self {
        Conditions {
            conditions: previous.to_vec(),
            ..Conditions::new(previous, generation, now)
        }
    }

    /// Sets (or replaces) the condition `type_`.
    pub fn set(&mut self, type_: &str, status: bool, reason: &str, message: impl Into<String>) -> &mut Self {
        let status = if status { "True" } else { "False" };
        let last_transition_time = self
            .previous
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map_or_else(|| self.now.clone(), |c| c.last_transition_time.clone());
        let condition = Condition {
            type_: type_.to_string(),
            status: status.to_string(),
            reason: reason.to_string(),
            message: message.into(),
            observed_generation: self.generation,
            last_transition_time,
        };
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(existing) => *existing = condition,
            None => self.conditions.push(condition),
        }
        self
    }

    pub fn into_vec(self) -> Vec<Condition> {
        self.conditions
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    fn at(seconds: i64) -> Time {
        Time(Timestamp::from_second(seconds).unwrap())
    }

    #[test]
    fn transition_time_moves_only_when_status_flips() {
        let t0 = at(1_000);
        let mut first = Conditions::new(&[], Some(1), &t0);
        first.set("Ready", false, "Loading", "0/1");
        let first = first.into_vec();
        assert_eq!(first[0].last_transition_time, t0);

        let t1 = at(2_000);
        let mut same = Conditions::new(&first, Some(2), &t1);
        same.set("Ready", false, "CrashLoopBackOff", "pod x crashed");
        let same = same.into_vec();
        assert_eq!(same[0].last_transition_time, t0, "status unchanged: time kept");
        assert_eq!(same[0].message, "pod x crashed");
        assert_eq!(same[0].observed_generation, Some(2));

        let mut flipped = Conditions::new(&same, Some(2), &t1);
        flipped.set("Ready", true, "Available", "1/1");
        assert_eq!(flipped.into_vec()[0].last_transition_time, t1);
    }

    #[test]
    fn keeping_replaces_only_what_is_set() {
        let t0 = at(1_000);
        let mut c = Conditions::new(&[], Some(1), &t0);
        c.set("Ready", true, "Available", "")
            .set("Progressing", false, "RolloutComplete", "");
        let previous = c.into_vec();
        let mut k = Conditions::keeping(&previous, Some(2), &t0);
        k.set("Ready", false, "InvalidSpec", "bad");
        let out = k.into_vec();
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].reason, "InvalidSpec");
        assert_eq!(out[1].reason, "RolloutComplete");
    }
}
