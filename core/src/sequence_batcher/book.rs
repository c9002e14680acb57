//! The sequence batcher's book: which sequences are live, where each one
//! runs, what each has waiting, and which requests go into the next batch
//! of each instance. Pure bookkeeping, no I/O and no clock of its own, so
//! every rule is tested here directly; the actor around it moves tensors.
//!
//! The rules, as in Triton:
//! - a sequence begins with a request that has START; a request for a
//!   sequence that is not live and lacks START is refused, and after a
//!   request with END only a START may follow;
//! - a new sequence is placed on one instance for its whole life (with the
//!   direct strategy, in one batch slot of it); when there is no place it
//!   waits in the backlog, or is refused once the backlog is full;
//! - a sequence has at most one request executing, so its requests run in
//!   order, and each execution of an instance takes one request from each
//!   of its sequences that has one (by slot, or oldest first);
//! - a sequence with nothing to do for longer than the idle limit is
//!   released, and its place goes to the backlog.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::correlation::{CorrelationId, Flags};
use crate::error::Error;
use crate::model_config::sequence::Strategy;
use crate::tensor::Tensor;

/// How many released ids are remembered, to tell a client that its
/// sequence went idle rather than that it never started (at most
/// `MAX_ID_BYTES` each).
const REMEMBERED: usize = 4096;

/// Sequences that may wait for a place when the model's configuration sets
/// no `max_sequence_backlog`: the model's own places, and at least this
/// many. A START beyond it is refused at once (UNAVAILABLE) rather than
/// queued behind thousands it would wait for.
pub const DEFAULT_MIN_BACKLOG: usize = 64;

/// What the book needs of a queued request.
pub trait Item {
    type Key: PartialEq;
    /// Requests share a batch only when their keys are equal.
    fn key(&self) -> &Self::Key;
    /// False once its client has gone away.
    fn is_live(&self) -> bool;
}

/// A queued request and its flags.
#[derive(Debug)]
struct Queued<T> {
    item: T,
    start: bool,
    end: bool,
    arrived: Instant,
}

/// One request going into a batch.
#[derive(Debug)]
pub struct Row<T> {
    pub id: CorrelationId,
    pub item: T,
    pub start: bool,
    pub end: bool,
    /// The states the sequence's last request left; `None` when it starts
    /// (the initial states apply).
    pub state: Option<Vec<Tensor>>,
}

/// How one row's execution ended.
#[derive(Debug)]
pub struct Done {
    pub id: CorrelationId,
    pub end: bool,
    /// The states it produced; `None` when it failed (the old ones stay).
    pub state: Option<Vec<Tensor>>,
}

/// What the batcher should do now.
#[derive(Debug)]
pub struct Polled<T> {
    /// Batches to send, by instance.
    pub batches: Vec<(usize, Vec<Row<T>>)>,
    /// When to poll again even if nothing happens (a queue delay or an
    /// idle limit running out).
    pub wake: Option<Instant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    lane: usize,
    /// The batch slot (direct strategy; 0 otherwise).
    slot: usize,
}

#[derive(Debug)]
struct Sequence<T> {
    place: Option<Place>,
    queue: VecDeque<Queued<T>>,
    in_flight: bool,
    /// The last request accepted had END: only a START may follow.
    ending: bool,
    last_active: Instant,
    state: Option<Vec<Tensor>>,
}

#[derive(Debug)]
struct Lane {
    busy: bool,
    /// Direct strategy: the sequence in each slot.
    slots: Vec<Option<CorrelationId>>,
    /// Oldest strategy: the sequences placed here.
    members: Vec<CorrelationId>,
}

#[derive(Debug)]
pub struct Book<T> {
    model: String,
    strategy: Strategy,
    slots: usize,
    idle: Duration,
    max_backlog: usize,
    sequences: HashMap<CorrelationId, Sequence<T>>,
    lanes: Vec<Lane>,
    backlog: VecDeque<CorrelationId>,
    released: VecDeque<CorrelationId>,
    released_set: HashSet<CorrelationId>,
    /// When to look at every sequence again (idle ones to release, queues
    /// whose clients left): the earliest a sequence can go idle, so a poll
    /// in between costs nothing per sequence.
    sweep_at: Option<Instant>,
}

