//! The dynamic batcher's queue: one FIFO per priority level, each with its
//! queue policy (size limit, default timeout, what a timeout does).
//!
//! Service order is level 1 first; within a level, requests that have not
//! timed out come before those delayed by a `DELAY` timeout, each in arrival
//! order.

use std::collections::VecDeque;
use std::time::Duration;

use tokio::time::Instant;

use super::policy::Candidate;
use crate::scheduler::Request;

/// What happens to a request whose queue timeout expires.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeoutAction {
    /// It is answered with an error at once.
    Reject,
    /// It stays queued, behind every request of its level that has not timed out.
    Delay,
}

/// Triton's `ModelQueuePolicy`, for one priority level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LevelPolicy {
    pub timeout_action: TimeoutAction,
    pub default_timeout: Option<Duration>,
    pub allow_timeout_override: bool,
    /// 0 means unbounded (within the batcher's own intake limit).
    pub max_queue_size: usize,
}

#[derive(Debug, Default)]
struct Level {
    waiting: VecDeque<Request>,
    delayed: VecDeque<Request>,
}

#[derive(Debug)]
pub struct Queue {
    levels: Vec<Level>,
    policies: Vec<LevelPolicy>,
}

impl Queue {
    pub fn new(policies: Vec<LevelPolicy>) -> Self {
        Queue {
            levels: policies.iter().map(|_| Level::default()).collect(),
            policies,
        }
    }

    pub fn len(&self) -> usize {
        self.levels.iter().map(|l| l.waiting.len() + l.delayed.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Queues a request, or hands it back when its level is full.
    pub fn push(&mut self, entry: Request) -> Result<(), Box<Request>> {
        let limit = self.policies[entry.priority].max_queue_size;
        let level = &mut self.levels[entry.priority];
        if limit > 0 && level.waiting.len() + level.delayed.len() >= limit {
            return Err(Box::new(entry));
        }
        level.waiting.push_back(entry);
        Ok(())
    }

    fn in_order(&self) -> impl Iterator<Item = &Request> {
        self.levels
            .iter()
            .flat_map(|l| l.waiting.iter().chain(l.delayed.iter()))
    }

    /// The head of the queue as the policy sees it, at most `limit` entries.
    pub fn candidates(&self, limit: usize) -> Vec<Candidate<'_>> {
        self.in_order()
            .take(limit)
            .map(|e| Candidate {
                batch_size: e.batch_size,
                key: &e.key,
                arrived: e.enqueued_at,
            })
            .collect()
    }

    /// Removes the first `n` entries in service order.
    pub fn take(&mut self, mut n: usize) -> Vec<Request> {
        let mut out = Vec::with_capacity(n);
        for level in &mut self.levels {
            for list in [&mut level.waiting, &mut level.delayed] {
                while n > 0 {
                    let Some(entry) = list.pop_front() else { break };
                    out.push(entry);
                    n -= 1;
                }
            }
        }
        out
    }

    /// Applies timeouts at `now`: returns the requests to reject; delayed
    /// ones move behind their level's other requests.
    pub fn expire(&mut self, now: Instant) -> Vec<Request> {
        let mut rejected = Vec::new();
        for (level, policy) in self.levels.iter_mut().zip(&self.policies) {
            if !level.waiting.iter().any(|e| e.deadline.is_some_and(|d| d <= now)) {
                continue;
            }
            let mut kept = VecDeque::with_capacity(level.waiting.len());
            for mut entry in level.waiting.drain(..) {
                if entry.deadline.is_none_or(|d| d > now) {
                    kept.push_back(entry);
                    continue;
                }
                match policy.timeout_action {
                    TimeoutAction::Reject => rejected.push(entry),
                    TimeoutAction::Delay => {
                        entry.deadline = None;
                        level.delayed.push_back(entry);
                    }
                }
            }
            level.waiting = kept;
        }
        rejected
    }

    /// The earliest timeout still to apply.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.levels
            .iter()
            .flat_map(|l| l.waiting.iter())
            .filter_map(|e| e.deadline)
            .min()
    }

    /// Everything still queued (used when the model goes away).
    pub fn drain(&mut self) -> Vec<Request> {
        let n = self.len();
        self.take(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(level: usize, deadline: Option<Instant>, tag: usize) -> Request {
        let (mut request, _) = Request::for_test(Vec::new(), tag);
        request.priority = level;
        request.deadline = deadline;
        request
    }

    fn policy(action: TimeoutAction, max: usize) -> LevelPolicy {
        LevelPolicy {
            timeout_action: action,
            default_timeout: None,
            allow_timeout_override: true,
            max_queue_size: max,
        }
    }

    fn tags(entries: &[Request]) -> Vec<usize> {
        entries.iter().map(|e| e.batch_size).collect()
    }

    #[test]
    fn higher_priority_levels_are_served_first() {
        let mut q = Queue::new(vec![policy(TimeoutAction::Reject, 0); 2]);
        q.push(entry(1, None, 1)).unwrap();
        q.push(entry(0, None, 2)).unwrap();
        q.push(entry(1, None, 3)).unwrap();
        q.push(entry(0, None, 4)).unwrap();
        assert_eq!(tags(&q.take(4)), vec![2, 4, 1, 3]);
    }

    #[test]
    fn max_queue_size_is_per_level() {
        let mut q = Queue::new(vec![policy(TimeoutAction::Reject, 1), policy(TimeoutAction::Reject, 0)]);
        q.push(entry(0, None, 1)).unwrap();
        assert!(q.push(entry(0, None, 2)).is_err());
        q.push(entry(1, None, 3)).unwrap();
        assert_eq!(q.len(), 2);
    }

    #[test]
    fn timeouts_reject_or_delay() {
        let now = Instant::now();
        let past = Some(now - Duration::from_millis(1));
        let future = Some(now + Duration::from_secs(60));
        let mut q = Queue::new(vec![policy(TimeoutAction::Reject, 0), policy(TimeoutAction::Delay, 0)]);
        q.push(entry(0, past, 1)).unwrap();
        q.push(entry(0, future, 2)).unwrap();
        q.push(entry(1, past, 3)).unwrap();
        q.push(entry(1, None, 4)).unwrap();
        assert_eq!(q.next_deadline(), past);
        let rejected = q.expire(now);
        assert_eq!(tags(&rejected), vec![1]);
        assert_eq!(q.next_deadline(), future);
        // The delayed request (3) now comes after 4.
        assert_eq!(tags(&q.take(3)), vec![2, 4, 3]);
    }
}
