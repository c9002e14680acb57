//! The per-model figures an autoscaler reads, over a sliding window of each
//! pod's scrapes.
//!
//! Counters are turned into rates per pod (newest sample against the oldest
//! one still in the window) and then combined per model: queue time is
//! Δ queue microseconds / Δ requests summed over the pods, so a busy pod
//! weighs as much as its requests; the inference rate is the sum of the pods'
//! rates; pending requests is the sum of the pods' latest gauges. A counter
//! that went down means the server restarted: that pod's window starts over.
//!
//! Each model also has a quiet clock, what scale to zero reads: the moment
//! something last happened to it (a request answered or in flight, a pod
//! that started, went or is on its way up, a pod that did not answer its
//! scrape, so that nothing unknown reads as quiet).

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use nereid_crds::AutoscalingMetric;

use super::exposition::Sample;

/// A model: its namespace and the InferenceModel's name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ModelKey {
    pub namespace: String,
    pub model: String,
}

/// One serving pod in one scrape round.
#[derive(Clone, Debug)]
pub struct PodScrape {
    pub model: ModelKey,
    /// The pod's uid: a pod recreated under the same name starts afresh.
    pub uid: String,
    /// A pod that is not ready counts towards nothing but its model.
    pub ready: bool,
    /// Not ready and not being deleted: on its way up (or crash looping).
    pub starting: bool,
    /// What its /metrics said; `None` when it timed out or answered garbage.
    pub sample: Option<Sample>,
}

/// One model's figures after a round.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Figures {
    /// Ready pods, and those of them whose /metrics answered.
    pub ready_pods: u32,
    pub scraped_pods: u32,
    /// Average queue time per request over the window, microseconds.
    pub queue_time_us: f64,
    /// Requests queued or executing now, over all pods.
    pub pending: f64,
    /// Inferences per second over the window, over all pods.
    pub inference_rate: f64,
    /// Mean GPU utilisation of the pods that report one, percent.
    pub gpu_percent: Option<f64>,
    /// Requests the scraped pods answered since they started (their
    /// counters summed): what `status.revisions` reports.
    pub requests: f64,
    /// Pods on their way up (not ready, not being deleted).
    pub starting_pods: u32,
    /// Since when nothing has happened to the model: no request answered or
    /// in flight, no pod came, went or is starting, every ready pod
    /// answered its scrape.
    pub quiet_since: Option<Instant>,
}

impl Figures {
    /// How long the model has been quiet at `now` (zero when it is not).
    pub fn quiet_for(&self, now: Instant) -> Duration {
        self.quiet_since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }

    /// The value of `metric`, or `None` when nothing can be said: ready pods
    /// exist but none answered, or no pod reports GPUs.
    pub fn value(&self, metric: AutoscalingMetric) -> Option<f64> {
        if self.ready_pods > 0 && self.scraped_pods == 0 {
            return None;
        }
        match metric {
            AutoscalingMetric::QueueTimeMicros => Some(self.queue_time_us),
            AutoscalingMetric::PendingRequests => Some(self.pending),
            AutoscalingMetric::InferenceRate => Some(self.inference_rate),
            AutoscalingMetric::GpuUtilization => self.gpu_percent,
        }
    }
}

/// Each pod's recent samples, kept between rounds.
#[derive(Debug)]
pub struct Histories {
    window: Duration,
    pods: HashMap<String, VecDeque<(Instant, Sample)>>,
    /// Per model, what the last round saw and since when it has not changed.
    activity: HashMap<ModelKey, (Activity, Instant)>,
}

/// What a model's quiet clock compares round to round.
#[derive(Debug, Clone, PartialEq)]
struct Activity {
    /// Requests answered, summed over the ready pods.
    requests: f64,
    /// The ready pods' uids, sorted.
    pods: Vec<String>,
    /// Something a round cannot compare: work in flight, pods starting or
    /// a ready pod that did not answer.
    busy: bool,
}