impl<T: Item> Book<T> {
    pub fn new(
        model: &str,
        strategy: Strategy,
        slots: usize,
        lanes: usize,
        idle: Duration,
        max_backlog: Option<usize>,
    ) -> Self {
        let direct = matches!(strategy, Strategy::Direct { .. });
        Book {
            model: model.to_string(),
            strategy,
            slots,
            idle,
            // Triton sets no limit; one client's 10,001 STARTs made the
            // next client wait behind all of them.
            max_backlog: max_backlog.unwrap_or((slots * lanes).max(DEFAULT_MIN_BACKLOG)),
            sequences: HashMap::new(),
            lanes: (0..lanes.max(1))
                .map(|_| Lane {
                    busy: false,
                    slots: if direct { vec![None; slots] } else { Vec::new() },
                    members: Vec::new(),
                })
                .collect(),
            backlog: VecDeque::new(),
            released: VecDeque::new(),
            released_set: HashSet::new(),
            sweep_at: None,
        }
    }

    /// Sequences live now (placed or waiting for a place).
    pub fn live(&self) -> usize {
        self.sequences.len()
    }

    /// Queues a request, or gives it back with the reason it cannot run.
    pub fn accept(&mut self, flags: Flags, item: T, now: Instant) -> std::result::Result<(), (T, Error)> {
        let Flags { id, start, end } = flags;
        let queued = Queued {
            item,
            start,
            end,
            arrived: now,
        };
        if let Some(sequence) = self.sequences.get_mut(&id) {
            if sequence.ending && !start {
                return Err((
                    queued.item,
                    Error::invalid(format!(
                        "inference request for sequence {id} to model '{}' comes after the sequence's END; start a new sequence with the START flag",
                        self.model
                    )),
                ));
            }
            sequence.ending = end;
            sequence.last_active = now;
            sequence.queue.push_back(queued);
            return Ok(());
        }
        if !start {
            let error = if self.released_set.contains(&id) {
                Error::invalid(format!(
                    "sequence {id} of model '{}' was released after more than {} microseconds without a request; start it again with the START flag",
                    self.model,
                    self.idle.as_micros()
                ))
            } else {
                Error::invalid(format!(
                    "inference request for sequence {id} to model '{}' must specify the START flag on the first request of the sequence",
                    self.model
                ))
            };
            return Err((queued.item, error));
        }
        let place = self.find_place(&id);
        if place.is_none() && self.backlog.len() >= self.max_backlog {
            return Err((
                queued.item,
                Error::unavailable(format!(
                    "model '{}' has no free sequence slot and {} sequences waiting for one (max_sequence_backlog)",
                    self.model,
                    self.backlog.len()
                )),
            ));
        }
        if place.is_none() {
            self.backlog.push_back(id.clone());
            // Its clients may all leave while it waits.
            self.sweep_by(now + self.idle);
        }
        if self.released_set.remove(&id) {
            self.released.retain(|r| r != &id);
        }
        self.sequences.insert(
            id,
            Sequence {
                place,
                queue: VecDeque::from([queued]),
                in_flight: false,
                ending: end,
                last_active: now,
                state: None,
            },
        );
        Ok(())
    }

    /// Drops what went away, releases what went idle, and forms the batch
    /// of every idle instance that should run now.
    pub fn poll(&mut self, now: Instant) -> Polled<T> {
        if self.sweep_at.is_some_and(|at| at <= now) {
            self.sweep_at = None;
            self.prune_all();
            self.reap(now);
        }
        let mut wake = self.sweep_at;
        let mut batches = Vec::new();
        for lane in 0..self.lanes.len() {
            if self.lanes[lane].busy {
                continue;
            }
            if let Some(rows) = self.batch(lane, now, &mut wake) {
                self.lanes[lane].busy = true;
                batches.push((lane, rows));
            }
        }
        Polled { batches, wake }
    }

    /// An instance finished the batch it was given.
    pub fn complete(&mut self, lane: usize, done: Vec<Done>, now: Instant) {
        if let Some(lane) = self.lanes.get_mut(lane) {
            lane.busy = false;
        }
        for row in done {
            let Some(sequence) = self.sequences.get_mut(&row.id) else {
                continue;
            };
            sequence.in_flight = false;
            sequence.last_active = now;
            if let Some(state) = row.state {
                sequence.state = Some(state);
            }
            if row.end && sequence.queue.is_empty() {
                self.release(&row.id);
            } else if sequence.queue.is_empty() {
                self.sweep_by(now + self.idle);
            }
        }
    }

    fn sweep_by(&mut self, at: Instant) {
        earliest(&mut self.sweep_at, at);
    }

