//! Prometheus summaries: quantiles over a sliding time window.
//!
//! The `prometheus` crate has counters, gauges and histograms but no
//! summary, and Triton's `--metrics-config summary_latencies=true` exposes
//! `nv_inference_*_summary_us` as summaries. This one keeps the recent
//! observations of each label set in a few age buckets (the window is split
//! in [`AGE_BUCKETS`] parts; the oldest part is dropped as time moves on, as
//! prometheus-cpp's summary does), computes the quantiles exactly from them
//! when scraped, and keeps `_sum` and `_count` over all time. Each age bucket
//! keeps at most [`MAX_SAMPLES`] observations (a uniform reservoir beyond
//! that), so memory stays bounded however busy the model is.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::core::{Collector, Desc};
use prometheus::proto::{LabelPair, Metric, MetricFamily, MetricType, Quantile, Summary};

/// The window is split in this many parts.
pub const AGE_BUCKETS: usize = 5;
/// The most observations one age bucket keeps.
pub const MAX_SAMPLES: usize = 2048;

/// A family of summaries by label values.
#[derive(Clone)]
pub struct SummaryVec {
    desc: Arc<Desc>,
    quantiles: Arc<Vec<f64>>,
    window: Duration,
    children: Arc<Mutex<HashMap<Vec<String>, SummaryHandle>>>,
}

/// One label set's summary; cheap to clone, observed from any thread.
#[derive(Clone)]
pub struct SummaryHandle(Arc<Mutex<Window>>);

struct Window {
    buckets: [Vec<f64>; AGE_BUCKETS],
    /// Observations offered to each bucket (for reservoir sampling).
    offered: [u64; AGE_BUCKETS],
    /// Index of the newest bucket, and when it started.
    head: usize,
    head_started: Instant,
    part: Duration,
    sum: f64,
    count: u64,
    /// xorshift state for the reservoir.
    rng: u64,
}