impl Histories {
    pub fn new(window: Duration) -> Self {
        Histories {
            window,
            pods: HashMap::new(),
            activity: HashMap::new(),
        }
    }

    /// Records a round taken at `now` and returns every model's figures.
    /// Pods absent from the round are forgotten.
    pub fn round(&mut self, now: Instant, scrapes: &[PodScrape]) -> BTreeMap<ModelKey, Figures> {
        let ready: HashSet<&str> = scrapes.iter().filter(|s| s.ready).map(|s| s.uid.as_str()).collect();
        self.pods.retain(|uid, _| ready.contains(uid.as_str()));
        let mut figures: BTreeMap<ModelKey, Figures> = BTreeMap::new();
        // Δ queue and Δ requests per model, summed before dividing.
        let mut queue: BTreeMap<&ModelKey, (f64, f64)> = BTreeMap::new();
        let mut gpus: BTreeMap<&ModelKey, (f64, u32)> = BTreeMap::new();
        let mut activity: HashMap<&ModelKey, Activity> = HashMap::new();
        for scrape in scrapes {
            let entry = figures.entry(scrape.model.clone()).or_default();
            let seen = activity.entry(&scrape.model).or_insert_with(|| Activity {
                requests: 0.0,
                pods: Vec::new(),
                busy: false,
            });
            if !scrape.ready {
                if scrape.starting {
                    entry.starting_pods += 1;
                    seen.busy = true;
                }
                continue;
            }
            entry.ready_pods += 1;
            seen.pods.push(scrape.uid.clone());
            let Some(sample) = scrape.sample else {
                seen.busy = true;
                continue;
            };
            seen.requests += sample.requests;
            seen.busy |= sample.pending > 0.0;
            entry.scraped_pods += 1;
            let history = self.record(&scrape.uid, now, sample);
            let (oldest_at, oldest) = history.front().copied().unwrap_or((now, sample));
            let elapsed = now.saturating_duration_since(oldest_at).as_secs_f64();
            let (queue_us, requests) = queue.entry(&scrape.model).or_default();
            *queue_us += sample.queue_us - oldest.queue_us;
            *requests += sample.requests - oldest.requests;
            if elapsed > 0.0 {
                entry.inference_rate += (sample.inferences - oldest.inferences) / elapsed;
            }
            entry.pending += sample.pending;
            entry.requests += sample.requests;
            if let Some(percent) = sample.gpu_percent {
                let (sum, count) = gpus.entry(&scrape.model).or_default();
                *sum += percent;
                *count += 1;
            }
        }
        for (key, (queue_us, requests)) in queue {
            if requests > 0.0
                && let Some(entry) = figures.get_mut(key)
            {
                entry.queue_time_us = queue_us / requests;
            }
        }
        for (key, (sum, count)) in gpus {
            if let Some(entry) = figures.get_mut(key) {
                entry.gpu_percent = Some(sum / f64::from(count));
            }
        }
        self.activity.retain(|key, _| activity.contains_key(key));
        for (key, mut now_seen) in activity {
            now_seen.pods.sort_unstable();
            let quiet_since = match self.activity.get(key) {
                Some((before, since)) if !now_seen.busy && *before == now_seen => *since,
                _ => now,
            };
            self.activity.insert(key.clone(), (now_seen, quiet_since));
            if let Some(entry) = figures.get_mut(key) {
                entry.quiet_since = Some(quiet_since);
            }
        }
        figures
    }