    /// Everything still queued, for when the model goes away.
    pub fn drain(&mut self) -> Vec<T> {
        self.backlog.clear();
        self.sequences
            .drain()
            .flat_map(|(_, s)| s.queue.into_iter().map(|q| q.item))
            .collect()
    }

    /// A place for a new sequence: a free slot on the emptiest instance
    /// (direct), or the instance with the fewest sequences (oldest).
    fn find_place(&mut self, id: &CorrelationId) -> Option<Place> {
        match &self.strategy {
            Strategy::Direct { .. } => {
                let (lane, free) = self
                    .lanes
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (i, l.slots.iter().filter(|s| s.is_none()).count()))
                    .max_by_key(|(i, free)| (*free, std::cmp::Reverse(*i)))?;
                if free == 0 {
                    return None;
                }
                let slot = self.lanes[lane].slots.iter().position(Option::is_none)?;
                self.lanes[lane].slots[slot] = Some(id.clone());
                Some(Place { lane, slot })
            }
            Strategy::Oldest {
                max_candidate_sequences,
                ..
            } => {
                let limit = max_candidate_sequences.unwrap_or(usize::MAX);
                let (lane, _) = self
                    .lanes
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.members.len() < limit)
                    .min_by_key(|(i, l)| (l.members.len(), *i))?;
                self.lanes[lane].members.push(id.clone());
                Some(Place { lane, slot: 0 })
            }
        }
    }

    /// Ends a sequence: its place goes to the oldest waiting one.
    fn release(&mut self, id: &CorrelationId) {
        let Some(sequence) = self.sequences.remove(id) else {
            return;
        };
        match sequence.place {
            Some(place) => {
                let lane = &mut self.lanes[place.lane];
                if let Some(slot) = lane.slots.get_mut(place.slot) {
                    *slot = None;
                }
                lane.members.retain(|m| m != id);
            }
            None => self.backlog.retain(|b| b != id),
        }
        while let Some(waiting) = self.backlog.front().cloned() {
            let Some(place) = self.find_place(&waiting) else {
                break;
            };
            self.backlog.pop_front();
            if let Some(sequence) = self.sequences.get_mut(&waiting) {
                sequence.place = Some(place);
            }
        }
    }

    /// [`prune`]s every queue.
    fn prune_all(&mut self) {
        let ended: Vec<CorrelationId> = self
            .sequences
            .iter_mut()
            .filter_map(|(id, s)| prune(s).then(|| id.clone()))
            .collect();
        for id in ended {
            self.release(&id);
        }
    }

    /// Releases placed sequences that have been idle too long, and sets
    /// the next sweep.
    fn reap(&mut self, now: Instant) {
        let mut idle = Vec::new();
        let mut abandoned = Vec::new();
        for (id, sequence) in &self.sequences {
            if sequence.in_flight || !sequence.queue.is_empty() {
                continue;
            }
            // Waiting for a place with nothing left to run: its clients
            // all went away.
            if sequence.place.is_none() {
                abandoned.push(id.clone());
                continue;
            }
            let due = sequence.last_active + self.idle;
            if due <= now {
                idle.push(id.clone());
            } else {
                earliest(&mut self.sweep_at, due);
            }
        }
        for id in abandoned {
            self.release(&id);
        }
        for id in idle {
            tracing::debug!(model = %self.model, sequence = %id, "releasing an idle sequence");
            self.release(&id);
            if self.released.len() == REMEMBERED
                && let Some(old) = self.released.pop_front()
            {
                self.released_set.remove(&old);
            }
            self.released_set.insert(id.clone());
            self.released.push_back(id);
        }
        if !self.backlog.is_empty() {
            self.sweep_by(now + self.idle);
        }
    }

    /// The next batch of `lane`, if it should run now.
    fn batch(&mut self, lane: usize, now: Instant, wake: &mut Option<Instant>) -> Option<Vec<Row<T>>> {
        self.prune_lane(lane, now);
        let ready = |s: &Sequence<T>| !s.in_flight && !s.queue.is_empty();
        let mut candidates: Vec<CorrelationId> = match &self.strategy {
            Strategy::Direct { .. } => self.lanes[lane]
                .slots
                .iter()
                .flatten()
                .filter(|id| self.sequences.get(*id).is_some_and(ready))
                .cloned()
                .collect(),
            Strategy::Oldest { .. } => {
                let mut members: Vec<(Instant, CorrelationId)> = self.lanes[lane]
                    .members
                    .iter()
                    .filter_map(|id| {
                        let s = self.sequences.get(id).filter(|s| ready(s))?;
                        Some((s.queue.front()?.arrived, id.clone()))
                    })
                    .collect();
                members.sort_by_key(|(arrived, _)| *arrived);
                members.into_iter().map(|(_, id)| id).collect()
            }
        };
        let first = candidates.first()?;
        let front = |id: &CorrelationId| self.sequences[id].queue.front().expect("ready");
        let key = front(first).item.key();
        candidates.retain(|id| front(id).item.key() == key);
        candidates.truncate(self.slots);
        let oldest = candidates
            .iter()
            .map(|id| front(id).arrived)
            .min()
            .expect("one at least");
        let (delay, full) = match &self.strategy {
            Strategy::Direct {
                max_queue_delay,
                minimum_slot_utilization,
            } => (
                *max_queue_delay,
                candidates.len() as f32 >= minimum_slot_utilization * self.slots as f32,
            ),
            Strategy::Oldest {
                preferred_batch_size,
                max_queue_delay,
                ..
            } => {
                let target = preferred_batch_size.last().copied().unwrap_or(self.slots);
                (
                    *max_queue_delay,
                    candidates.len() >= target || preferred_batch_size.contains(&candidates.len()),
                )
            }
        };
        if !full && !delay.is_zero() && oldest + delay > now {
            earliest(wake, oldest + delay);
            return None;
        }
        let rows = candidates
            .into_iter()
            .map(|id| {
                let sequence = self.sequences.get_mut(&id).expect("a candidate is live");
                let queued = sequence.queue.pop_front().expect("ready");
                sequence.in_flight = true;
                Row {
                    state: if queued.start { None } else { sequence.state.clone() },
                    id,
                    item: queued.item,
                    start: queued.start,
                    end: queued.end,
                }
            })
            .collect();
        Some(rows)
    }
}