impl SummaryVec {
    /// `quantiles` are Triton's `summary_quantiles` (the error terms it also
    /// takes are not needed: these quantiles are exact over the window).
    pub fn new(name: &str, help: &str, labels: &[&str], quantiles: Vec<f64>, window: Duration) -> Self {
        let desc = Desc::new(
            name.to_string(),
            help.to_string(),
            labels.iter().map(|l| l.to_string()).collect(),
            HashMap::new(),
        )
        .expect("summary descriptions are valid");
        SummaryVec {
            desc: Arc::new(desc),
            quantiles: Arc::new(quantiles),
            window,
            children: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    pub fn with_label_values(&self, values: &[&str]) -> SummaryHandle {
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        let window = self.window;
        self.children
            .lock()
            .entry(key)
            .or_insert_with(|| SummaryHandle::new(window))
            .clone()
    }

    pub fn remove_label_values(&self, values: &[&str]) {
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        self.children.lock().remove(&key);
    }
}

impl SummaryHandle {
    fn new(window: Duration) -> Self {
        let part = window / AGE_BUCKETS as u32;
        SummaryHandle(Arc::new(Mutex::new(Window {
            buckets: Default::default(),
            offered: [0; AGE_BUCKETS],
            head: 0,
            head_started: Instant::now(),
            part: part.max(Duration::from_millis(1)),
            sum: 0.0,
            count: 0,
            rng: 0x9E37_79B9_7F4A_7C15,
        })))
    }

    pub fn observe(&self, value: f64) {
        self.observe_many(value, 1);
    }

    /// `value` observed `times` times (every request of a batch).
    pub fn observe_many(&self, value: f64, times: u64) {
        let mut w = self.0.lock();
        w.rotate(Instant::now());
        w.sum += value * times as f64;
        w.count = w.count.saturating_add(times);
        for _ in 0..times.min(MAX_SAMPLES as u64) {
            w.offer(value);
        }
    }

    /// Count, sum and the quantiles of the window (NaN when it is empty).
    fn read(&self, quantiles: &[f64]) -> (u64, f64, Vec<f64>) {
        let mut w = self.0.lock();
        w.rotate(Instant::now());
        let mut samples: Vec<f64> = w.buckets.iter().flatten().copied().collect();
        samples.sort_by(f64::total_cmp);
        let values = quantiles
            .iter()
            .map(|q| {
                if samples.is_empty() {
                    f64::NAN
                } else {
                    let rank = (q * (samples.len() - 1) as f64).round() as usize;
                    samples[rank.min(samples.len() - 1)]
                }
            })
            .collect();
        (w.count, w.sum, values)
    }
}

impl Window {
    /// Starts new age buckets for the time that passed, dropping the oldest.
    fn rotate(&mut self, now: Instant) {
        let mut steps = 0;
        while now.duration_since(self.head_started) >= self.part && steps <= AGE_BUCKETS {
            self.head = (self.head + 1) % AGE_BUCKETS;
            self.buckets[self.head].clear();
            self.offered[self.head] = 0;
            self.head_started += self.part;
            steps += 1;
        }
        if steps > AGE_BUCKETS {
            // Idle for longer than the window: start afresh from now.
            self.head_started = now;
        }
    }

    fn offer(&mut self, value: f64) {
        let head = self.head;
        self.offered[head] += 1;
        if self.buckets[head].len() < MAX_SAMPLES {
            self.buckets[head].push(value);
            return;
        }
        // Reservoir sampling: each observation stays with equal probability.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let slot = self.rng % self.offered[head];
        if let Some(kept) = self.buckets[head].get_mut(slot as usize) {
            *kept = value;
        }
    }
}

impl Collector for SummaryVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let children: Vec<(Vec<String>, SummaryHandle)> = self
            .children
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut metrics = Vec::with_capacity(children.len());
        for (values, handle) in children {
            let (count, sum, quantile_values) = handle.read(&self.quantiles);
            let mut summary = Summary::default();
            summary.set_sample_count(count);
            summary.set_sample_sum(sum);
            summary.set_quantile(
                self.quantiles
                    .iter()
                    .zip(quantile_values)
                    .map(|(q, v)| {
                        let mut quantile = Quantile::default();
                        quantile.set_quantile(*q);
                        quantile.set_value(v);
                        quantile
                    })
                    .collect(),
            );
            let mut metric = Metric::default();
            metric.set_label(
                self.desc
                    .variable_labels
                    .iter()
                    .zip(values)
                    .map(|(name, value)| {
                        let mut pair = LabelPair::default();
                        pair.set_name(name.clone());
                        pair.set_value(value);
                        pair
                    })
                    .collect(),
            );
            metric.set_summary(summary);
            metrics.push(metric);
        }
        let mut family = MetricFamily::default();
        family.set_name(self.desc.fq_name.clone());
        family.set_help(self.desc.help.clone());
        family.set_field_type(MetricType::SUMMARY);
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_count_and_sum_over_the_window() {
        let vec = SummaryVec::new(
            "s_us",
            "help",
            &["model"],
            vec![0.5, 0.9, 0.99],
            Duration::from_secs(60),
        );
        let h = vec.with_label_values(&["m"]);
        for v in 1..=100 {
            h.observe(f64::from(v));
        }
        h.observe_many(1000.0, 3);
        let (count, sum, q) = h.read(&[0.5, 0.99]);
        assert_eq!(count, 103);
        assert_eq!(sum, 5050.0 + 3000.0);
        assert_eq!(q[0], 52.0);
        assert_eq!(q[1], 1000.0);
        let families = vec.collect();
        let metric = &families[0].get_metric()[0];
        assert_eq!(metric.get_summary().sample_count(), 103);
        assert_eq!(metric.get_summary().get_quantile().len(), 3);
        assert_eq!(metric.get_label()[0].value(), "m");
        vec.remove_label_values(&["m"]);
        assert!(vec.collect()[0].get_metric().is_empty());
    }

    #[test]
    fn old_observations_leave_the_window_but_not_the_totals() {
        let h = SummaryHandle::new(Duration::from_millis(50));
        h.observe(7.0);
        std::thread::sleep(Duration::from_millis(80));
        let (count, sum, q) = h.read(&[0.5]);
        assert_eq!((count, sum), (1, 7.0));
        assert!(q[0].is_nan(), "the window is empty again: {q:?}");
    }

    #[test]
    fn a_busy_bucket_keeps_a_bounded_sample() {
        let h = SummaryHandle::new(Duration::from_secs(600));
        h.observe_many(1.0, 1_000_000);
        for v in 0..10_000 {
            h.observe(f64::from(v));
        }
        let w = h.0.lock();
        assert!(w.buckets.iter().map(Vec::len).sum::<usize>() <= MAX_SAMPLES * AGE_BUCKETS);
        assert_eq!(w.count, 1_010_000);
    }
}