    /// Adds `sample` to the pod's history and drops what fell out of the
    /// window, keeping one sample at or before its start as the baseline.
    fn record(&mut self, uid: &str, now: Instant, sample: Sample) -> &VecDeque<(Instant, Sample)> {
        let history = self.pods.entry(uid.to_string()).or_default();
        let restarted = history.back().is_some_and(|(_, last)| {
            sample.queue_us < last.queue_us || sample.requests < last.requests || sample.inferences < last.inferences
        });
        if restarted {
            history.clear();
        }
        history.push_back((now, sample));
        let start = now.checked_sub(self.window);
        while let (Some(start), Some((second, _))) = (start, history.get(1))
            && *second <= start
        {
            history.pop_front();
        }
        history
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(model: &str) -> ModelKey {
        ModelKey {
            namespace: "ml".into(),
            model: model.into(),
        }
    }

    fn scrape(model: &str, uid: &str, sample: Option<Sample>) -> PodScrape {
        PodScrape {
            model: key(model),
            uid: uid.into(),
            ready: true,
            starting: false,
            sample,
        }
    }

    fn counters(queue_us: f64, requests: f64, inferences: f64, pending: f64) -> Option<Sample> {
        Some(Sample {
            queue_us,
            requests,
            inferences,
            pending,
            gpu_percent: None,
        })
    }

    #[test]
    fn queue_time_is_weighted_by_each_pods_requests() {
        let mut histories = Histories::new(Duration::from_secs(30));
        let t0 = Instant::now();
        histories.round(
            t0,
            &[
                scrape("m", "a", counters(0.0, 0.0, 0.0, 0.0)),
                scrape("m", "b", counters(0.0, 0.0, 0.0, 0.0)),
            ],
        );
        let t1 = t0 + Duration::from_secs(10);
        // a: 90 requests that waited 1000 µs each; b: 10 that waited 100 µs.
        let figures = histories.round(
            t1,
            &[
                scrape("m", "a", counters(90_000.0, 90.0, 180.0, 3.0)),
                scrape("m", "b", counters(1_000.0, 10.0, 20.0, 1.0)),
            ],
        );
        let m = &figures[&key("m")];
        assert_eq!((m.ready_pods, m.scraped_pods), (2, 2));
        assert_eq!(m.queue_time_us, 910.0);
        assert_eq!(m.inference_rate, 20.0);
        assert_eq!(m.pending, 4.0);
        assert_eq!(m.value(AutoscalingMetric::GpuUtilization), None);
    }

    #[test]
    fn old_samples_leave_the_window() {
        let mut histories = Histories::new(Duration::from_secs(10));
        let t0 = Instant::now();
        histories.round(t0, &[scrape("m", "a", counters(0.0, 0.0, 0.0, 0.0))]);
        // A burst of slow requests, then quiet.
        histories.round(
            t0 + Duration::from_secs(5),
            &[scrape("m", "a", counters(50_000.0, 10.0, 10.0, 0.0))],
        );
        histories.round(
            t0 + Duration::from_secs(15),
            &[scrape("m", "a", counters(50_000.0, 10.0, 10.0, 0.0))],
        );
        let later = histories.round(
            t0 + Duration::from_secs(25),
            &[scrape("m", "a", counters(50_100.0, 20.0, 20.0, 0.0))],
        );
        // Only the last ten requests (10 µs each) are in the window now.
        assert_eq!(later[&key("m")].queue_time_us, 10.0);
        assert_eq!(later[&key("m")].inference_rate, 1.0);
    }

    #[test]
    fn a_restarted_server_starts_its_window_over() {
        let mut histories = Histories::new(Duration::from_secs(30));
        let t0 = Instant::now();
        histories.round(t0, &[scrape("m", "a", counters(9_000.0, 90.0, 90.0, 0.0))]);
        let figures = histories.round(
            t0 + Duration::from_secs(5),
            &[scrape("m", "a", counters(10.0, 1.0, 1.0, 0.0))],
        );
        let m = &figures[&key("m")];
        assert_eq!((m.queue_time_us, m.inference_rate), (0.0, 0.0), "no negative rates");
    }

    #[test]
    fn pods_that_did_not_answer_are_left_out_and_counted() {
        let mut histories = Histories::new(Duration::from_secs(30));
        let t0 = Instant::now();
        let mut not_ready = scrape("m", "c", counters(0.0, 0.0, 0.0, 7.0));
        not_ready.ready = false;
        let figures = histories.round(
            t0,
            &[
                scrape("m", "a", counters(0.0, 0.0, 0.0, 2.0)),
                scrape("m", "b", None),
                not_ready,
            ],
        );
        let m = &figures[&key("m")];
        assert_eq!((m.ready_pods, m.scraped_pods, m.pending), (2, 1, 2.0));
        assert_eq!(m.value(AutoscalingMetric::PendingRequests), Some(2.0));

        let figures = histories.round(t0 + Duration::from_secs(1), &[scrape("m", "a", None)]);
        assert_eq!(
            figures[&key("m")].value(AutoscalingMetric::QueueTimeMicros),
            None,
            "none answered"
        );
    }

    #[test]
    fn the_quiet_clock_restarts_on_requests_pods_and_unknowns() {
        let mut histories = Histories::new(Duration::from_secs(30));
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let idle = counters(0.0, 5.0, 5.0, 0.0);
        let quiet = |histories: &mut Histories, secs: u64, scrapes: &[PodScrape]| {
            histories.round(at(secs), scrapes)[&key("m")].quiet_for(at(secs))
        };
        assert_eq!(quiet(&mut histories, 0, &[scrape("m", "a", idle)]), Duration::ZERO);
        assert_eq!(
            quiet(&mut histories, 10, &[scrape("m", "a", idle)]),
            Duration::from_secs(10)
        );
        // A request answered.
        let answered = counters(0.0, 6.0, 6.0, 0.0);
        assert_eq!(quiet(&mut histories, 20, &[scrape("m", "a", answered)]), Duration::ZERO);
        assert_eq!(
            quiet(&mut histories, 30, &[scrape("m", "a", answered)]),
            Duration::from_secs(10)
        );
        // A request in flight.
        let pending = counters(0.0, 6.0, 6.0, 1.0);
        assert_eq!(quiet(&mut histories, 40, &[scrape("m", "a", pending)]), Duration::ZERO);
        assert_eq!(quiet(&mut histories, 50, &[scrape("m", "a", answered)]), Duration::ZERO);
        // A pod on its way up, then ready with nothing served.
        let mut starting = scrape("m", "b", None);
        (starting.ready, starting.starting) = (false, true);
        let both = [scrape("m", "a", answered), starting];
        assert_eq!(quiet(&mut histories, 60, &both), Duration::ZERO);
        assert_eq!(quiet(&mut histories, 70, &both), Duration::ZERO, "still starting");
        let ready = [
            scrape("m", "a", answered),
            scrape("m", "b", counters(0.0, 0.0, 0.0, 0.0)),
        ];
        assert_eq!(quiet(&mut histories, 80, &ready), Duration::ZERO);
        assert_eq!(quiet(&mut histories, 90, &ready), Duration::from_secs(10));
        // A ready pod that did not answer is not known to be quiet.
        let silent = [scrape("m", "a", answered), scrape("m", "b", None)];
        assert_eq!(quiet(&mut histories, 100, &silent), Duration::ZERO);
        // A pod being deleted is neither ready nor starting: it changes the
        // ready set once, then nothing.
        let mut leaving = scrape("m", "b", None);
        leaving.ready = false;
        let gone = [scrape("m", "a", answered), leaving];
        assert_eq!(quiet(&mut histories, 110, &gone), Duration::ZERO);
        assert_eq!(quiet(&mut histories, 120, &gone), Duration::from_secs(10));
        let figures = histories.round(at(130), &gone);
        assert_eq!(figures[&key("m")].starting_pods, 0);
    }

    #[test]
    fn models_without_ready_pods_read_zero() {
        let mut histories = Histories::new(Duration::from_secs(30));
        let mut starting = scrape("m", "a", None);
        starting.ready = false;
        let figures = histories.round(Instant::now(), &[starting]);
        assert_eq!(figures[&key("m")].value(AutoscalingMetric::PendingRequests), Some(0.0));
    }
}