impl<T: Item> Book<T> {
    /// Drops what went away from the queues of `lane`'s sequences before
    /// they are batched.
    fn prune_lane(&mut self, lane: usize, now: Instant) {
        let members: Vec<CorrelationId> = match &self.strategy {
            Strategy::Direct { .. } => self.lanes[lane].slots.iter().flatten().cloned().collect(),
            Strategy::Oldest { .. } => self.lanes[lane].members.clone(),
        };
        for id in members {
            let Some(sequence) = self.sequences.get_mut(&id) else {
                continue;
            };
            let had = sequence.queue.len();
            if prune(sequence) {
                self.release(&id);
            } else if had > 0 && sequence.queue.is_empty() {
                self.sweep_by(now + self.idle);
            }
        }
    }
}

/// Drops the requests whose clients went away from the front of a queue
/// that is not executing. A dropped START passes its flag to the next
/// request; true when a dropped END was the sequence's last request (it
/// ends).
fn prune<T: Item>(sequence: &mut Sequence<T>) -> bool {
    if sequence.in_flight {
        return false;
    }
    let mut start = false;
    let mut end = false;
    while sequence.queue.front().is_some_and(|q| !q.item.is_live()) {
        let gone = sequence.queue.pop_front().expect("checked");
        start |= gone.start;
        end = gone.end;
    }
    match sequence.queue.front_mut() {
        Some(next) => {
            next.start |= start;
            false
        }
        None => end,
    }
}

fn earliest(wake: &mut Option<Instant>, at: Instant) {
    *wake = Some(wake.map_or(at, |w| w.min(at)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    /// A request: its value, its batch key, and whether its client is there.
    #[derive(Debug)]
    struct Req {
        value: i32,
        key: u8,
        live: Rc<Cell<bool>>,
    }

    impl Item for Req {
        type Key = u8;
        fn key(&self) -> &u8 {
            &self.key
        }
        fn is_live(&self) -> bool {
            self.live.get()
        }
    }

    fn req(value: i32) -> Req {
        Req {
            value,
            key: 0,
            live: Rc::new(Cell::new(true)),
        }
    }

    fn flags(id: u64, start: bool, end: bool) -> Flags {
        Flags {
            id: CorrelationId::Number(id),
            start,
            end,
        }
    }

    fn direct() -> Strategy {
        Strategy::Direct {
            max_queue_delay: Duration::ZERO,
            minimum_slot_utilization: 0.0,
        }
    }

    fn oldest(preferred: Vec<usize>, delay_ms: u64, candidates: Option<usize>) -> Strategy {
        Strategy::Oldest {
            max_candidate_sequences: candidates,
            preferred_batch_size: preferred,
            max_queue_delay: Duration::from_millis(delay_ms),
        }
    }

    fn book(strategy: Strategy, slots: usize, lanes: usize) -> Book<Req> {
        Book::new("m", strategy, slots, lanes, Duration::from_secs(1), None)
    }

    fn values(rows: &[Row<Req>]) -> Vec<(u64, i32, bool)> {
        rows.iter()
            .map(|r| {
                let CorrelationId::Number(id) = r.id else {
                    unreachable!()
                };
                (id, r.item.value, r.start)
            })
            .collect()
    }

    fn done(rows: Vec<Row<Req>>) -> Vec<Done> {
        rows.into_iter()
            .map(|r| Done {
                id: r.id,
                end: r.end,
                state: Some(vec![Tensor::new(
                    "S",
                    crate::datatype::DataType::Int32,
                    vec![1],
                    r.item.value.to_le_bytes().to_vec().into(),
                )]),
            })
            .collect()
    }

    #[test]
    fn sequences_batch_one_request_each_and_run_in_order() {
        let t = Instant::now();
        let mut b = book(direct(), 4, 1);
        b.accept(flags(1, true, false), req(10), t).unwrap();
        b.accept(flags(1, false, false), req(11), t).unwrap();
        b.accept(flags(2, true, false), req(20), t).unwrap();
        let polled = b.poll(t);
        let [(0, rows)] = polled.batches.as_slice() else {
            panic!("{:?}", polled.batches)
        };
        assert_eq!(values(rows), [(1, 10, true), (2, 20, true)]);
        // The instance is busy: nothing more until it is done.
        assert!(b.poll(t).batches.is_empty());
        let (_, rows) = polled.batches.into_iter().next().unwrap();
        b.complete(0, done(rows), t);
        let polled = b.poll(t);
        let (_, rows) = &polled.batches[0];
        assert_eq!(values(rows), [(1, 11, false)]);
        // The second request sees the state the first left.
        assert_eq!(rows[0].state.as_ref().unwrap()[0].data.as_ref(), 10i32.to_le_bytes());
    }

    #[test]
    fn starts_ends_and_unknown_sequences_follow_tritons_rules() {
        let t = Instant::now();
        let mut b = book(direct(), 2, 1);
        let (_, e) = b.accept(flags(9, false, false), req(0), t).unwrap_err();
        assert!(
            e.message().contains("must specify the START flag on the first request"),
            "{e}"
        );
        b.accept(flags(1, true, true), req(1), t).unwrap();
        let (_, e) = b.accept(flags(1, false, true), req(2), t).unwrap_err();
        assert!(e.message().contains("comes after the sequence's END"), "{e}");
        // A START after the END begins it anew, after the END has run.
        b.accept(flags(1, true, false), req(3), t).unwrap();
        let (_, rows) = b.poll(t).batches.pop().unwrap();
        assert_eq!(values(&rows), [(1, 1, true)]);
        b.complete(0, done(rows), t);
        assert_eq!(b.live(), 1);
        let (_, rows) = b.poll(t).batches.pop().unwrap();
        assert_eq!(values(&rows), [(1, 3, true)]);
        assert!(rows[0].state.is_none());
    }

    #[test]
    fn more_sequences_than_slots_wait_in_the_backlog_or_are_refused() {
        let t = Instant::now();
        let mut b = Book::new("m", direct(), 1, 2, Duration::from_secs(1), Some(1));
        b.accept(flags(1, true, true), req(1), t).unwrap();
        b.accept(flags(2, true, false), req(2), t).unwrap();
        b.accept(flags(3, true, false), req(3), t).unwrap();
        let (_, e) = b.accept(flags(4, true, false), req(4), t).unwrap_err();
        assert_eq!(e.kind(), crate::error::ErrorKind::Unavailable);
        assert!(e.message().contains("no free sequence slot"), "{e}");
        // One slot on each of two instances: 1 and 2 run in parallel.
        let batches = b.poll(t).batches;
        let mut ran: Vec<_> = batches.iter().map(|(lane, rows)| (*lane, values(rows))).collect();
        ran.sort();
        assert_eq!(ran, [(0, vec![(1, 1, true)]), (1, vec![(2, 2, true)])]);
        // 1 ends: 3 takes its slot.
        let (lane, rows) = batches.into_iter().find(|(lane, _)| *lane == 0).unwrap();
        b.complete(lane, done(rows), t);
        let (lane, rows) = b.poll(t).batches.pop().unwrap();
        assert_eq!((lane, values(&rows)), (0, vec![(3, 3, true)]));
    }

    #[test]
    fn idle_sequences_are_released_and_say_so() {
        let t = Instant::now();
        let mut b = book(direct(), 1, 1);
        b.accept(flags(1, true, false), req(1), t).unwrap();
        let (_, rows) = b.poll(t).batches.pop().unwrap();
        b.complete(0, done(rows), t);
        let polled = b.poll(t + Duration::from_millis(10));
        assert_eq!(polled.wake, Some(t + Duration::from_secs(1)));
        b.accept(flags(2, true, false), req(2), t).unwrap();
        assert!(b.poll(t).batches.is_empty(), "2 waits for 1's slot");
        b.poll(t + Duration::from_secs(2));
        let (_, e) = b
            .accept(flags(1, false, false), req(5), t + Duration::from_secs(2))
            .unwrap_err();
        assert!(
            e.message()
                .contains("was released after more than 1000000 microseconds"),
            "{e}"
        );
    }

    #[test]
    fn oldest_takes_the_oldest_sequences_and_waits_for_a_preferred_size() {
        let t = Instant::now();
        let mut b = book(oldest(vec![3], 5, None), 4, 1);
        b.accept(flags(1, true, false), req(1), t + Duration::from_micros(2))
            .unwrap();
        b.accept(flags(2, true, false), req(2), t).unwrap();
        let polled = b.poll(t + Duration::from_millis(1));
        assert!(polled.batches.is_empty());
        assert_eq!(polled.wake, Some(t + Duration::from_millis(5)));
        b.accept(flags(3, true, false), req(3), t + Duration::from_millis(1))
            .unwrap();
        let (_, rows) = b.poll(t + Duration::from_millis(1)).batches.pop().unwrap();
        assert_eq!(values(&rows), [(2, 2, true), (1, 1, true), (3, 3, true)]);

        // Without enough for the preferred size, the delay runs out.
        let mut b = book(oldest(vec![3], 5, None), 4, 1);
        b.accept(flags(1, true, false), req(1), t).unwrap();
        assert_eq!(b.poll(t + Duration::from_millis(5)).batches.len(), 1);
    }

    #[test]
    fn requests_of_other_shapes_wait_for_the_next_batch() {
        let t = Instant::now();
        let mut b = book(direct(), 4, 1);
        b.accept(flags(1, true, false), req(1), t).unwrap();
        let mut other = req(2);
        other.key = 1;
        b.accept(flags(2, true, false), other, t).unwrap();
        let (_, rows) = b.poll(t).batches.pop().unwrap();
        assert_eq!(values(&rows), [(1, 1, true)]);
        b.complete(0, done(rows), t);
        let (_, rows) = b.poll(t).batches.pop().unwrap();
        assert_eq!(values(&rows), [(2, 2, true)]);
    }

    #[test]
    fn cancelled_requests_are_dropped_without_losing_their_flags() {
        let t = Instant::now();
        let mut b = book(direct(), 2, 1);
        let first = req(1);
        let gone = Rc::clone(&first.live);
        b.accept(flags(1, true, false), first, t).unwrap();
        b.accept(flags(1, false, false), req(2), t).unwrap();
        gone.set(false);
        let (_, rows) = b.poll(t).batches.pop().unwrap();
        // The second request now starts the sequence.
        assert_eq!(values(&rows), [(1, 2, true)]);
        b.complete(0, done(rows), t);
        // An END whose client went away ends the sequence.
        let last = req(3);
        let gone = Rc::clone(&last.live);
        b.accept(flags(1, false, true), last, t).unwrap();
        gone.set(false);
        b.poll(t);
        assert_eq!(b.live(), 0);
    }

    #[test]
    fn without_a_configured_backlog_a_start_beyond_the_default_is_refused_at_once() {
        let t = Instant::now();
        let mut b = book(direct(), 2, 1);
        // Two placed, DEFAULT_MIN_BACKLOG waiting.
        for id in 1..=(2 + DEFAULT_MIN_BACKLOG as u64) {
            assert!(b.accept(flags(id, true, false), req(0), t).is_ok(), "sequence {id}");
        }
        let (_, error) = b
            .accept(flags(1000, true, false), req(0), t)
            .expect_err("beyond the backlog");
        assert_eq!(error.kind(), crate::error::ErrorKind::Unavailable);
        assert!(error.message().contains("max_sequence_backlog"), "{error}");
    }
}
